"""stz eval --forward against an independent numpy forward pass of a
Qwen2-style model (q/k/v biases, grouped-query attention, rotate_half RoPE
with rope_theta from config.json, untied head), stz synth's tiny model in a
Hugging Face directory. Run with pytest; STZ names the stz binary."""
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
    """Hugging Face Qwen2ForCausalLM, written from its modeling code;
    inputs (a dict), when given, gets each matrix's input rows by name."""
    def mm(h, name):
        if inputs is not None:
            inputs.setdefault(name, []).append(h)
        return h @ w[name].T

    H, nh, nkv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd, eps, theta = H // nh, cfg["rms_norm_eps"], cfg["rope_theta"]
    T = len(tokens)
    x = w["model.embed_tokens.weight"][tokens]     # (T, H)
    pos = np.arange(T)
    mask = np.triu(np.full((T, T), -np.inf), 1)
    for l in range(cfg["num_hidden_layers"]):
        p = "model.layers.%d." % l
        h = rmsnorm(x, w[p + "input_layernorm.weight"], eps)
        q = mm(h, p + "self_attn.q_proj.weight") + w[p + "self_attn.q_proj.bias"]
        k = mm(h, p + "self_attn.k_proj.weight") + w[p + "self_attn.k_proj.bias"]
        v = mm(h, p + "self_attn.v_proj.weight") + w[p + "self_attn.v_proj.bias"]
        q = rotate_half(q.reshape(T, nh, hd), pos, theta)
        k = rotate_half(k.reshape(T, nkv, hd), pos, theta)
        v = v.reshape(T, nkv, hd)
        rep = nh // nkv
        k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
        s = np.einsum("thd,uhd->htu", q, k) / np.sqrt(hd) + mask
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        o = np.einsum("htu,uhd->thd", s, v).reshape(T, nh * hd)
        x = x + mm(o, p + "self_attn.o_proj.weight")
        h = rmsnorm(x, w[p + "post_attention_layernorm.weight"], eps)
        g = mm(h, p + "mlp.gate_proj.weight")
        x = x + mm((g / (1 + np.exp(-g))) * mm(h, p + "mlp.up_proj.weight"), p + "mlp.down_proj.weight")
    return mm(rmsnorm(x, w["model.norm.weight"], eps), "lm_head.weight")


def log_softmax(z):
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("fwd")
    orig, cand = d / "orig", d / "cand"
    orig.mkdir(), cand.mkdir()
    subprocess.run([STZ, "synth", "tiny", "--dtype", "f32", "-o", str(orig / "model.safetensors"), "-q"], check=True)
    w, meta = load(orig / "model.safetensors", dtypes=("F32",))
    w = {n: v.astype(np.float64) for n, v in w.items()}
    cfg = json.loads(meta["config"])
    cfg.update(model_type="qwen2", architectures=["Qwen2ForCausalLM"], rope_theta=1000000.0, rms_norm_eps=1e-6,
               hidden_act="silu", use_sliding_window=False, sliding_window=4)
    del cfg["architecture"]
    for p in (orig, cand):
        (p / "config.json").write_text(json.dumps(cfg))
    rng = np.random.default_rng(3)
    wc = {n: v + (0.05 * v.std() * rng.standard_normal(v.shape) if v.ndim == 2 else 0) for n, v in w.items()}
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
        la, lb = log_softmax(logits(w, cfg, s))[:-1], log_softmax(logits(wc, cfg, s))[:-1]
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
    """The comparison above can fail: the wrong rope_theta moves perplexity past its tolerance."""
    d, w, wc, cfg, seqs = models
    r = subprocess.run([STZ, "eval", str(d / "orig"), str(d / "orig"), "--forward", "--tokens", str(d / "tokens.json"),
                        "--json"], capture_output=True, text=True, check=True)
    got = json.loads(r.stdout)["perplexity"]["original"]
    wrong = dict(cfg, rope_theta=10000.0)
    nll, n = 0.0, 0
    for s in seqs:
        la = log_softmax(logits(w, wrong, s))[:-1]
        nll -= la[np.arange(len(s) - 1), np.array(s[1:])].sum()
        n += len(s) - 1
    assert abs(np.exp(nll / n) / got - 1) > 1e-3


def test_sliding_window_refused(models):
    d, w, wc, cfg, seqs = models
    cfg = dict(cfg, use_sliding_window=True)
    (d / "sw.json").write_text(json.dumps(cfg))
    r = subprocess.run([STZ, "eval", str(d / "orig"), str(d / "cand"), "--forward", "--tokens", str(d / "tokens.json"),
                        "--config", str(d / "sw.json")], capture_output=True, text=True)
    assert r.returncode == 1
    assert "more than the sliding window of 4 (not supported)" in r.stderr
