"""stz imatrix and --imatrix: the importance matrix against an independent
numpy forward pass (test_forward_ref's), llama.cpp's legacy .dat and
stacked GGUF entries read as what they hold, quantizers weighting their
search by it, hostile files refused. Run with pytest; STZ names the stz
binary."""
import json
import os
import struct
import subprocess

import numpy as np
import pytest
from st_files import load
from test_forward_ref import reference
from test_gguf import dequant, read_gguf

STZ = os.environ.get("STZ", "build/stz")
DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "data")
STORIES = os.path.join(DATA, "stories260K.f32.safetensors")
HF_GGUF = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
           "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
           "mlp.down_proj": "ffn_down", "self_attn.qkv_proj": "attn_qkv", "mlp.gate_up_proj": "ffn_up",
           "attn.attention.q_proj": "attn_q", "attn.attention.k_proj": "attn_k", "attn.attention.v_proj": "attn_v",
           "attn.attention.out_proj": "attn_output", "mlp.c_fc": "ffn_up", "mlp.c_proj": "ffn_down",
           "attn.c_attn": "attn_qkv", "attn.c_proj": "attn_output"}


def stz(*args, ok=True):
    r = subprocess.run([STZ] + [str(a) for a in args], capture_output=True, text=True)
    assert (r.returncode == 0) == ok, r.stderr
    return r


def gguf_of(hf):
    if hf in ("lm_head.weight", "transformer.wte.weight", "model.embed_tokens.weight"):
        return "output.weight" if hf == "lm_head.weight" else "token_embd.weight"  # a tied head is the embedding
    _, _, layer, rest = hf.split(".", 3)
    return "blk.%s.%s.weight" % (layer, HF_GGUF[rest[:-len(".weight")]])


def model_dir(d, synth="tiny", model_type="qwen2", cls="Qwen2ForCausalLM"):
    """stz synth's model `synth` in a directory as `model_type`, and two token sequences."""
    m = d / "m"
    m.mkdir()
    stz("synth", synth, "--dtype", "f32", "-o", m / "model.safetensors", "-q")
    w, meta = load(m / "model.safetensors", dtypes=("F32",))
    cfg = json.loads(meta["config"])
    cfg.update(model_type=model_type, architectures=[cls])
    if model_type == "gpt_neo":  # its local layer's window passes inside the 19-token sequence
        cfg.update(window_size=8)
    elif model_type.startswith("gemma"):  # synth's keys; layer 0's window of 16 passes inside it
        cfg.update(rms_norm_eps=1e-6, rope_theta=cfg.get("rope_theta", 10000.0))
    elif model_type != "gpt2":
        cfg.update(rope_theta=1000000.0, rms_norm_eps=1e-6, hidden_act="silu", use_sliding_window=False,
                   sliding_window=4096)
    del cfg["architecture"]
    (m / "config.json").write_text(json.dumps(cfg))
    rng = np.random.default_rng(5)
    seqs = [rng.integers(0, cfg["vocab_size"], 19).tolist(), rng.integers(0, cfg["vocab_size"], 11).tolist()]
    (d / "tokens.json").write_text(json.dumps(seqs))
    return d, m, {n: v.astype(np.float64) for n, v in w.items()}, cfg, seqs


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """stz synth's tiny Qwen2-style model in a directory, and two token sequences."""
    return model_dir(tmp_path_factory.mktemp("imatrix"))


def check_numpy(model):
    """stz imatrix's sums and counts per matrix: those of the numpy forward pass's inputs."""
    d, m, w, cfg, seqs = model
    r = stz("imatrix", m, "--tokens", d / "tokens.json", "-o", d / "im.gguf", "--json", "-T", "1")
    doc = json.loads(r.stdout)
    assert doc["tokens"] == 30 and doc["sequences"] == 2
    inputs = {}
    for s in seqs:
        reference(cfg)(w, cfg, s, inputs)
    kv, t = read_gguf(d / "im.gguf")
    assert kv["general.type"] == "imatrix" and kv["imatrix.chunk_count"] == 2 and kv["imatrix.chunk_size"] == 19
    assert len(t) == 2 * len(inputs) == 2 * doc["entries"]
    for name, rows in inputs.items():
        x = np.concatenate(rows)
        sums, counts = t[gguf_of(name) + ".in_sum2"][0], t[gguf_of(name) + ".counts"][0]
        assert counts.shape == (1, 1) and counts[0, 0] == len(x)
        np.testing.assert_allclose(sums[0], (x * x).sum(0), rtol=2e-4, atol=1e-6, err_msg=name)
    return t


def test_matches_numpy(tiny):
    check_numpy(tiny)


def test_fused_matrices(tmp_path):
    """Phi-3's fused qkv_proj and gate_up_proj: one entry each, under
    llama.cpp's names (attn_qkv; ffn_up, which holds gate and up)."""
    t = check_numpy(model_dir(tmp_path, "phi3-tiny", "phi3", "Phi3ForCausalLM"))
    assert "blk.1.attn_qkv.weight.in_sum2" in t and "blk.1.ffn_up.weight.in_sum2" in t
    assert not any(".attn_q." in n or ".ffn_gate." in n for n in t)


@pytest.mark.parametrize("synth,model_type,cls", [("gemma2-tiny", "gemma2", "Gemma2ForCausalLM"),
                                                 ("gemma3-tiny", "gemma3_text", "Gemma3ForCausalLM")])
def test_gemma(tmp_path, synth, model_type, cls):
    """Gemma 2 and 3: the inputs of every matrix through the post-norms and
    windowed layers, the head's under the tied embedding's name."""
    t = check_numpy(model_dir(tmp_path, synth, model_type, cls))
    assert "blk.1.ffn_gate.weight.in_sum2" in t and "token_embd.weight.in_sum2" in t


def test_gpt_neo(tmp_path):
    """GPT-Neo: q/k/v, out_proj, c_fc and c_proj of each layer under
    llama.cpp's names, and the tied head as the embedding."""
    t = check_numpy(model_dir(tmp_path, "gpt-neo-tiny", "gpt_neo", "GPTNeoForCausalLM"))
    assert "blk.1.ffn_up.weight.in_sum2" in t and "token_embd.weight.in_sum2" in t
    assert not any(".ffn_gate." in n for n in t)


def test_gpt2(tmp_path):
    """GPT-2: the fused c_attn under llama.cpp's attn_qkv, c_proj,
    c_fc and the MLP's c_proj; the inputs of its Conv1D weights (stored
    (in, out)) summed over their in dimension."""
    t = check_numpy(model_dir(tmp_path, "gpt2-tiny", "gpt2", "GPT2LMHeadModel"))
    assert "blk.1.attn_qkv.weight.in_sum2" in t and "blk.1.attn_output.weight.in_sum2" in t
    assert t["blk.1.ffn_down.weight.in_sum2"][0].shape == (1, 256)


def test_sampled_in_one_pass_and_deterministic(tiny):
    d, m = tiny[0], tiny[1]
    for k in (1, 2):
        stz("imatrix", m, "--sequences", 3, "--seq-len", 9, "-o", d / ("s%d.gguf" % k), "-q")
    a, b = (d / "s1.gguf").read_bytes(), (d / "s2.gguf").read_bytes()
    assert a == b
    _, t = read_gguf(d / "s1.gguf")
    assert t["blk.0.attn_q.weight.counts"][0][0, 0] == 3 * 8  # every token fed while sampling: 8 of 9 per sequence


def write_dat(path, entries, chunks=7, dataset=b"calib.txt"):
    """llama.cpp's legacy imatrix: per entry the mean squares times the calls."""
    out = struct.pack("<i", len(entries))
    for name, (mean, calls) in entries.items():
        out += struct.pack("<i", len(name)) + name.encode() + struct.pack("<ii", calls, len(mean))
        out += (np.asarray(mean, np.float32) * calls).astype("<f4").tobytes()
    path.write_bytes(out + struct.pack("<ii", chunks, len(dataset)) + dataset)


def write_gguf_imatrix(path, entries):
    """llama.cpp's imatrix GGUF: NAME.in_sum2 [cols, matrices] and NAME.counts [1, matrices], F32."""
    infos, data = b"", b""
    def string(s):
        return struct.pack("<Q", len(s)) + s.encode()
    for name, (sums, counts) in entries.items():
        sums, counts = np.asarray(sums, "<f4"), np.asarray(counts, "<f4")
        for suffix, arr, ne in ((".in_sum2", sums, sums.shape[::-1]), (".counts", counts, (1, len(counts)))):
            infos += string(name + suffix) + struct.pack("<I", 2) + struct.pack("<QQ", *ne)
            infos += struct.pack("<IQ", 0, len(data))
            data += arr.tobytes() + b"\0" * (-arr.nbytes % 32)
    kv = string("general.type") + struct.pack("<I", 8) + string("imatrix")
    head = b"GGUF" + struct.pack("<IQQ", 3, 2 * len(entries), 1) + kv + infos
    path.write_bytes(head + b"\0" * (-len(head) % 32) + data)


def test_llama_cpp_files_read_as_they_hold(tiny, tmp_path):
    """The same importance as stz's GGUF, as a legacy .dat and as a GGUF of two
    stacked matrices (pooled), quantizes to the same bytes; another one does not."""
    d, m = tiny[0], tiny[1]
    _, t = read_gguf(d / "im.gguf")
    names = [k[:-len(".in_sum2")] for k in t if k.endswith(".in_sum2")]
    mean = {n: t[n + ".in_sum2"][0][0] / t[n + ".counts"][0][0, 0] for n in names}
    write_dat(tmp_path / "im.dat", {n: (mean[n], 4) for n in names})  # powers of two: the same floats back
    write_gguf_imatrix(tmp_path / "pooled.gguf", {n: (np.stack([mean[n] * 2, mean[n] * 4]), [2, 4]) for n in names})
    write_gguf_imatrix(tmp_path / "other.gguf", {n: (mean[n][None, :] ** 2, [1]) for n in names})
    outs = {}
    for k, im in (("stz", d / "im.gguf"), ("dat", tmp_path / "im.dat"), ("pooled", tmp_path / "pooled.gguf"),
                  ("other", tmp_path / "other.gguf"), ("none", None)):
        out = tmp_path / (k + ".safetensors")
        stz("quantize", "--fast", m / "model.safetensors", "--set", "*proj.weight=q4_0", *(["--imatrix", im] if im else []), "-o", out, "-q")
        outs[k] = out.read_bytes()
    assert outs["stz"] == outs["dat"] == outs["pooled"]
    assert outs["other"] != outs["stz"] and outs["none"] != outs["stz"]


def weighted_error(path, w, imx):
    """sum over matrices of sum_ij m_j (w_ij - q_ij)^2, the q4_0 blocks decoded by test_gguf's reader."""
    q, _ = load(path)
    e = 0.0
    for name, x in w.items():
        raw = np.asarray(q[name]).reshape(-1)
        if name.endswith("proj.weight") and raw.size == x.size // 32 * 18:  # not the f16 fallbacks
            y = dequant(raw, 2, x.size).reshape(x.shape)
            e += float((imx[gguf_of(name)] * (x - y) ** 2).sum())
    return e


def test_weighted_search_lowers_weighted_error(tiny, tmp_path):
    d, m, w = tiny[0], tiny[1], tiny[2]
    _, t = read_gguf(d / "im.gguf")
    imx = {k[:-len(".in_sum2")]: v[0][0] / t[k[:-len(".in_sum2")] + ".counts"][0][0, 0]
           for k, v in t.items() if k.endswith(".in_sum2")}
    err = {}
    for k, im in (("with", ["--imatrix", d / "im.gguf"]), ("without", [])):
        stz("quantize", "--fast", m / "model.safetensors", "--set", "*proj.weight=q4_0", *im, "-o", tmp_path / (k + ".safetensors"), "-q")
        err[k] = weighted_error(tmp_path / (k + ".safetensors"), w, imx)
    assert err["with"] < 0.97 * err["without"], err


def test_every_method_takes_weights(tiny, tmp_path):
    """Each searched method's bytes change with the importance (absmax's scale
    is its block's extreme: the same bytes)."""
    d, m = tiny[0], tiny[1]
    for rule, changes in (("int4:method=mse", True), ("int4:method=nl", True), ("int4:method=asym", True),
                          ("int8:method=mse", True), ("int4:method=absmax", False), ("q4_k", True)):
        b = []
        for im in ([], ["--imatrix", d / "im.gguf"]):
            out = tmp_path / "o.safetensors"
            stz("quantize", "--fast", m / "model.safetensors", "--set", "*proj.weight=" + rule, *im, "-o", out, "-q", "-f")
            b.append(out.read_bytes())
        assert (b[0] != b[1]) == changes, rule


def test_tied_head_is_the_embedding(tmp_path):
    if not os.path.exists(STORIES):
        pytest.skip("shared/data/stories260K.f32.safetensors not present")
    r = stz("imatrix", STORIES, "--sequences", 2, "--seq-len", 16, "-o", tmp_path / "s.gguf", "--json")
    assert json.loads(r.stdout)["entries"] == 36
    _, t = read_gguf(tmp_path / "s.gguf")
    assert "token_embd.weight.in_sum2" in t and "output.weight.in_sum2" not in t
    stz("quantize", "--fast", STORIES, "--set", "*=iq4_nl", "--imatrix", tmp_path / "s.gguf", "-o", tmp_path / "q.safetensors", "-q")


def test_bad_inputs(tiny, tmp_path):
    d, m = tiny[0], tiny[1]
    q = ["quantize", "--fast", m / "model.safetensors", "--set", "*proj.weight=q4_0", "-o", tmp_path / "q.safetensors", "--imatrix"]
    _, t = read_gguf(d / "im.gguf")
    name = next(k for k in t if k.endswith(".in_sum2"))[:-len(".in_sum2")]
    cases = {
        "truncated.dat": lambda p: p.write_bytes((d / "im.gguf").read_bytes()[:3] + b"x" * 5),
        "short.dat": lambda p: write_dat(p, {name: (np.ones(8), 1)}) or p.write_bytes(p.read_bytes()[:20]),
        "columns.dat": lambda p: write_dat(p, {name: (np.ones(7), 1)}),
        "nan.gguf": lambda p: write_gguf_imatrix(p, {name: (np.full((1, 64), np.nan), [1])}),
        "zero.gguf": lambda p: write_gguf_imatrix(p, {name: (np.zeros((1, 64)), [1])}),  # weighs nothing
        "unrelated.dat": lambda p: write_dat(p, {"blk.99.nothing.weight": (np.ones(4), 1)}),
        "nocounts.gguf": lambda p: p.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 0)),
    }
    for fname, make in cases.items():
        p = tmp_path / fname
        make(p)
        r = stz(*q, p, ok=False)
        assert r.returncode == 1 and str(p) in r.stderr and "Traceback" not in r.stderr, (fname, r.stderr)
        assert not (tmp_path / "q.safetensors").exists()
    r = stz("plan", m, "--int4", "--imatrix", d / "im.gguf", ok=False)
    assert r.returncode == 2 and "--imatrix" in r.stderr
    r = stz("imatrix", m, "--tokens", d / "tokens.json", "--seed", 3, ok=False)
    assert r.returncode == 2
    r = stz("imatrix", m, "--tokens", d / "tokens.json", "-o", d / "im.gguf", ok=False)  # exists: no -f
    assert r.returncode == 1 and "exists" in r.stderr
