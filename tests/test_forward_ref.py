"""stz eval --forward against an independent numpy forward pass of
Qwen2-, Qwen3-, Phi-3-, Gemma 2- and Gemma 3-style models (q/k/v biases; per-head q/k RMSNorm
and heads wider than hidden / heads; fused qkv and gate_up projections;
grouped-query attention, rotate_half RoPE with rope_theta from
config.json, untied head), of GPT-Neo (learned positions, LayerNorm,
GELU, unscaled scores, local attention on alternate layers, tied head)
and of GPT-2 (Conv1D weights stored (in, out), fused q/k/v with a bias),
stz synth's tiny models in a Hugging Face directory. Run with pytest; STZ
names the stz binary."""
import json
import os
import subprocess

import numpy as np
import pytest
from st_files import load, save

STZ = os.environ.get("STZ", "build/stz")


def rmsnorm(x, w, eps):
    return w * (x / np.sqrt((x * x).mean(-1, keepdims=True) + eps))


def rotate_half(x, pos, theta):
    hd = x.shape[-1]
    inv = theta ** (-np.arange(0, hd, 2) / hd)
    ang = np.outer(pos, inv)                       # (T, hd/2)
    cos = np.concatenate([np.cos(ang)] * 2, -1)[:, None, :]
    sin = np.concatenate([np.sin(ang)] * 2, -1)[:, None, :]
    rot = np.concatenate([-x[..., hd // 2:], x[..., :hd // 2]], -1)
    return x * cos + rot * sin


def logits(w, cfg, tokens, inputs=None):
    """Hugging Face Qwen2ForCausalLM, Qwen3ForCausalLM and Phi3ForCausalLM,
    written from their modeling code; inputs (a dict), when given, gets each
    matrix's input rows by name."""
    def mm(h, name):
        if inputs is not None:
            inputs.setdefault(name, []).append(h)
        return h @ w[name].T

    H, nh, nkv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd, eps, theta = cfg.get("head_dim", H // nh), cfg["rms_norm_eps"], cfg["rope_theta"]
    F = cfg["intermediate_size"]
    T = len(tokens)
    x = w["model.embed_tokens.weight"][tokens]     # (T, H)
    pos = np.arange(T)
    mask = np.triu(np.full((T, T), -np.inf), 1)
    for l in range(cfg["num_hidden_layers"]):
        p = "model.layers.%d." % l
        h = rmsnorm(x, w[p + "input_layernorm.weight"], eps)
        if p + "self_attn.qkv_proj.weight" in w:  # Phi-3: q, k, v rows of one matrix
            q, k, v = np.split(mm(h, p + "self_attn.qkv_proj.weight"), [nh * hd, (nh + nkv) * hd], axis=1)
        else:
            q, k, v = (mm(h, p + "self_attn.%s_proj.weight" % n) + w.get(p + "self_attn.%s_proj.bias" % n, 0)
                       for n in "qkv")
        q, k, v = q.reshape(T, nh, hd), k.reshape(T, nkv, hd), v.reshape(T, nkv, hd)
        if p + "self_attn.q_norm.weight" in w:  # Qwen3: every head normed before RoPE
            q = rmsnorm(q, w[p + "self_attn.q_norm.weight"], eps)
            k = rmsnorm(k, w[p + "self_attn.k_norm.weight"], eps)
        q, k = rotate_half(q, pos, theta), rotate_half(k, pos, theta)
        rep = nh // nkv
        k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
        s = np.einsum("thd,uhd->htu", q, k) / np.sqrt(hd) + mask
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        o = np.einsum("htu,uhd->thd", s, v).reshape(T, nh * hd)
        x = x + mm(o, p + "self_attn.o_proj.weight")
        h = rmsnorm(x, w[p + "post_attention_layernorm.weight"], eps)
        if p + "mlp.gate_up_proj.weight" in w:  # Phi-3: gate rows, then up rows
            g, u = np.split(mm(h, p + "mlp.gate_up_proj.weight"), [F], axis=1)
        else:
            g, u = mm(h, p + "mlp.gate_proj.weight"), mm(h, p + "mlp.up_proj.weight")
        x = x + mm((g / (1 + np.exp(-g))) * u, p + "mlp.down_proj.weight")
    return mm(rmsnorm(x, w["model.norm.weight"], eps), "lm_head.weight")


def layernorm(x, w, b, eps):
    mu = x.mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + eps) * w + b


def gelu_new(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


def logits_gpt_neo(w, cfg, tokens, inputs=None):
    """Hugging Face GPTNeoForCausalLM, written from its modeling code:
    wte + wpe, pre-LayerNorm blocks, attention scores not scaled, a
    "local" layer seeing its last window_size positions, c_fc / gelu_new /
    c_proj, the head tied to wte; inputs as logits' (the head's under wte's name)."""
    def mm(h, name):
        if inputs is not None:
            inputs.setdefault(name, []).append(h)
        return h @ w[name].T

    H, nh, eps = cfg["hidden_size"], cfg["num_heads"], cfg.get("layer_norm_epsilon", 1e-5)  # GPTNeoConfig's default
    hd = H // nh
    kinds = [k for group, n in cfg["attention_types"] for _ in range(n) for k in group]
    T = len(tokens)
    x = w["transformer.wte.weight"][tokens] + w["transformer.wpe.weight"][:T]
    i, j = np.arange(T)[:, None], np.arange(T)[None, :]
    for l in range(cfg["num_layers"]):
        p = "transformer.h.%d." % l
        seen = (j <= i) & ((j > i - cfg["window_size"]) if kinds[l] == "local" else True)
        h = layernorm(x, w[p + "ln_1.weight"], w[p + "ln_1.bias"], eps)
        q, k, v = (mm(h, p + "attn.attention.%s_proj.weight" % n).reshape(T, nh, hd) for n in "qkv")
        s = np.where(seen, np.einsum("thd,uhd->htu", q, k), -1e9)
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        o = np.einsum("htu,uhd->thd", s, v).reshape(T, H)
        x = x + mm(o, p + "attn.attention.out_proj.weight") + w[p + "attn.attention.out_proj.bias"]
        h = layernorm(x, w[p + "ln_2.weight"], w[p + "ln_2.bias"], eps)
        u = gelu_new(mm(h, p + "mlp.c_fc.weight") + w[p + "mlp.c_fc.bias"])
        x = x + mm(u, p + "mlp.c_proj.weight") + w[p + "mlp.c_proj.bias"]
    h = layernorm(x, w["transformer.ln_f.weight"], w["transformer.ln_f.bias"], eps)
    return mm(h, "transformer.wte.weight")


def logits_gemma(w, cfg, tokens, inputs=None):
    """Hugging Face Gemma2ForCausalLM and Gemma3ForCausalLM, written from
    their modeling code: the embedding times sqrt(hidden), RMSNorm by 1 + w
    before and after the attention and the MLP, scores scaled by
    query_pre_attn_scalar^-1/2 (Gemma 2: soft-capped), every
    sliding_window_pattern-th layer global and the others seeing their last
    sliding_window positions (Gemma 3: with rope_local_base_freq), Gemma 3's
    q/k head norms, gelu_pytorch_tanh-gated MLP, the tied head (Gemma 2:
    final logits soft-capped); inputs as logits'."""
    def mm(h, name):
        if inputs is not None:
            inputs.setdefault(name, []).append(h)
        return h @ w[name].T

    def norm(x, name):
        return rmsnorm(x, 1 + w[name], cfg["rms_norm_eps"])

    H, nh, nkv, hd = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    cap, final = cfg.get("attn_logit_softcapping"), cfg.get("final_logit_softcapping")
    pattern, window = cfg.get("sliding_window_pattern", 2), cfg["sliding_window"]
    T = len(tokens)
    x = w["model.embed_tokens.weight"][tokens] * np.float32(np.sqrt(H))
    pos, i, j = np.arange(T), np.arange(T)[:, None], np.arange(T)[None, :]
    for l in range(cfg["num_hidden_layers"]):
        p = "model.layers.%d." % l
        local = (l + 1) % pattern != 0
        theta = cfg.get("rope_local_base_freq", cfg["rope_theta"]) if local else cfg["rope_theta"]
        h = norm(x, p + "input_layernorm.weight")
        q, k, v = (mm(h, p + "self_attn.%s_proj.weight" % n) for n in "qkv")
        q, k, v = q.reshape(T, nh, hd), k.reshape(T, nkv, hd), v.reshape(T, nkv, hd)
        if p + "self_attn.q_norm.weight" in w:  # Gemma 3
            q, k = norm(q, p + "self_attn.q_norm.weight"), norm(k, p + "self_attn.k_norm.weight")
        q, k = rotate_half(q, pos, theta), rotate_half(k, pos, theta)
        k, v = np.repeat(k, nh // nkv, axis=1), np.repeat(v, nh // nkv, axis=1)
        s = np.einsum("thd,uhd->htu", q, k) * cfg["query_pre_attn_scalar"] ** -0.5
        if cap:
            s = cap * np.tanh(s / cap)
        s = np.where((j <= i) & ((j > i - window) if local else True), s, -np.inf)
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        o = np.einsum("htu,uhd->thd", s, v).reshape(T, nh * hd)
        x = x + norm(mm(o, p + "self_attn.o_proj.weight"), p + "post_attention_layernorm.weight")
        h = norm(x, p + "pre_feedforward_layernorm.weight")
        g, u = mm(h, p + "mlp.gate_proj.weight"), mm(h, p + "mlp.up_proj.weight")
        x = x + norm(mm(gelu_new(g) * u, p + "mlp.down_proj.weight"), p + "post_feedforward_layernorm.weight")
    z = mm(norm(x, "model.norm.weight"), "model.embed_tokens.weight")
    return final * np.tanh(z / final) if final else z


def logits_gpt2(w, cfg, tokens, inputs=None):
    """Hugging Face GPT2LMHeadModel, written from its modeling code: wte +
    wpe, pre-LayerNorm blocks, Conv1D layers x @ W + b with W stored (in,
    out), c_attn giving q, k and v side by side, scores by 1/sqrt(head
    size), gelu_new, the head tied to wte. Names with or without
    "transformer." (the candidate's are without); inputs as logits'."""
    def get(name):
        return w[name] if name in w else w[name[len("transformer."):]]

    def conv(h, name):
        if inputs is not None:
            inputs.setdefault(name + ".weight", []).append(h)
        return h @ get(name + ".weight") + get(name + ".bias")

    H, nh, eps = cfg["n_embd"], cfg["n_head"], cfg.get("layer_norm_epsilon", 1e-5)
    hd = H // nh
    T = len(tokens)
    x = get("transformer.wte.weight")[tokens] + get("transformer.wpe.weight")[:T]
    i, j = np.arange(T)[:, None], np.arange(T)[None, :]
    for l in range(cfg["n_layer"]):
        p = "transformer.h.%d." % l
        h = layernorm(x, get(p + "ln_1.weight"), get(p + "ln_1.bias"), eps)
        q, k, v = (a.reshape(T, nh, hd) for a in np.split(conv(h, p + "attn.c_attn"), 3, axis=-1))
        s = np.where(j <= i, np.einsum("thd,uhd->htu", q, k) / np.sqrt(hd), -1e9)
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        x = x + conv(np.einsum("htu,uhd->thd", s, v).reshape(T, H), p + "attn.c_proj")
        h = layernorm(x, get(p + "ln_2.weight"), get(p + "ln_2.bias"), eps)
        x = x + conv(gelu_new(conv(h, p + "mlp.c_fc")), p + "mlp.c_proj")
    h = layernorm(x, get("transformer.ln_f.weight"), get("transformer.ln_f.bias"), eps)
    if inputs is not None:
        inputs.setdefault("transformer.wte.weight", []).append(h)
    return h @ get("transformer.wte.weight").T


def log_softmax(z):
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


FAMILIES = {"qwen2": ("tiny", "Qwen2ForCausalLM"), "qwen3": ("qwen3-tiny", "Qwen3ForCausalLM"),
            "phi3": ("phi3-tiny", "Phi3ForCausalLM"), "gpt_neo": ("gpt-neo-tiny", "GPTNeoForCausalLM"),
            "gemma2": ("gemma2-tiny", "Gemma2ForCausalLM"), "gemma3_text": ("gemma3-tiny", "Gemma3ForCausalLM"),
            "gpt2": ("gpt2-tiny", "GPT2LMHeadModel")}


def reference(cfg):
    return {"gpt_neo": logits_gpt_neo, "gpt2": logits_gpt2, "gemma2": logits_gemma,
            "gemma3_text": logits_gemma}.get(cfg["model_type"], logits)


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def models(tmp_path_factory, request):
    d = tmp_path_factory.mktemp("fwd")
    orig, cand = d / "orig", d / "cand"
    orig.mkdir(), cand.mkdir()
    synth, cls = FAMILIES[request.param]
    subprocess.run([STZ, "synth", synth, "--dtype", "f32", "-o", str(orig / "model.safetensors"), "-q"], check=True)
    w, meta = load(orig / "model.safetensors", dtypes=("F32",))
    w = {n: v.astype(np.float64) for n, v in w.items()}
    cfg = json.loads(meta["config"])
    cfg.update(model_type=request.param, architectures=[cls])
    if request.param == "gpt_neo":  # the 24- and 17-token sequences pass the local layer's window
        cfg.update(window_size=8, layer_norm_epsilon=1e-5, activation_function="gelu_new")
    elif request.param == "gpt2":
        cfg.update(layer_norm_epsilon=1e-5, activation_function="gelu_new", n_inner=None)
    elif request.param.startswith("gemma"):  # synth's own keys (window 16: the sequences pass it)
        cfg.update(rms_norm_eps=1e-6, hidden_activation="gelu_pytorch_tanh")
        cfg.setdefault("rope_theta", 10000.0)
        if request.param == "gemma2":  # caps that bite: these random scores and logits are small
            cfg.update(attn_logit_softcapping=0.5, final_logit_softcapping=2.0)
    else:
        cfg.update(rope_theta=1000000.0, rms_norm_eps=1e-6, hidden_act="silu", use_sliding_window=False)
    if request.param in ("qwen2", "qwen3"):  # stated, not used (Phi-3 has no use_sliding_window: a window applies)
        cfg["sliding_window"] = 4
    del cfg["architecture"]
    for p in (orig, cand):
        (p / "config.json").write_text(json.dumps(cfg))
    rng = np.random.default_rng(3)
    wc = {n: v + (0.05 * v.std() * rng.standard_normal(v.shape) if v.ndim == 2 else 0) for n, v in w.items()}
    if request.param == "gpt2":  # as GPT2Model saves them: no "transformer."
        wc = {n.replace("transformer.", "", 1): v for n, v in wc.items()}
    save(cand / "model.safetensors", wc, {})  # no metadata config: config.json must be used
    seqs = [rng.integers(0, cfg["vocab_size"], 24).tolist(), rng.integers(0, cfg["vocab_size"], 17).tolist()]
    (d / "tokens.json").write_text(json.dumps(seqs))
    return d, w, wc, cfg, seqs


def test_matches_numpy_reference(models):
    d, w, wc, cfg, seqs = models
    r = subprocess.run([STZ, "eval", str(d / "orig"), str(d / "cand"), "--forward", "--tokens", str(d / "tokens.json"),
                        "--json", "-T", "1"], capture_output=True, text=True, check=True)
    got = json.loads(r.stdout)
    kl, agree, nll_a, nll_b = [], 0, 0.0, 0.0
    for s in seqs:
        la, lb = log_softmax(reference(cfg)(w, cfg, s))[:-1], log_softmax(reference(cfg)(wc, cfg, s))[:-1]
        kl += list((np.exp(la) * (la - lb)).sum(-1))
        agree += int((la.argmax(-1) == lb.argmax(-1)).sum())
        nxt = np.array(s[1:])
        nll_a -= la[np.arange(len(nxt)), nxt].sum()
        nll_b -= lb[np.arange(len(nxt)), nxt].sum()
    n = len(kl)
    assert got["positions"] == n == 23 + 16
    assert got["config"].endswith("orig/config.json")
    assert got["kl"]["mean"] == pytest.approx(np.mean(kl), rel=1e-3)
    assert got["kl"]["max"] == pytest.approx(np.max(kl), rel=1e-3)
    assert got["kl"]["median"] == pytest.approx(np.sort(kl)[(n - 1) // 2 + ((n - 1) % 2)], rel=1e-3)
    assert got["top1_agreement"] == pytest.approx(agree / n)
    assert got["perplexity"]["original"] == pytest.approx(np.exp(nll_a / n), rel=1e-4)
    assert got["perplexity"]["candidate"] == pytest.approx(np.exp(nll_b / n), rel=1e-4)
    assert 0 < got["kl"]["mean"] < 1


def test_check_is_sensitive(models):
    """The comparison above can fail: the wrong rope_theta (GPT-Neo: the
    wrong window, or every layer global) moves perplexity past its tolerance."""
    d, w, wc, cfg, seqs = models
    r = subprocess.run([STZ, "eval", str(d / "orig"), str(d / "orig"), "--forward", "--tokens", str(d / "tokens.json"),
                        "--json"], capture_output=True, text=True, check=True)
    got = json.loads(r.stdout)["perplexity"]["original"]
    wrongs = {"gpt_neo": [dict(cfg, window_size=12), dict(cfg, window_size=1000)],
              "gemma2": [dict(cfg, sliding_window=1000), dict(cfg, attn_logit_softcapping=None),
                         dict(cfg, final_logit_softcapping=None)],
              "gemma3_text": [dict(cfg, sliding_window=1000), dict(cfg, rope_local_base_freq=cfg.get("rope_theta"))],
              "gpt2": [dict(cfg, layer_norm_epsilon=0.1)]}
    for wrong in wrongs.get(cfg["model_type"], [dict(cfg, rope_theta=10000.0)]):
        assert abs(perplexity(w, wrong, seqs) / got - 1) > 1e-3


def perplexity(w, cfg, seqs):
    nll, n = 0.0, 0
    for s in seqs:
        la = log_softmax(reference(cfg)(w, cfg, s))[:-1]
        nll -= la[np.arange(len(s) - 1), np.array(s[1:])].sum()
        n += len(s) - 1
    return np.exp(nll / n)


def test_sliding_window_refused(models):
    d, w, wc, cfg, seqs = models
    key, cases = {"gpt_neo": ("attention_types", (([[["global", "local"], 2]], "not one for each of the 2 layers"),
                                                   ([[["global", "sparse"], 1]], "must list"))),
                  "gemma2": ("layer_types", ((["full_attention"], "not one for each of the 2 layers"),
                                             (["local", "global"], "must list \"sliding_attention\"")))
                  }.get(cfg["model_type"].replace("gemma3_text", "gemma2"), (None, ()))
    if cfg["model_type"] == "gpt2":  # no windows: the attention scales it does not take are refused by name
        for wrong in (dict(cfg, scale_attn_by_inverse_layer_idx=True), dict(cfg, scale_attn_weights=False)):
            (d / "scale.json").write_text(json.dumps(wrong))
            r = subprocess.run([STZ, "eval", str(d / "orig"), str(d / "cand"), "--forward", "--config",
                                str(d / "scale.json")], capture_output=True, text=True)
            assert r.returncode == 1 and "scale_attn_weights false" in r.stderr and "scale.json" in r.stderr, r.stderr
        return
    if key:  # its windowed layers run; kinds of layers that do not fit are refused
        for types, said in cases:
            (d / "types.json").write_text(json.dumps(dict(cfg, **{key: types})))
            r = subprocess.run([STZ, "eval", str(d / "orig"), str(d / "cand"), "--forward", "--config",
                                str(d / "types.json")], capture_output=True, text=True)
            assert r.returncode == 1 and said in r.stderr and "types.json" in r.stderr, r.stderr
        return
    cfg = dict(cfg, use_sliding_window=True, sliding_window=4)
    (d / "sw.json").write_text(json.dumps(cfg))
    r = subprocess.run([STZ, "eval", str(d / "orig"), str(d / "cand"), "--forward", "--tokens", str(d / "tokens.json"),
                        "--config", str(d / "sw.json")], capture_output=True, text=True)
    assert r.returncode == 1
    assert "more than the sliding window of 4 (not supported)" in r.stderr
