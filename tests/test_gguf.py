"""stz export --gguf: the file read back by an independent numpy GGUF reader,
quantized tensors repacked bit-exact in value, bad input refused, and the
exported models run in llama.cpp (node-llama-cpp's prebuilt CPU build from
npm; those cases skip when it cannot be installed). Run with pytest; STZ
names the stz binary, FWD_LOGITS the test helper giving stz's own logits,
STZ_SHARED_DATA the reference data (cases that need it skip without it)."""
import ctypes
import ctypes.util
import glob
import json
import os
import re
import shlex
import shutil
import struct
import subprocess

import numpy as np
import pytest
from st_files import load, save

HERE = os.path.dirname(os.path.abspath(__file__))
STZ = os.environ.get("STZ", "build/stz")
FWD = os.environ.get("FWD_LOGITS", "build/tests/fwd_logits")
DATA = os.environ.get("STZ_SHARED_DATA", os.path.join(HERE, "..", "..", "shared", "data"))
NODE_DIR = os.environ.get("STZ_NODE_DIR", os.path.expanduser("~/.cache/stz/node"))
F32 = os.path.join(DATA, "stories260K.f32.safetensors")
TOK = os.path.join(DATA, "tok512.bin")
LILY = "Once upon a time, there was a little girl named Lily."

need_data = pytest.mark.skipif(not (os.path.exists(F32) and os.path.exists(TOK)), reason="no shared data")


def fake_ggml_lib(path):
    """A library at path that calls itself ggml's but describes iq2_xxs wrongly (needs cc)."""
    src = path.with_suffix(".c")
    src.write_text(
        "#include <stdint.h>\n#include <stddef.h>\n"
        "struct t { const char *n; int64_t b, i; size_t s; _Bool q; void *f; };\n"
        "static void f(void) {}\n"
        "static struct t x = {\"iq2_xxs\", 256, 0, 64, 1, (void *)f};\n"
        "const struct t *ggml_get_type_traits(int type) { (void)type; return &x; }\n")
    subprocess.run(["cc", "-shared", "-fPIC", "-o", path, src], check=True)


def stz(*args, ok=True, env=None):
    r = subprocess.run([STZ, *map(str, args)], capture_output=True, text=True,
                       env={**os.environ, **env} if env else None)
    if ok:
        assert r.returncode == 0, r.stderr
    return r


# ---- an independent GGUF reader --------------------------------------------------

SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
BLOCK = {0: (1, 4), 1: (1, 2), 30: (1, 2), 8: (32, 34), 6: (32, 22), 2: (32, 18), 7: (32, 24),  # decoded by dequant()
         20: (32, 18), 3: (32, 20), 10: (256, 84), 11: (256, 110), 12: (256, 144), 13: (256, 176),
         14: (256, 210), 23: (256, 136)}  # read as their raw rows
DECODED = (0, 1, 30, 8, 6, 2, 7, 20)


def parse_gguf(b):
    """GGUF bytes b: its keys, tensor infos (name, ne, type, offset), where
    the keys end and where the data section starts (alignment 32)."""
    at = 0

    def take(fmt):
        nonlocal at
        v = struct.unpack_from(fmt, b, at)[0]
        at += struct.calcsize(fmt)
        return v

    def string():
        nonlocal at
        n = take("<Q")
        at += n
        return b[at - n:at].decode()

    def value(t):
        if t == 8:
            return string()
        if t == 9:
            et, n = take("<I"), take("<Q")
            return [value(et) for _ in range(n)]
        return take(SCALAR[t])

    assert b[:4] == b"GGUF"
    at = 4
    assert take("<I") == 3
    nt, nkv = take("<Q"), take("<Q")
    kv = {}
    for _ in range(nkv):
        k = string()
        kv[k] = value(take("<I"))
    infos = []
    keys_end = at
    for _ in range(nt):
        name = string()
        nd = take("<I")
        ne = [take("<Q") for _ in range(nd)]
        infos.append((name, ne, take("<I"), take("<Q")))
    return kv, infos, keys_end, (at + 31) // 32 * 32


def read_gguf(path):
    b = open(path, "rb").read()
    kv, infos, _, data = parse_gguf(b)
    tensors = {}
    for name, ne, t, off in infos:
        n = int(np.prod(ne))
        per, nb = BLOCK[t]
        raw = np.frombuffer(b, np.uint8, n // per * nb, data + off)
        if t in DECODED:
            tensors[name] = (dequant(raw, t, n).reshape(list(reversed(ne))), t)
        else:
            tensors[name] = (raw.reshape(list(reversed(ne[1:])) + [ne[0] // per * nb]), t)
    return kv, tensors


def dequant(raw, t, n):
    """ggml's dequantization of each type, written from its block layouts."""
    if t == 0:
        return raw.view("<f4").copy()
    if t == 1:
        return raw.view("<f2").astype(np.float32)
    if t == 30:
        return (raw.view("<u2").astype(np.uint32) << 16).view(np.float32)
    blk = raw.reshape(-1, BLOCK[t][1])
    d = blk[:, :2].copy().view("<f2").astype(np.float32)
    IQ4_NL = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.float32)
    if t == 8:
        q = blk[:, 2:].view(np.int8).astype(np.float32)
    elif t == 20:  # IQ4_NL: nibbles index the levels
        q = IQ4_NL[np.concatenate([blk[:, 2:] & 15, blk[:, 2:] >> 4], axis=1)]
    elif t == 7:  # Q5_1: d, m, 32 fifth bits, nibbles; y = q d + m
        m = blk[:, 2:4].copy().view("<f2").astype(np.float32)
        qs = blk[:, 8:]
        q = np.concatenate([qs & 15, qs >> 4], axis=1).astype(np.int32)
        qh = blk[:, 4:8].copy().view("<u4")
        q |= (((qh >> np.arange(32, dtype=np.uint32)) & 1) << 4).astype(np.int32)
        return (q.astype(np.float32) * d + m).reshape(n)
    else:
        qs = blk[:, 6:] if t == 6 else blk[:, 2:]
        q = np.concatenate([qs & 15, qs >> 4], axis=1).astype(np.int32)
        if t == 6:
            qh = blk[:, 2:6].copy().view("<u4")
            q |= (((qh >> np.arange(32, dtype=np.uint32)) & 1) << 4).astype(np.int32)
        q = (q - (16 if t == 6 else 8)).astype(np.float32)
    return (q * d).reshape(n)


def load_f32(path):
    return load(path, dtypes=("F32",))[0]


LLAMA2C = {"tok_embeddings.weight": "token_embd.weight", "norm.weight": "output_norm.weight"}
PER_LAYER = {"attention_norm": "attn_norm", "attention.wq": "attn_q", "attention.wk": "attn_k",
             "attention.wv": "attn_v", "attention.wo": "attn_output", "ffn_norm": "ffn_norm",
             "feed_forward.w1": "ffn_gate", "feed_forward.w3": "ffn_up", "feed_forward.w2": "ffn_down"}


def gguf_name(name):
    if name in LLAMA2C:
        return LLAMA2C[name]
    _, l, rest = name.split(".", 2)
    return "blk.%s.%s.weight" % (l, PER_LAYER[rest[:-len(".weight")]])


# ---- files --------------------------------------------------------------------------

@need_data
def test_stories_f32_values_and_keys(tmp_path):
    out = tmp_path / "s.gguf"
    r = stz("export", "--gguf", F32, "--tokenizer", TOK, "-o", out, "--json")
    rep = json.loads(r.stdout)
    assert rep["architecture"] == "llama" and rep["types"] == {"f32": {"tensors": 47, "bytes": 1040128}}
    kv, t = read_gguf(out)
    w = load_f32(F32)
    assert len(t) == len(w) == 47 and "output.weight" not in t  # tied head: llama.cpp reuses token_embd
    for name, v in w.items():
        got, typ = t[gguf_name(name)]
        assert typ == 0 and np.array_equal(got, v), name
    assert kv["general.architecture"] == "llama" and kv["llama.block_count"] == 5
    assert (kv["llama.embedding_length"], kv["llama.feed_forward_length"]) == (64, 172)
    assert (kv["llama.attention.head_count"], kv["llama.attention.head_count_kv"]) == (8, 4)
    assert kv["llama.rope.dimension_count"] == 8 and kv["llama.rope.freq_base"] == 10000
    toks = kv["tokenizer.ggml.tokens"]
    assert kv["tokenizer.ggml.model"] == "llama" and len(toks) == 512
    assert toks[:3] == ["<unk>", "<s>", "</s>"] and toks[3] == "<0x00>"
    assert kv["tokenizer.ggml.token_type"][:4] == [2, 3, 3, 6]
    assert any(s.startswith("\u2581") for s in toks) and not any(" " in s for s in toks)
    info = json.loads(stz("inspect", "--json", out).stdout)
    assert len(info["tensors"]) == 47 and info["metadata"]["general.architecture"] == '"llama"'


QUANT = {  # how to quantize stories260K so that GGUF holds it exactly
    "q8_0": ["--set", "*=int8:method=absmax:block_size=32:scale_dtype=F16:min_ndim=2"],
    "int8": ["--int8"],  # the shipped defaults: llama.cpp's types, embeddings and head included
    "int4": ["--int4"],
    "q4_0": ["--set", "*=int4:method=full:block_size=32:scale_dtype=F16:min_ndim=2"],
    "q5_0": ["--set", "*=int5:method=absmax:block_size=32:scale_dtype=F16:min_ndim=2"],
}


def quantized(tmp_path, kind):
    q = tmp_path / ("%s.safetensors" % kind)
    stz("quantize", F32, "-o", q, "-q", "--fast", *QUANT[kind])  # plain rounding: far enough from F32 to tell
    return q


@need_data
@pytest.mark.parametrize("kind", sorted(QUANT))
def test_quantized_repacked_exactly(tmp_path, kind):
    q = quantized(tmp_path, kind)
    out = tmp_path / "q.gguf"
    rep = json.loads(stz("export", "--gguf", q, "--tokenizer", TOK, "-o", out, "--json").stdout)
    assert rep["repacked_exactly"] >= 30 and rep["requantized"] == 0
    # the five w2 matrices (rows of 172) as F16: by export, or already by the policy (int4, int8)
    assert rep["f16_fallback"] == (0 if kind.startswith("int") else 5)
    plain = tmp_path / "plain.safetensors"
    stz("dequantize", q, "-o", plain, "--dtype", "f32", "-q")
    _, t = read_gguf(out)
    code = {"q8_0": 8, "q4_0": 2, "q5_0": 6, "int8": 8, "int4": 20}[kind]  # int4: IQ4_NL for most
    types = set()
    for name, v in load_f32(plain).items():
        got, typ = t[gguf_name(name)]
        types.add(typ)
        assert np.array_equal(got, v), name  # equal in value, element by element
    assert code in types and 0 in types and (1 in types) == kind.startswith("int")


@need_data
@pytest.mark.parametrize("chunk", ["65536", "65544"])
def test_container_same_as_file(tmp_path, chunk):
    """From an .stz container (read in place, chunks decoded on worker
    threads straight into the output; 65544-byte chunks split Q4_0 blocks,
    which takes the row-batch path) the same bytes as from the file."""
    q = quantized(tmp_path, "q4_0")
    c = tmp_path / "q.stz"
    stz("pack", q, "-o", c, "--chunk-size", chunk, "-q")
    for src, out in ((q, "a.gguf"), (c, "b.gguf")):
        stz("export", "--gguf", src, "--tokenizer", TOK, "-o", tmp_path / out, "--name", "s", "-q", "-T", "2")
    assert (tmp_path / "a.gguf").read_bytes() == (tmp_path / "b.gguf").read_bytes()
    assert sorted(os.listdir(tmp_path)) == ["a.gguf", "b.gguf", "q.stz", "q4_0.safetensors"]  # no temporary file


@need_data
def test_defaults_export_exactly(tmp_path):
    """The shipped --int4 (issue 30's target): compress, then export the
    container with no --requantize, to a file no larger than llama.cpp's
    IQ4_NL default mix of stories260K (258,816 bytes) at a mean KL at most
    0.8x that mix's 0.0422; --int8 every matrix Q8_0 (the 172-wide F16)."""
    for flag, most in (("--int4", 258816), ("--int8", 350000)):
        c, g = tmp_path / "m.stz", tmp_path / ("m%s.gguf" % flag)
        stz("compress", flag, F32, "-o", c, "-q", "-f")
        rep = json.loads(stz("export", "--gguf", c, "--tokenizer", TOK, "-o", g, "--json").stdout)
        assert rep["requantized"] == 0 and os.path.getsize(g) <= most
        ev = json.loads(stz("eval", "--forward", F32, g, "--sequences", "16", "--seed", "7", "--json").stdout)
        assert ev["kl"]["mean"] <= (0.8 * 0.0422 if flag == "--int4" else 0.000301), flag  # Q8_0 anchor: 0.000301
        _, t = read_gguf(g)
        types = {typ for name, (v, typ) in t.items() if v.ndim == 2}
        assert types == ({7, 8, 20, 1} if flag == "--int4" else {8, 1}), (flag, types)  # Q5_1 Q8_0 IQ4_NL F16


@need_data
def test_inexact_quantization_needs_requantize(tmp_path):
    q = tmp_path / "nl.safetensors"
    stz("quantize", "--policy", "int4-nl", F32, "-o", q, "-q", "--fast")  # nl levels, U8 scales
    out = tmp_path / "nl.gguf"
    r = stz("export", "--gguf", q, "--tokenizer", TOK, "-o", out, ok=False)
    assert r.returncode == 1 and "GGUF cannot hold exactly" in r.stderr and "--requantize" in r.stderr
    assert "layers.0.attention.wq.weight" in r.stderr and not out.exists()
    rep = json.loads(stz("export", "--gguf", q, "--tokenizer", TOK, "-o", out, "--requantize", "--json").stdout)
    assert rep["requantized"] == 30 and 0.01 < rep["requantize_max_rel_error"] < 0.2
    r = stz("export", "--gguf", q, "--tokenizer", TOK, "-o", out, "--requantize", ok=False)
    assert r.returncode == 1 and "exists" in r.stderr


@need_data
def test_type_fallback_reported(tmp_path):
    """--type q4_k on stories260K's 64-wide rows: llama.cpp's Q5_0 fallback,
    said and counted; an unknown --type lists every type export takes."""
    out = tmp_path / "k.gguf"
    r = stz("export", "--gguf", F32, "--tokenizer", TOK, "-o", out, "--type", "q4_k")
    assert "31 tensors in llama.cpp's 32-block fallback: rows not whole 256-blocks" in r.stdout
    assert "(first: tok_embeddings.weight, q4_k -> q5_0)" in r.stdout
    rep = json.loads(stz("export", "--gguf", F32, "--tokenizer", TOK, "-o", out, "-f", "--type", "q6_k", "--json").stdout)
    assert rep["block_fallback"] == 31 and rep["types"]["q8_0"]["tensors"] == 31 and "q6_k" not in rep["types"]
    r = stz("export", "--gguf", F32, "--tokenizer", TOK, "-o", tmp_path / "x.gguf", "--type", "q9", ok=False)
    assert r.returncode == 2 and "q4_k, q5_k, q6_k, iq4_nl, iq4_xs, bf16, or a mix" in r.stderr


@need_data
@pytest.mark.parametrize("typ", ["q4_0", "q8_0"])
def test_gguf_policies_as_small_as_type(tmp_path, typ):
    """The shipped gguf-q4_0 and gguf-q8_0 policies export to the very types
    and bytes export --type writes (stories260K's 172-wide rows as F16, not
    as F32 values), every tensor copied without requantizing."""
    q = tmp_path / "q.safetensors"
    stz("quantize", "--policy", "gguf-" + typ, F32, "-o", q, "-q", "--fast")
    a = json.loads(stz("export", "--gguf", q, "--tokenizer", TOK, "-o", tmp_path / "a.gguf", "--json").stdout)
    b = json.loads(stz("export", "--gguf", F32, "--type", typ, "--tokenizer", TOK, "-o", tmp_path / "b.gguf",
                       "--json").stdout)
    assert os.path.getsize(tmp_path / "a.gguf") == os.path.getsize(tmp_path / "b.gguf")
    assert a["types"] == b["types"] and a["types"]["f32"]["tensors"] == 11  # the norms
    assert a["requantized"] == 0 and a["repacked_exactly"] == 36


@need_data
@pytest.mark.parametrize("src", ["f32", "bf16"])
@pytest.mark.parametrize("typ", ["q8_0", "q5_0", "q4_0", "f16", "bf16", "f32"])
def test_float_types(tmp_path, src, typ):
    """--type on F32 and BF16 sources: every value within the type's error."""
    out = tmp_path / "t.gguf"
    model = os.path.join(DATA, "stories260K.%s.safetensors" % src)
    rep = json.loads(stz("export", "--gguf", model, "--tokenizer", TOK, "-o", out, "--type", typ, "--json").stdout)
    block = typ.startswith("q")
    assert rep["types"][typ]["tensors"] == (31 if block else 47 if typ == "f32" else 36) and rep["f16_fallback"] == (5 if block else 0)
    _, t = read_gguf(out)
    tol = {"q8_0": 0.01, "q5_0": 0.05, "q4_0": 0.12, "f16": 1e-3, "bf16": 5e-3, "f32": 0}[typ]
    w = load_f32(F32)
    if src == "bf16":  # the BF16 file's values, as F32
        w = {n: ((v.view(np.uint32) + 0x7FFF + ((v.view(np.uint32) >> 16) & 1)) & 0xFFFF0000).view(np.float32)
             for n, v in w.items()}
    for name, v in w.items():
        got, code = t[gguf_name(name)]
        rel = np.linalg.norm(got - v) / np.linalg.norm(v)
        assert rel <= (tol if v.ndim == 2 and not (block and code == 1) else 1e-3 if code == 1 else 0), name


def test_bad_input(tmp_path):
    m = tmp_path / "m"
    m.mkdir()
    stz("synth", "tiny", "--dtype", "f32", "-o", m / "model.safetensors", "-q")
    out = tmp_path / "o.gguf"
    r = stz("export", "--gguf", m / "model.safetensors", "-o", out, ok=False)
    assert r.returncode == 1 and "no tokenizer" in r.stderr and "--tokenizer" in r.stderr
    (m / "config.json").write_text(json.dumps({"model_type": "bloom", "n_layer": 2}))
    r = stz("export", "--gguf", m, "-o", out, "--tokenizer", m / "tokenizer.json", ok=False)
    assert r.returncode == 1 and "model_type 'bloom' is not supported" in r.stderr
    (m / "config.json").unlink()
    tj = tmp_path / "tokenizer.json"
    tj.write_text(json.dumps({"model": {"type": "BPE", "vocab": {"a": 0, "b": 999}, "merges": []}}))
    r = stz("export", "--gguf", m / "model.safetensors", "-o", out, "--tokenizer", tj, ok=False)
    assert r.returncode == 1 and "id 999, past the model's vocabulary of 256" in r.stderr
    tj.write_text(json.dumps({"model": {"type": "Unigram", "vocab": {}, "merges": []}}))
    r = stz("export", "--gguf", m / "model.safetensors", "-o", out, "--tokenizer", tj, ok=False)
    assert r.returncode == 1 and "tokenizer model 'Unigram'" in r.stderr
    bad = tmp_path / "short.bin"
    bad.write_bytes(open(TOK, "rb").read()[:1000] if os.path.exists(TOK) else b"\0" * 100)
    r = stz("export", "--gguf", m / "model.safetensors", "-o", out, "--tokenizer", bad, ok=False)
    assert r.returncode == 1 and "short.bin: ends at token" in r.stderr
    assert not out.exists() and sorted(os.listdir(tmp_path)) == ["m", "short.bin", "tokenizer.json"]
    g = tmp_path / "bad.gguf"
    g.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 1, 0) + struct.pack("<Q", 1 << 40) + bytes(64))
    r = stz("inspect", g, ok=False)
    assert r.returncode == 1 and "bad.gguf: tensor info 0 runs past the end of the file" in r.stderr


def gguf_bytes(kvs, tensors):
    """A GGUF v3 image: kvs [(key bytes, value str bytes)], tensors [(name bytes, type, ne0, ne1, nbytes)]."""
    out = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs))
    for k, v in kvs:
        out += struct.pack("<Q", len(k)) + k + struct.pack("<IQ", 8, len(v)) + v
    off = 0
    for name, typ, ne0, ne1, nbytes in tensors:
        out += struct.pack("<Q", len(name)) + name + struct.pack("<IQQIQ", 2, ne0, ne1, typ, off)
        off += (nbytes + 31) // 32 * 32
    out += bytes(-len(out) % 32)
    return out + bytes(off)


def test_hostile_gguf(tmp_path):
    """Duplicate keys or names, NUL and control characters in names, unknown
    types: refused by name; string values reach the terminal escaped; every
    llama.cpp type is listed with its size."""
    g = tmp_path / "h.gguf"
    ok_t = [(b"a.weight", 0, 32, 2, 256)]
    cases = [
        ([(b"k", b"1"), (b"k", b"2")], ok_t, "key 'k' appears twice"),
        ([(b"k\0x", b"1")], ok_t, "the key has a NUL or control character"),
        ([(b"k\x1b[31m", b"1")], ok_t, "the key has a NUL or control character"),
        ([], ok_t + [(b"a.weight", 0, 32, 2, 256)], "tensor 'a.weight' appears twice"),
        ([], [(b"a\x1b]0;x\x07", 0, 32, 2, 256)], "tensor info 0: the name has a NUL or control character"),
        ([], [(b"a.weight", 99, 32, 2, 256)], "tensor 'a.weight': unknown ggml type 99"),
        ([], [(b"a.weight", 12, 32, 2, 288)], "rows of 32 are not whole q4_k blocks"),
    ]
    for kvs, ts, msg in cases:
        g.write_bytes(gguf_bytes(kvs, ts))
        r = stz("inspect", g, ok=False)
        assert r.returncode == 1 and msg in r.stderr, (msg, r.stderr)
        assert "\x1b" not in r.stderr and "\x07" not in r.stderr
    g.write_bytes(gguf_bytes([(b"general.name", b"\x1b]0;pwned\x07red\x1b[31m\0tail")],
                             [(b"blk.0.ffn_down.weight", 12, 256, 3, 3 * 144), (b"b", 14, 512, 1, 2 * 210)]))
    r = stz("inspect", g)
    assert "\x1b" not in r.stdout and "\x07" not in r.stdout
    assert '"\\x1b]0;pwned\\ared\\x1b[31m\\x00tail"' in r.stdout, r.stdout
    assert re.search(r"blk.0.ffn_down.weight +q4_k +\[256, 3\] +432", r.stdout), r.stdout
    assert re.search(r"\nb +q6_k +\[512, 1\] +420", r.stdout), r.stdout
    # a family stz does not know, with a tensor whose role Hugging Face's Llama names lack: its GGUF name kept
    g.write_bytes(gguf_bytes([(b"general.architecture", b"foo")], [(b"blk.0.attn_norm.bias", 0, 32, 1, 128)]))
    stz("dequantize", g, "-o", tmp_path / "h.safetensors", "-q")
    assert list(load_f32(tmp_path / "h.safetensors")) == ["blk.0.attn_norm.bias"]


TINY = {"qwen3": "qwen3-tiny", "phi3": "phi3-tiny", "gemma2": "gemma2-tiny", "gemma3_text": "gemma3-tiny",
        "gpt2": "gpt2-tiny"}


def hf_dir(tmp_path, arch, name="m", layers=None, **extra):
    """stz synth's tiny model as a Hugging Face directory of `arch` (Qwen3,
    Phi-3 and Gemma: their own tiny shapes, with q/k head norms and heads of
    32 on hidden 64; with fused qkv and gate_up projections), of `layers`
    layers if given."""
    m = tmp_path / name
    m.mkdir()
    stz("synth", TINY.get(arch, "tiny"), "--dtype", "f32", "-o", m / "model.safetensors", "-q",
        *(("--layers", str(layers)) if layers else ()))
    cfg = json.loads(json.loads(stz("inspect", "--json", m / "model.safetensors").stdout)["metadata"]["config"])
    del cfg["architecture"]
    if not arch.startswith("gemma"):  # Gemma's: synth's own
        cfg.update(rope_theta=10000.0, hidden_act="silu")
    cfg.update(model_type=arch, rms_norm_eps=1e-6, bos_token_id=255, eos_token_id=255, **extra)
    (m / "config.json").write_text(json.dumps(cfg))
    (m / "tokenizer.json").write_text(json.dumps(tiny_tokenizer()))
    return m


def test_sharded_directory(tmp_path):
    """A sharded directory exports to the same bytes as the single file."""
    one = hf_dir(tmp_path, "qwen2")
    w = load_f32(one / "model.safetensors")
    two = tmp_path / "sharded"
    two.mkdir()
    names = list(w)
    shards = {"model-00001-of-00002.safetensors": names[:10], "model-00002-of-00002.safetensors": names[10:]}
    for f, part in shards.items():
        save(two / f, {n: w[n] for n in part})
    (two / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {n: f for f, part in shards.items() for n in part}}))
    for f in ("config.json", "tokenizer.json"):
        shutil.copy(one / f, two / f)
    stz("export", "--gguf", one, "-o", tmp_path / "a.gguf", "--name", "tiny", "-q")
    stz("export", "--gguf", two, "-o", tmp_path / "b.gguf", "--name", "tiny", "-q")
    assert (tmp_path / "a.gguf").read_bytes() == (tmp_path / "b.gguf").read_bytes()
    kv, t = read_gguf(tmp_path / "a.gguf")
    assert kv["general.name"] == "tiny" and kv["general.file_type"] == 0 and len(t) == len(w)


# ---- in llama.cpp ---------------------------------------------------------------------

def engine():
    """node-llama-cpp in NODE_DIR, installed there if missing; None when it cannot be."""
    pkg = os.path.join(NODE_DIR, "node_modules", "node-llama-cpp", "package.json")
    if not os.path.exists(pkg) and shutil.which("npm"):
        os.makedirs(NODE_DIR, exist_ok=True)
        subprocess.run(["npm", "install", "--prefix", NODE_DIR, "--omit=optional", "--no-audit", "--no-fund",
                        "node-llama-cpp@3.22.1", "@node-llama-cpp/linux-x64@3.22.1"], capture_output=True, timeout=600)
    return NODE_DIR if os.path.exists(pkg) and shutil.which("node") else None


need_engine = pytest.mark.skipif(engine() is None, reason="node-llama-cpp not installable (no npm registry)")


def run_engine(tmp_path, gguf, tokens, text=None, generate=0):
    req = {"tokens": tokens, "logits": str(tmp_path / "engine.f32"), "generate": generate}
    if text is not None:
        req["text"] = text
    (tmp_path / "req.json").write_text(json.dumps(req))
    r = subprocess.run(["node", os.path.join(HERE, "gguf_engine.mjs"), NODE_DIR, str(gguf), str(tmp_path / "req.json")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    return np.fromfile(tmp_path / "engine.f32", "<f4").reshape(len(tokens), -1), out


def kl_mean(p_logits, q_logits):
    """Mean KL(p || q) in nats per row of two logit matrices."""
    lp = p_logits - np.logaddexp.reduce(p_logits.astype(np.float64), axis=1, keepdims=True)
    lq = q_logits - np.logaddexp.reduce(q_logits.astype(np.float64), axis=1, keepdims=True)
    return float((np.exp(lp) * (lp - lq)).sum(1).mean())


def stz_logits(model, tokens, config="-"):
    r = subprocess.run([FWD, str(model), str(config), *map(str, tokens)], capture_output=True, check=True)
    return np.frombuffer(r.stdout, "<f4").reshape(len(tokens), -1)


@need_data
@need_engine
def test_llama_cpp_runs_stories_exactly(tmp_path):
    out = tmp_path / "s.gguf"
    stz("export", "--gguf", F32, "--tokenizer", TOK, "-o", out)
    ref = json.load(open(os.path.join(DATA, "stories260K.greedy.json")))["tokens"]
    want = np.fromfile(os.path.join(DATA, "stories260K.greedy.logits.f32"), "<f4").reshape(len(ref), 512)
    got, o = run_engine(tmp_path, out, ref, text=LILY, generate=len(ref) - 1)
    assert np.abs(got - want).max() < 1e-4
    assert o["generated"] == ref[1:]  # llama.cpp's own greedy continuation from BOS
    assert o["tokenized"] == ref[1:16]


@need_data
@need_engine
def test_export_md_engine_command(tmp_path):
    """export.md's node-llama-cpp command, word for word (with --threads, so
    that it is quick on a small machine), completes the exported Q4_0 file."""
    doc = open(os.path.join(HERE, "..", "docs", "cli", "export.md")).read()
    prefix = "~/.cache/stz/node/node_modules/.bin/node-llama-cpp complete "
    line = next(l for l in doc.splitlines() if l.startswith(prefix))
    args = shlex.split(line)
    assert "--threads" in args
    args[0] = os.path.join(NODE_DIR, "node_modules", ".bin", "node-llama-cpp")
    q = quantized(tmp_path, "q4_0")
    stz("export", "--gguf", q, "--tokenizer", TOK, "-o", tmp_path / "stories.q4_0.gguf", "-q")
    r = subprocess.run(args, cwd=tmp_path, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=600)
    assert "Completion: , there was a little girl named Lily" in r.stdout, r.stdout + r.stderr


@need_data
@need_engine
@pytest.mark.parametrize("kind", ["q8_0", "q4_0", "int8", "int4"])
def test_llama_cpp_runs_quantized_like_stz(tmp_path, kind):
    """llama.cpp on the repacked blocks against stz's forward pass on the same
    quantized weights. llama.cpp rounds activations to 8 bits (Q8_0 blocks)
    before its quantized dot products, so the two differ by that rounding:
    measured here, mean |difference| 0.034 (Q8_0) and 0.046 (Q4_0), largest
    0.27, for logits spanning ~30, top-1 the same at >= 99% of positions.
    Tolerance: mean < 0.06, largest < 0.4, top-1 >= 98%. Against the
    unquantized model llama.cpp differs more (Q4_0: mean 0.82), so the check
    can fail."""
    q = quantized(tmp_path, kind)
    out = tmp_path / "q.gguf"
    stz("export", "--gguf", q, "--tokenizer", TOK, "-o", out)
    ref = json.load(open(os.path.join(DATA, "stories260K.greedy.json")))["tokens"]
    got, _ = run_engine(tmp_path, out, ref)
    mine = stz_logits(q, ref)
    full = np.fromfile(os.path.join(DATA, "stories260K.greedy.logits.f32"), "<f4").reshape(len(ref), 512)
    d = np.abs(got - mine)
    assert d.mean() < 0.06 and d.max() < 0.4 and (got.argmax(1) == mine.argmax(1)).mean() >= 0.98
    assert np.abs(got - full).mean() > (5 if "4" in kind else 1.2) * d.mean()


@need_data
@need_engine
@pytest.mark.parametrize("mix", ["q4_0", "mixed"])
def test_llama_cpp_runs_padded_ffn(tmp_path, mix):
    """"pad": true keeps the 172-wide ffn_down in a 32-block type, each row's
    last block zero-padded; export widens the FFN to 192 units (zero rows
    after gate and up, feed_forward_length 192, the model's own 172 under
    stz.feed_forward_length), and llama.cpp runs it to stz's forward pass on
    the quantized SafeTensors file; stz reads the GGUF back to the same
    values, the zero units taken out. Only the down projections are
    quantized, so llama.cpp's 8-bit rounding of activations touches one
    product per layer: measured mean |difference| 0.035, largest 0.30
    (logits span ~30); a padding read in the wrong place moves the logits
    by whole units. "mixed": Q8_0, and q5_k asked for (padded, in Q5_1,
    llama.cpp's fallback: a minimum, so the padding does not decode to 0),
    one down projection kept in F32 (its columns widened with zeros)."""
    sets = (["--set", "*.w2.weight=q4_0:pad=true"] if mix == "q4_0" else
            ["--set", "layers.[02].feed_forward.w2.weight=q8_0:pad=true",
             "--set", "layers.[13].feed_forward.w2.weight=q5_k:pad=true"])
    q, out = tmp_path / "q.safetensors", tmp_path / "q.gguf"
    stz("quantize", F32, "-o", q, "-q", "--fast", *sets)  # calibration is not what this measures
    rep = json.loads(stz("export", "--gguf", q, "--tokenizer", TOK, "-o", out, "--json").stdout)
    assert rep["ffn_widened"] == {"from": 172, "to": 192} and rep["f16_fallback"] == 0 and rep["requantized"] == 0
    kv, t = read_gguf(out)
    assert kv["llama.feed_forward_length"] == 192 and kv["stz.feed_forward_length"] == 172
    want = {"q4_0": {0: 2}, "mixed": {0: 8, 1: 7, 2: 8, 3: 7, 4: 0}}[mix]
    for l in range(5):
        v, typ = t["blk.%d.ffn_down.weight" % l]
        assert typ == want.get(l, 2) and v.shape[0] == 64, (l, typ, v.shape)
        g, _ = t["blk.%d.ffn_gate.weight" % l]
        assert g.shape == (192, 64) and not g[172:].any() and g[:172].any()
    ref = json.load(open(os.path.join(DATA, "stories260K.greedy.json")))["tokens"]
    got, _ = run_engine(tmp_path, out, ref)
    mine = stz_logits(q, ref)
    d = np.abs(got - mine)
    assert d.mean() < 0.05 and d.max() < 0.4 and (got.argmax(1) == mine.argmax(1)).mean() >= 0.98
    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    stz("dequantize", q, "-o", a, "--dtype", "f32", "-q")
    stz("dequantize", out, "-o", b, "--dtype", "f32", "--names", "llama2c", "-q")
    wa, wb = load_f32(a), load_f32(b)
    assert wa.keys() == wb.keys() and all(np.array_equal(wa[n], wb[n]) for n in wa)
    # a unit past stz.feed_forward_length that is not zero is not padding: refused, not dropped
    raw = bytearray(out.read_bytes())
    _, infos, _, data = parse_gguf(bytes(raw))
    name, ne, typ, off = next(i for i in infos if i[0] == "blk.3.ffn_up.weight")
    assert typ == 0 and ne == [64, 192]  # F32 (kept): 256 bytes a row
    raw[data + off + 180 * 256:data + off + 180 * 256 + 4] = np.float32(0.5).tobytes()
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(bytes(raw))
    r = stz("dequantize", bad, "-o", tmp_path / "c.safetensors", ok=False)
    assert r.returncode == 1 and "'blk.3.ffn_up.weight': row 180 is not zero" in r.stderr, r.stderr


def byte_chars():
    """GPT-2's byte-level alphabet: the bytes, and the character standing
    for each (printable bytes as themselves, the others past 255)."""
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b), cs.append(256 + n)
            n += 1
    return bs, [chr(c) for c in cs]


def tiny_tokenizer():
    """A byte-level BPE tokenizer.json for stz synth's 256-token model: 250
    byte symbols, three merges, two tokens past them and one special token."""
    sym = byte_chars()[1][:250]
    vocab = {s: i for i, s in enumerate(sym)}
    for s in ["he", "\u0120t", "\u0120the", "\u0120a", "ll"]:
        vocab[s] = len(vocab)
    return {"model": {"type": "BPE", "vocab": vocab, "byte_fallback": False,
                      "merges": ["h e", "\u0120 t", "\u0120t he", ["\u0120", "a"], "l l"]},
            "added_tokens": [{"id": 255, "content": "<|endoftext|>", "special": True}]}


def test_tokenizer_coverage(tmp_path):
    """A tokenizer whose ids leave more than 1% of the embedding's rows
    uncovered (another model's) is refused unless --pad-vocab; a few rows
    past its ids are padded either way, and counted."""
    m = hf_dir(tmp_path, "llama")
    out = tmp_path / "o.gguf"
    t = tiny_tokenizer()
    t["added_tokens"] = []  # id 255: one row of 256 past the ids, within 1%
    (m / "tokenizer.json").write_text(json.dumps(t))
    rep = json.loads(stz("export", "--gguf", m, "-o", out, "--json").stdout)
    assert rep["vocab_padded"] == 1
    out.unlink()
    t["model"]["vocab"] = {k: v for k, v in t["model"]["vocab"].items() if not 240 <= v < 250}
    (m / "tokenizer.json").write_text(json.dumps(t))
    r = stz("export", "--gguf", m, "-o", out, ok=False)
    assert r.returncode == 1 and "its ids cover 245 of the model's 256 embedding rows" in r.stderr, r.stderr
    assert "--pad-vocab" in r.stderr and not out.exists()
    r = stz("export", "--gguf", m, "-o", out, "--pad-vocab")
    assert "11 embedding rows past the tokenizer's ids written as [PADn] tokens" in r.stdout
    kv, _ = read_gguf(out)
    assert kv["tokenizer.ggml.tokens"][245] == "[PAD245]"


def test_bad_tokenizer_and_model(tmp_path):
    """What llama.cpp would load wrongly or not at all is refused by name:
    tokenizer.json with two tokens on one id, a token twice, no token, a
    merge of non-tokens, a token not UTF-8, a BOS/EOS past the vocabulary;
    a Qwen2 model without a q bias; F16 output of a value past F16's range."""
    m = hf_dir(tmp_path, "llama")
    out = tmp_path / "o.gguf"

    def refused(tok_text, *want, model=m, extra=()):
        (model / "tokenizer.json").write_bytes(tok_text if isinstance(tok_text, bytes) else tok_text.encode())
        r = stz("export", "--gguf", model, "-o", out, *extra, ok=False)
        assert r.returncode == 1 and all(w in r.stderr for w in want), r.stderr
        assert not out.exists()

    good = tiny_tokenizer()
    t = json.loads(json.dumps(good))
    t["model"]["vocab"]["zz"] = 3
    refused(json.dumps(t), "id 3 is given to")
    text = json.dumps(good).replace('"vocab": {', '"vocab": {"he": 250, ', 1)
    refused(text, "'he'")
    refused(json.dumps({"model": {"type": "BPE", "vocab": {}, "merges": []}}), "model.vocab holds no token")
    for merge in ("h e x", "he zz", "he", " he"):
        t = json.loads(json.dumps(good))
        t["model"]["merges"].append(merge)
        refused(json.dumps(t), "merge 5 is not two tokens")
    refused(json.dumps(good).replace('"ll"', '"l\\u00ff"').encode().replace(b"\\u00ff", b"\xff"), "not valid UTF-8")
    cfg = json.loads((m / "config.json").read_text())
    (m / "config.json").write_text(json.dumps(dict(cfg, eos_token_id=256)))
    refused(json.dumps(good), "eos_token_id 256 is past the vocabulary of 256 tokens")
    (m / "config.json").write_text(json.dumps(cfg))
    w, meta = load(m / "model.safetensors")
    big = dict(w)
    big["model.layers.0.mlp.up_proj.weight"] = w["model.layers.0.mlp.up_proj.weight"].copy()
    big["model.layers.0.mlp.up_proj.weight"][3, 5] = 1e5
    save(m / "model.safetensors", big, meta)
    refused(json.dumps(good), "'model.layers.0.mlp.up_proj.weight': row 3, element 5 is 100000",
            "past F16's largest value 65504", extra=("--type", "f16"))
    assert stz("export", "--gguf", m, "-o", out, "--type", "f32").returncode == 0
    out.unlink()
    q = hf_dir(tmp_path, "qwen2", name="q")
    w, meta = load(q / "model.safetensors")
    del w["model.layers.1.self_attn.q_proj.bias"]
    save(q / "model.safetensors", w, meta)
    refused(json.dumps(good), "without the q bias of layer 1", model=q)


ROPE = {  # Llama 3.1's scaling, with a short original context so that it acts on 64-token sequences
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 16},
    "linear": {"type": "linear", "factor": 4.0},
}


@need_engine
@pytest.mark.parametrize("arch,rope", [("qwen2", None), ("qwen3", None), ("phi3", None), ("llama", None),
                                       ("llama", "llama3"), ("llama", "linear")])
def test_llama_cpp_runs_hugging_face_model(tmp_path, arch, rope):
    """stz synth's tiny model with q/k/v biases as a Hugging Face directory:
    Qwen2 (rotate_half RoPE kept as is), Qwen3 (q/k head norms, heads wider
    than hidden / heads), Phi-3 (fused qkv and gate_up) and Llama (q/k rows permuted to llama.cpp's pairs;
    also with Llama 3.1's RoPE scaling, written as the rope_freqs.weight
    tensor, and linear scaling, written as keys). llama.cpp's logits match
    stz's forward pass."""
    m = hf_dir(tmp_path, arch, **({"rope_scaling": ROPE[rope]} if rope else {}))
    out = tmp_path / "t.gguf"
    rep = json.loads(stz("export", "--gguf", m, "-o", out, "--json").stdout)
    assert rep["architecture"] == arch
    kv, t = read_gguf(out)
    assert kv["tokenizer.ggml.model"] == "gpt2" and len(kv["tokenizer.ggml.merges"]) == 5
    assert kv["tokenizer.ggml.pre"] == {"llama": "llama-bpe", "phi3": "default"}.get(arch, "qwen2")
    assert kv["tokenizer.ggml.add_bos_token"] == (arch in ("llama", "phi3"))
    assert ("blk.1.attn_k_norm.weight" in t) == (arch == "qwen3")
    assert ("blk.1.attn_qkv.weight" in t) == (arch == "phi3") != ("blk.1.attn_q.weight" in t)
    assert ("rope_freqs.weight" in t) == (rope == "llama3")
    assert kv.get("llama.rope.scaling.type") == ("linear" if rope == "linear" else None)
    rng = np.random.default_rng(5)
    tokens = [255] + rng.integers(0, 255, 63).tolist()
    got, o = run_engine(tmp_path, out, tokens, text=" the hell")
    mine = stz_logits(m / "model.safetensors", tokens, m / "config.json")
    assert np.abs(got - mine).max() < 1e-3
    assert kl_mean(mine, got) < 1e-4  # issue 55's bound, nats per token
    assert o["tokenized"] == [252, 220, 250, 254]  # " the" merged whole; " hell" as "\u0120", "he", "ll"
    if rope:  # the scaling matters here: without it the logits move
        plain = tmp_path / "plain"
        shutil.copytree(m, plain)
        cfg = json.loads((plain / "config.json").read_text())
        del cfg["rope_scaling"]
        (plain / "config.json").write_text(json.dumps(cfg))
        assert np.abs(stz_logits(plain / "model.safetensors", tokens, plain / "config.json") - mine).max() > 1e-2


def test_gemma_scale_llama_cpp_cannot_take(tmp_path):
    """llama.cpp derives Gemma's score scale from the model's size: another
    query_pre_attn_scalar is refused by name, no file left; so are windowed
    layers that its sliding_window_pattern cannot express."""
    m = hf_dir(tmp_path, "gemma2", query_pre_attn_scalar=16)
    r = stz("export", "--gguf", m, "-o", tmp_path / "t.gguf", ok=False)
    assert r.returncode == 1 and "query_pre_attn_scalar 16 is not the one llama.cpp takes for this model (32)" in \
        r.stderr, r.stderr
    assert not (tmp_path / "t.gguf").exists()
    m = hf_dir(tmp_path, "gemma2", name="w", layer_types=["full_attention", "sliding_attention"])
    r = stz("export", "--gguf", m, "-o", tmp_path / "t.gguf", ok=False)  # the global layer first: not llama.cpp's
    assert r.returncode == 1 and "not a pattern llama.cpp's sliding_window_pattern expresses" in r.stderr, r.stderr


@need_engine
@pytest.mark.parametrize("arch", ["gemma2", "gemma3_text"])
def test_llama_cpp_runs_gemma(tmp_path, arch):
    """Gemma 2 and 3 (issue 55): their norms written as 1 + w, as llama.cpp's
    converter does, the post-norms under llama.cpp's names, the windowed
    layers' pattern and window (the 64 tokens pass the tiny model's 16),
    Gemma 2's soft-capping, Gemma 3's q/k head norms and local RoPE base.
    llama.cpp's logits match stz's forward pass; stz reads the file back
    to Hugging Face's w (1 + w less 1: w itself where the sum rounds
    nothing away) and the same logits."""
    m = hf_dir(tmp_path, arch)
    out = tmp_path / "t.gguf"
    gguf_arch = {"gemma2": "gemma2", "gemma3_text": "gemma3"}[arch]
    assert json.loads(stz("export", "--gguf", m, "-o", out, "--json").stdout)["architecture"] == gguf_arch
    kv, t = read_gguf(out)
    assert kv["%s.attention.sliding_window" % gguf_arch] == 16 and kv["%s.attention.key_length" % gguf_arch] == 32
    assert kv["%s.attention.sliding_window_pattern" % gguf_arch] == 2
    assert kv.get("gemma2.attn_logit_softcapping") == (50.0 if arch == "gemma2" else None)
    assert kv.get("gemma3.rope.freq_base_swa") == (10000.0 if arch == "gemma3_text" else None)
    assert "blk.1.post_attention_norm.weight" in t and "blk.1.post_ffw_norm.weight" in t and "output.weight" not in t
    assert ("blk.1.attn_q_norm.weight" in t) == (arch == "gemma3_text")
    rng = np.random.default_rng(5)
    tokens = [255] + rng.integers(0, 255, 63).tolist()
    got, _ = run_engine(tmp_path, out, tokens)
    mine = stz_logits(m / "model.safetensors", tokens, m / "config.json")
    # llama.cpp's GELU rounds (measured largest difference 0.0014 and 0.0020 for logits of standard deviation 0.9)
    assert np.abs(got - mine).max() < 5e-3
    assert kl_mean(mine, got) < 1e-4  # issue 55's bound, nats per token
    assert np.array_equal(stz_logits(out, tokens, m / "config.json"), mine)
    back = tmp_path / "back.safetensors"
    stz("dequantize", out, "-o", back, "-q", "--dtype", "f32")
    wb, w = load_f32(back), load_f32(m / "model.safetensors")
    assert wb.keys() == w.keys()
    one = np.float32(1)
    for n in w:
        assert np.array_equal(wb[n], (w[n] + one) - one if "norm" in n else w[n]), n
    assert any(not np.array_equal(wb[n], w[n] + one) for n in w if "norm" in n)  # not 1 + w
    windowless = tmp_path / "whole.json"  # the check can fail: every layer global moves the logits
    windowless.write_text(json.dumps(dict(json.loads((m / "config.json").read_text()), sliding_window=1000)))
    assert np.abs(stz_logits(m / "model.safetensors", tokens, windowless) - mine).max() > 1e-2


@need_engine
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_padded_ffn_hugging_face(tmp_path, arch):
    """The widened FFN under Hugging Face names (Llama's q/k rows permuted,
    Qwen2's biases): the 172-wide down_proj in padded Q8_0 runs in llama.cpp
    as stz's forward pass on the quantized file, and reads back to its
    values; tune --gguf finds the down projections by these names too."""
    m = hf_dir(tmp_path, arch)
    q = m / "q.safetensors"
    stz("quantize", m / "model.safetensors", "-o", q, "-q", "--fast", "--set", "*.down_proj.weight=q8_0:pad=true")
    (m / "model.safetensors").unlink()
    q.rename(m / "model.safetensors")
    out = tmp_path / "t.gguf"
    rep = json.loads(stz("export", "--gguf", m, "-o", out, "--json").stdout)
    assert rep["ffn_widened"] == {"from": 172, "to": 192}
    tokens = [255] + np.random.default_rng(5).integers(0, 255, 63).tolist()
    got, _ = run_engine(tmp_path, out, tokens)
    mine = stz_logits(m / "model.safetensors", tokens, m / "config.json")
    # llama.cpp rounds the down projections' inputs to 8 bits: measured mean |difference| 0.0087, largest
    # 0.068, for logits of standard deviation 1.05 (this random model's top-1 has near ties)
    d = np.abs(got - mine)
    assert d.mean() < 0.02 and d.max() < 0.15 and (got.argmax(1) == mine.argmax(1)).mean() >= 0.9
    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    stz("dequantize", m / "model.safetensors", "-o", a, "--dtype", "f32", "-q")
    stz("dequantize", out, "-o", b, "--dtype", "f32", "-q")
    wa, wb = load_f32(a), load_f32(b)
    assert wa.keys() == wb.keys() and all(np.array_equal(wa[n], wb[n]) for n in wa)
    pol = tmp_path / "p.json"
    plain = hf_dir(tmp_path, arch, name="plain")
    stz("tune", plain, "--gguf", "--size", os.path.getsize(out), "-o", pol, "-q", "--no-verify", "--fast")
    down = [r for r in json.loads(pol.read_text())["rules"] if "down_proj" in r["match"]]
    assert len(down) == 2 and all(r.get("pad") for r in down if r["action"] not in ("keep", "f16")), down


@pytest.mark.parametrize("root", ["language_model.", "model.language_model."])
def test_gemma3_multimodal_checkpoint(tmp_path, root):
    """A multimodal Gemma 3 (Gemma3ForConditionalGeneration, as the 4B-27B
    ship): its text_config read with Gemma3TextConfig's defaults for the
    keys it leaves out, its language model's tensors under "language_model."
    (older transformers) or "model.language_model." (newer), the vision
    tower's left alone. It runs, and exports to the text model's GGUF, as the
    same weights in a Gemma3ForCausalLM folder do, also through `stz gguf`."""
    plain = hf_dir(tmp_path, "gemma3_text", name="plain")
    cfg = dict(json.loads((plain / "config.json").read_text()), bos_token_id=2, rms_norm_eps=1e-6)
    (plain / "config.json").write_text(json.dumps(cfg))
    mm = tmp_path / "mm"
    mm.mkdir()
    w = load_f32(plain / "model.safetensors")
    t = {root + n[len("model."):] if n.startswith("model.") else n: v for n, v in w.items()}
    if root == "language_model.":  # the older layout keeps the decoder's own "model."
        t = {"language_model." + n: v for n, v in w.items()}
    rng = np.random.default_rng(3)
    t["vision_tower.vision_model.embeddings.patch_embedding.weight"] = rng.standard_normal((32, 3, 4, 4)).astype("f4")
    t["multi_modal_projector.mm_input_projection_weight"] = rng.standard_normal((32, 64)).astype("f4")
    save(mm / "model.safetensors", t)
    text = {k: v for k, v in cfg.items() if k not in ("rope_local_base_freq", "bos_token_id", "rms_norm_eps",
                                                        "tie_word_embeddings", "model_type")}  # Gemma 3's defaults
    (mm / "config.json").write_text(json.dumps({
        "architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
        "text_config": dict(text, model_type="gemma3_text"), "vision_config": {"hidden_size": 32}}))
    shutil.copy(plain / "tokenizer.json", mm / "tokenizer.json")
    tokens = [2] + np.random.default_rng(5).integers(0, 255, 40).tolist()
    assert np.array_equal(stz_logits(mm / "model.safetensors", tokens, mm / "config.json"),
                          stz_logits(plain / "model.safetensors", tokens, plain / "config.json"))
    for d in (plain, mm):
        stz("export", "--gguf", d, "-o", tmp_path / (d.name + ".gguf"), "--name", "g", "-q")
    assert (tmp_path / "mm.gguf").read_bytes() == (tmp_path / "plain.gguf").read_bytes()
    (tmp_path / "t.json").write_text(json.dumps([tokens]))
    for d in (plain, mm):
        stz("imatrix", d, "--tokens", tmp_path / "t.json", "-o", tmp_path / (d.name + ".im.gguf"), "-q")
    assert read_gguf(tmp_path / "mm.im.gguf")[1].keys() == read_gguf(tmp_path / "plain.im.gguf")[1].keys()
    if root == "language_model.":  # the one command: the vision tower neither tuned nor counted
        for d in (plain, mm):
            stz("gguf", d, "-o", tmp_path / (d.name + ".q.gguf"), "--like", "q4_k_m", "--name", "g", "-q")
        assert (tmp_path / "mm.q.gguf").read_bytes() == (tmp_path / "plain.q.gguf").read_bytes()


@need_engine
def test_llama_cpp_runs_gpt2(tmp_path):
    """GPT-2 (issue 55): its Conv1D weights, stored (in, out), written
    transposed as llama.cpp's rows; c_attn as attn_qkv with its bias,
    LayerNorm biases, learned positions, the head tied to the embedding.
    llama.cpp's logits match stz's forward pass, also on names without
    "transformer." (GPT2Model's checkpoints)."""
    m = hf_dir(tmp_path, "gpt2")
    out = tmp_path / "t.gguf"
    assert json.loads(stz("export", "--gguf", m, "-o", out, "--name", "g", "--json").stdout)["architecture"] == "gpt2"
    kv, t = read_gguf(out)
    assert kv["gpt2.attention.layer_norm_epsilon"] == pytest.approx(1e-5) and "gpt2.rope.freq_base" not in kv
    assert kv["tokenizer.ggml.pre"] == "gpt-2" and kv["tokenizer.ggml.add_bos_token"] is False
    for name, ne in {"blk.0.attn_qkv.weight": [64, 192], "blk.0.attn_qkv.bias": [192], "blk.1.ffn_up.weight": [64, 256],
                     "blk.1.ffn_down.weight": [256, 64], "position_embd.weight": [64, 128],
                     "output_norm.bias": [64]}.items():
        assert list(t[name][0].shape)[::-1] == ne, (name, t[name][0].shape)
    assert "output.weight" not in t
    w = load_f32(m / "model.safetensors")
    bare = tmp_path / "bare"
    bare.mkdir()
    save(bare / "model.safetensors", {n.replace("transformer.", "", 1): v for n, v in w.items()})
    for f in ("config.json", "tokenizer.json"):
        shutil.copy(m / f, bare / f)
    stz("export", "--gguf", bare, "-o", tmp_path / "bare.gguf", "--name", "g", "-q")
    assert (tmp_path / "bare.gguf").read_bytes() == out.read_bytes()
    tokens = np.random.default_rng(5).integers(0, 255, 64).tolist()
    got, _ = run_engine(tmp_path, out, tokens)
    mine = stz_logits(m / "model.safetensors", tokens, m / "config.json")
    assert np.abs(got - mine).max() < 5e-3
    assert kl_mean(mine, got) < 1e-4  # issue 55's bound, nats per token
    assert np.abs(stz_logits(bare / "model.safetensors", tokens, m / "config.json") - mine).max() == 0
    assert np.array_equal(stz_logits(out, tokens, m / "config.json"), mine)  # the GGUF read as the checkpoint
    stz("dequantize", out, "-o", tmp_path / "back.safetensors", "-q", "--dtype", "f32")
    back = load_f32(tmp_path / "back.safetensors")
    assert back.keys() == w.keys() and all(np.array_equal(back[n], w[n]) for n in w)  # Conv1D (in, out) again


@need_engine
@pytest.mark.parametrize("arch", ["qwen3", "phi3", "gemma2", "gemma3_text", "gpt2"])
def test_family_one_command_in_llama_cpp(tmp_path, arch):
    """Qwen3, Phi-3, Gemma 2, Gemma 3 and GPT-2 end to end (issue 55): `stz gguf` calibrates
    (importance matrix, error feedback, tune on the model's own outputs) and
    writes a file at llama-quantize Q4_K_M's size that llama.cpp runs as
    stz's forward pass runs it, and that stz reads back to the values it
    wrote."""
    m = hf_dir(tmp_path, arch)
    out = tmp_path / "q.gguf"
    rep = json.loads(stz("gguf", m, "-o", out, "--like", "q4_k_m", "--json").stdout)
    assert rep["met"] and rep["measured_bytes"] <= rep["max_bytes"], rep
    assert any(t["choice"].endswith("+fb") for t in rep["tensors"]), rep["tensors"]  # error feedback ran
    kv, t = read_gguf(out)
    assert kv["general.architecture"] == arch.replace("gemma3_text", "gemma3")
    assert {"phi3": "blk.0.attn_qkv.weight", "gemma2": "blk.0.post_ffw_norm.weight",
            "gpt2": "blk.0.attn_qkv.bias"}.get(arch, "blk.0.attn_q_norm.weight") in t
    assert len({typ for _, typ in t.values()} - {0, 1}) >= 2  # a quantized mix, not floats
    tokens = [255] + np.random.default_rng(5).integers(0, 255, 63).tolist()
    got, _ = run_engine(tmp_path, out, tokens)
    mine = stz_logits(out, tokens, m / "config.json")
    # llama.cpp rounds the quantized matrices' inputs to 8 bits (see test_padded_ffn_hugging_face)
    d = np.abs(got - mine)
    assert d.mean() < 0.02 and d.max() < 0.15 and (got.argmax(1) == mine.argmax(1)).mean() >= 0.9, (d.mean(), d.max())
    back = tmp_path / "back.safetensors"
    stz("dequantize", out, "-o", back, "-q", "--dtype", "f32")
    w = load_f32(back)
    assert {"phi3": "model.layers.1.mlp.gate_up_proj.weight",
            "gemma2": "model.layers.1.pre_feedforward_layernorm.weight",
            "gpt2": "transformer.h.1.attn.c_attn.weight"}.get(arch, "model.layers.1.self_attn.k_norm.weight") in w
    if arch == "gpt2":  # the Conv1D weights read back (in, out), as Hugging Face's GPT-2 holds them
        assert w["transformer.h.1.attn.c_attn.weight"].shape == (64, 192), w["transformer.h.1.attn.c_attn.weight"].shape


# ---- llama.cpp's own types, chosen by stz (issue 30, item 1) ---------------------------

TYPES = ["q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "iq4_nl", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "iq4_xs"]
TYPE_NO = {"q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8, "q2_k": 10, "q3_k": 11, "q4_k": 12, "q5_k": 13,
           "q6_k": 14, "iq4_nl": 20, "iq4_xs": 23, "f16": 1, "f32": 0}


def wide_dir(tmp_path, name="w", layers=1, kv_heads=2, tied=False):
    """A Llama whose rows are all whole 256-blocks (hidden 256, ffn 512,
    vocabulary 256; one layer unless told), weights with per-row magnitudes
    and a few outliers, so that every type's blocks are exercised."""
    rng = np.random.default_rng(7)
    H, F, V, KV = 256, 512, 256, 64 * kv_heads

    def mat(r, c, s=1.0):
        w = rng.standard_normal((r, c)) * s / np.sqrt(c) * np.exp(rng.standard_normal((r, 1)) * 0.3)
        w.flat[rng.integers(0, w.size, max(1, w.size // 500))] *= 8
        return w.astype(np.float32)

    t = {"model.embed_tokens.weight": mat(V, H, 16), "model.norm.weight": np.ones(H, np.float32),
         "lm_head.weight": mat(V, H, 4)}
    for l in range(layers):
        t["model.layers.%d.input_layernorm.weight" % l] = np.ones(H, np.float32)
        t["model.layers.%d.post_attention_layernorm.weight" % l] = np.ones(H, np.float32)
        for k, (r, c) in {"self_attn.q_proj": (H, H), "self_attn.k_proj": (KV, H), "self_attn.v_proj": (KV, H),
                          "self_attn.o_proj": (H, H), "mlp.gate_proj": (F, H), "mlp.up_proj": (F, H),
                          "mlp.down_proj": (H, F)}.items():
            t["model.layers.%d.%s.weight" % (l, k)] = mat(r, c, 2)
    if tied:
        del t["lm_head.weight"]
    m = tmp_path / name
    m.mkdir()
    save(m / "model.safetensors", t)
    cfg = dict(model_type="llama", hidden_size=H, intermediate_size=F, num_attention_heads=4,
               num_key_value_heads=kv_heads, num_hidden_layers=layers, vocab_size=V, max_position_embeddings=128,
               rope_theta=10000.0, rms_norm_eps=1e-5, hidden_act="silu", bos_token_id=255, eos_token_id=255,
               tie_word_embeddings=tied)
    (m / "config.json").write_text(json.dumps(cfg))
    (m / "tokenizer.json").write_text(json.dumps(tiny_tokenizer()))
    return m


def quantize_dir(m, typ):
    """m's model quantized in place to llama.cpp's type `typ` (every matrix;
    plain rounding: what is checked is the file, not calibration)."""
    src, q = m / "model.safetensors", m / "q.safetensors"
    stz("quantize", src, "-o", q, "-q", "--fast", "--set", "*=%s" % typ)
    src.unlink()
    q.rename(src)
    return src


@need_engine
@pytest.mark.parametrize("typ", TYPES)
def test_llama_cpp_runs_every_type(tmp_path, typ):
    """Each of llama.cpp's types as stz quantizes it: the GGUF export copies
    the blocks byte for byte (nothing requantized, every matrix of the type),
    llama.cpp loads the file, and its logits match stz's forward pass on the
    same quantized weights within llama.cpp's activation rounding (8-bit
    blocks before its quantized dot products: measured mean |difference|
    0.065-0.17 for logits spanning 65-97, 0.1-0.25% of the span; top-1 the
    same at 90-100% of 64 positions of this random model, whose logits
    have near ties), far closer than to the unquantized model's where the
    type loses much (2-4 bits: 9-23x). A block layout read wrongly moves
    logits by whole units."""
    m = wide_dir(tmp_path)
    full = stz_logits(m / "model.safetensors", list(range(250, 256)) + list(range(58)), m / "config.json")
    q = quantize_dir(m, typ)
    out = tmp_path / "t.gguf"
    rep = json.loads(stz("export", "--gguf", m, "-o", out, "--json").stdout)
    assert rep["requantized"] == 0 and rep["repacked_exactly"] == 9
    kv, t = read_gguf(out)
    assert {v[1] for k, v in t.items() if v[0].ndim == 2} == {TYPE_NO[typ]}
    tokens = list(range(250, 256)) + list(range(58))
    got, _ = run_engine(tmp_path, out, tokens)
    mine = stz_logits(q, tokens, m / "config.json")
    d = np.abs(got - mine)
    spread = mine.max() - mine.min()
    assert d.mean() < 0.004 * spread and (got.argmax(1) == mine.argmax(1)).mean() >= 0.85, (d.mean(), spread)
    if typ in ("q2_k", "q3_k", "q4_0", "q4_k", "iq4_nl", "iq4_xs"):
        assert np.abs(got - full).mean() > 8 * d.mean()


@pytest.mark.parametrize("typ", TYPES)
def test_every_type_reads_back(tmp_path, typ):
    """stz dequantize of the GGUF export equals stz dequantize of the
    quantized SafeTensors it came from, element by element (the blocks are
    the same bytes, read by the same dequantizer both ways)."""
    m = wide_dir(tmp_path)
    q = quantize_dir(m, typ)
    out, back, want = tmp_path / "t.gguf", tmp_path / "back.safetensors", tmp_path / "want.safetensors"
    stz("export", "--gguf", m, "-o", out, "-q")
    stz("dequantize", q, "-o", want, "--dtype", "f32", "-q")
    stz("dequantize", out, "-o", back, "-q")
    w, b = load_f32(want), load_f32(back)
    assert sorted(w) == sorted(b)
    for name in w:
        assert np.array_equal(w[name], b[name]), name


def test_bad_ggml_entries(tmp_path):
    """A quantized file whose entry for a llama.cpp type is not what stz
    wrote is refused by name: wrong packing, bits, block_size, values shape,
    an unknown key; stz writes nothing."""
    m = wide_dir(tmp_path)
    q = quantize_dir(m, "q4_k")
    raw = q.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    head = json.loads(raw[8:8 + n])
    key = "stz.quant.model.layers.0.mlp.down_proj.weight"
    good = json.loads(head["__metadata__"][key])
    for change, msg in (({"packing": "int4-pairs-high-nibble-first"}, "unknown packing"),
                        ({"bits": 5}, "invalid stz.quant."), ({"block_size": 32}, "invalid stz.quant."),
                        ({"shape": [256, 256]}, "do not match the recorded shape"),
                        ({"scales": "x"}, "unknown key 'scales'")):
        e = dict(good, **change)
        head["__metadata__"][key] = json.dumps(e)
        h = json.dumps(head).encode()
        h += b" " * (-len(h) % 8)
        bad = tmp_path / "bad.safetensors"
        bad.write_bytes(struct.pack("<Q", len(h)) + h + raw[8 + n:])
        out = tmp_path / "o.safetensors"
        r = stz("dequantize", bad, "-o", out, ok=False)
        assert r.returncode == 1 and msg in r.stderr and "down_proj" in r.stderr, (change, r.stderr)
        assert not out.exists()


# ---- reading GGUF back (stz dequantize, stz eval) ------------------------------------

READ_TYPES = {"f32": [], "q8_0": QUANT["q8_0"], "q4_0": QUANT["q4_0"], "q5_0": QUANT["q5_0"]}


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "phi3"])
@pytest.mark.parametrize("typ", sorted(READ_TYPES))
def test_read_back_exactly(tmp_path, arch, typ):
    """`stz dequantize X.gguf` (issue 30, item 4) gives every tensor under the
    model's own Hugging Face names, q/k rows (and biases) back in Hugging
    Face's order where export permuted them for llama.cpp's RoPE, and values
    equal, element by element, to the source's: the F32 original, or the
    quantized file's own dequantization for the types stz repacks exactly."""
    m = hf_dir(tmp_path, arch)
    src = m / "model.safetensors"
    if READ_TYPES[typ]:
        q = m / "q.safetensors"
        stz("quantize", src, "-o", q, "-q", "--fast", *READ_TYPES[typ])
        (m / "model.safetensors").unlink()
        q.rename(src)
        want = tmp_path / "want.safetensors"
        stz("dequantize", src, "-o", want, "--dtype", "f32", "-q")
    else:
        want = src
    out = tmp_path / "m.gguf"
    rep = json.loads(stz("export", "--gguf", m, "-o", out, "--json").stdout)
    assert rep["requantized"] == 0
    back = tmp_path / "back.safetensors"
    stz("dequantize", out, "-o", back, "-q")
    w, b = load_f32(want), load_f32(back)
    assert sorted(w) == sorted(b)
    for name in w:
        assert np.array_equal(w[name], b[name]), name
    # llama2.c names, and GGUF's own
    q = "qkv" if arch == "phi3" else "q"
    for names, key in (("llama2c", "layers.0.attention.w%s.weight" % q), ("gguf", "blk.0.attn_%s.weight" % q)):
        stz("dequantize", out, "-o", back, "-f", "-q", "--names", names)
        assert key in load_f32(back)


@need_data
def test_eval_reads_gguf(tmp_path):
    """stz eval and eval --forward take a GGUF candidate, named as the
    original (llama2.c's here): the same figures as for the quantized file
    it was exported from, bit for bit."""
    q = quantized(tmp_path, "q4_0")
    g = tmp_path / "q.gguf"
    stz("export", "--gguf", q, "--tokenizer", TOK, "-o", g, "-q")
    per = [json.loads(stz("eval", F32, c, "--json").stdout) for c in (q, g)]
    assert per[0]["tensors_compared"] == per[1]["tensors_compared"] == 47
    assert [(t["name"], t["cosine"], t["max_abs_error"]) for t in per[0]["tensors"]] == \
           [(t["name"], t["cosine"], t["max_abs_error"]) for t in per[1]["tensors"]]
    fwd = [json.loads(stz("eval", "--forward", F32, c, "--json", "--sequences", "2", "--seq-len", "32").stdout)
           for c in (q, g)]
    assert fwd[0]["kl"] == fwd[1]["kl"] and fwd[0]["top1_agreement"] == fwd[1]["top1_agreement"]


def test_gguf_types_not_read_yet(tmp_path):
    """A GGUF tensor of a type stz cannot decode is refused by name and
    type; nothing is written; a wrong --names is a usage error."""
    g = tmp_path / "k.gguf"
    g.write_bytes(gguf_bytes([], [(b"blk.0.ffn_down.weight", 15, 256, 3, 3 * 292)]))  # q8_k
    out = tmp_path / "o.safetensors"
    r = stz("dequantize", g, "-o", out, ok=False)
    assert r.returncode == 1 and ("tensor 'blk.0.ffn_down.weight': ggml type q8_k cannot be read: stz has no decoder "
                                  "for it") in r.stderr
    assert not out.exists()
    r = stz("dequantize", g, "-o", out, "--names", "tf", ok=False)
    assert r.returncode == 2 and "--names takes hf, llama2c or gguf" in r.stderr
    # rows of 2^40 elements (none of them, so the file holds it) beside a real tensor: refused, not allocated
    g.write_bytes(gguf_bytes([], [(b"a.weight", 0, 1 << 40, 0, 0), (b"b.weight", 0, 32, 2, 256)]))
    r = stz("dequantize", g, "-o", out, ok=False)
    assert r.returncode == 1 and "tensor 'a.weight': 0 rows of 1099511627776 elements, beyond what stz reads" in r.stderr
    assert not out.exists()


def test_super_blocks_read(tmp_path):
    """A Q6_K tensor (super-blocks of 256; what llama-quantize's mixes put
    on the output head and some ffn_down) read through the file: d = 1,
    every sub-block scale 1 and every 6-bit code 5 give 5 - 32 = -27
    everywhere, in the tensor's shape and under Hugging Face's name."""
    g = tmp_path / "k.gguf"
    block = bytes([0x55] * 128) + bytes(64) + bytes([1] * 16) + struct.pack("<H", 0x3C00)
    img = gguf_bytes([(b"general.architecture", b"qwen2")], [(b"blk.0.ffn_down.weight", 14, 512, 3, 6 * 210)])
    g.write_bytes(img[:len(img) - 6 * 210 - (-6 * 210 % 32)] + block * 6 + bytes(-6 * 210 % 32))
    out = tmp_path / "o.safetensors"
    stz("dequantize", g, "-o", out, "-q")
    w = load_f32(out)
    assert list(w) == ["model.layers.0.mlp.down_proj.weight"]
    v = w["model.layers.0.mlp.down_proj.weight"]
    assert v.shape == (3, 512) and np.all(v == -27.0)


# ---- types stz reads but does not write: the ternary and FP4 types ----------------------

READ_ONLY = {"tq1_0": (34, 256, 54), "tq2_0": (35, 256, 66), "mxfp4": (39, 32, 17), "nvfp4": (40, 64, 36)}
FP4 = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], np.float32)  # E2M1, doubled


def f16_bytes(v):
    return np.asarray(v, np.float16).view(np.uint8).reshape(-1, 2)


def read_only_blocks(typ, nblocks, rng, scale):
    """nblocks blocks of `typ` as ggml's encoders lay them out, random codes,
    values about `scale` in magnitude."""
    if typ in ("tq1_0", "tq2_0"):
        t = rng.integers(0, 3, (nblocks, 256))  # -1, 0, 1 as 0, 1, 2
        d = f16_bytes(rng.uniform(1.0, 1.5, nblocks) * scale)
        if typ == "tq2_0":  # element e: bits 2 ((e % 128) / 32) of byte 32 (e / 128) + e % 32
            qs = np.zeros((nblocks, 64), np.uint8)
            for e in range(256):
                qs[:, 32 * (e // 128) + e % 32] |= (t[:, e] << (2 * ((e % 128) // 32))).astype(np.uint8)
            return np.concatenate([qs, d], 1)

        def pack(digits, extra=0):  # trits read as a base-3 fraction, first the most significant: ceil(v 256 / 243)
            v = np.zeros(digits[0].shape, np.int64)
            for g in digits:
                v = v * 3 + g
            return ((v * 3 ** extra * 256 + 242) // 243).astype(np.uint8)
        return np.concatenate([pack([t[:, 32 * k:32 * k + 32] for k in range(5)]),
                               pack([t[:, 160 + 16 * k:176 + 16 * k] for k in range(5)]),
                               pack([t[:, 240 + 4 * k:244 + 4 * k] for k in range(4)], extra=1), d], 1)
    per = READ_ONLY[typ][1]
    qs = rng.integers(0, 256, (nblocks, per // 2), dtype=np.uint8)
    if typ == "mxfp4":  # E8M0: 2^(e - 127), halved for the doubled levels
        e = np.round(np.log2(scale / 4) + 128 + rng.integers(-1, 2, (nblocks, 1))).astype(np.uint8)
        return np.concatenate([e, qs], 1)
    # nvfp4: a UE4M3 scale per 16 (bias 7, 3 mantissa bits), halved
    ex = np.clip(np.round(np.log2(scale / 2) + 7), 1, 14).astype(np.uint8)
    return np.concatenate([(ex << 3) | rng.integers(0, 8, (nblocks, 4), dtype=np.uint8), qs], 1)


def decode_read_only(typ, raw, n):
    """ggml's values of n elements of `typ`, written from the block layouts."""
    _, per, nb = READ_ONLY[typ]
    blk = np.asarray(raw, np.uint8).reshape(-1, nb)
    if typ in ("tq1_0", "tq2_0"):
        d = blk[:, nb - 2:].copy().view("<f2").astype(np.float32)
        if typ == "tq2_0":
            e = np.arange(256)
            t = (blk[:, 32 * (e // 128) + e % 32] >> (2 * ((e % 128) // 32))) & 3
        else:
            def digit(b, k):  # trit k of a byte: the integer part of 3 frac(b 3^k / 256)
                return ((b.astype(np.int64) * 3 ** k % 256) * 3) >> 8
            t = np.concatenate([digit(blk[:, :32], k) for k in range(5)] + [digit(blk[:, 32:48], k) for k in range(5)] +
                               [digit(blk[:, 48:52], k) for k in range(4)], 1)
        return ((t.astype(np.float32) - 1) * d).reshape(n)
    if typ == "mxfp4":
        d = np.ldexp(np.float32(1), blk[:, :1].astype(np.int32) - 128).astype(np.float32)
        return (FP4[np.concatenate([blk[:, 1:] & 15, blk[:, 1:] >> 4], 1)] * d).reshape(n)
    out = np.empty((len(blk), 64), np.float32)
    for s in range(4):
        c = blk[:, s].astype(np.int32)
        ex, man = (c >> 3) & 15, c & 7
        d = np.where(ex > 0, np.ldexp(1 + man / 8.0, ex - 7), np.ldexp(man.astype(np.float64), -9)) * 0.5
        d[(c == 0) | (c == 0x7F)] = 0
        q = blk[:, 4 + 8 * s:12 + 8 * s]
        out[:, 16 * s:16 * s + 16] = FP4[np.concatenate([q & 15, q >> 4], 1)] * d[:, None].astype(np.float32)
    return out.reshape(n)


@pytest.mark.parametrize("typ", sorted(READ_ONLY))
def test_read_only_types(tmp_path, typ):
    """llama.cpp's ternary (TQ1_0, TQ2_0) and FP4 (MXFP4, NVFP4) types, which
    llama-quantize writes and stz does not: `stz dequantize` gives exactly
    the values of an independent decoder written from their block layouts,
    for every code and scale the blocks hold (random ones, trits packed as
    ggml's encoder packs them)."""
    code, per, nb = READ_ONLY[typ]
    rng = np.random.default_rng(code)
    rows, cols = 3, 512
    blocks = read_only_blocks(typ, rows * cols // per, rng, 0.05)
    if typ == "tq1_0":  # any byte decodes: the ones ggml's encoder never writes too
        blocks[0, :52] = np.arange(256 - 52, 256)
    img = gguf_bytes([(b"general.architecture", b"qwen2")], [(b"blk.0.ffn_down.weight", code, cols, rows, blocks.size)])
    g = tmp_path / "t.gguf"
    g.write_bytes(img[:len(img) - (blocks.size + 31) // 32 * 32] + blocks.tobytes() + bytes(-blocks.size % 32))
    out = tmp_path / "o.safetensors"
    stz("dequantize", g, "-o", out, "-q")
    v = load_f32(out)["model.layers.0.mlp.down_proj.weight"]
    want = decode_read_only(typ, blocks, rows * cols).reshape(rows, cols)
    assert v.shape == (rows, cols) and np.array_equal(v, want)
    assert len(np.unique(v)) > (2 if typ.startswith("tq") else 20)


def retype_gguf(src, dst, typ, rng, lib=None):
    """src's GGUF with every matrix but the token embedding replaced by
    blocks of `typ` holding values of about 1 / sqrt(columns): random
    blocks packed as ggml's encoders pack them, or for the types decoded
    through llama.cpp's library `lib`, random values quantized by it."""
    b = src.read_bytes()
    _, infos, keys_end, data = parse_gguf(b)
    head, body = bytearray(b[:keys_end]), bytearray()
    for name, ne, t, off in infos:
        if len(ne) == 2 and name != "token_embd.weight":
            scale = 1.5 / np.sqrt(ne[0])
            if typ in LIB_TYPES:
                raw, t = ggml_quantize(lib, typ, rng.standard_normal((ne[1], ne[0])) * scale), LIB_TYPES[typ][0]
            else:
                code, per, _ = READ_ONLY[typ]
                raw, t = read_only_blocks(typ, ne[0] * ne[1] // per, rng, scale).tobytes(), code
        else:
            raw = b[data + off:data + off + int(np.prod(ne)) // BLOCK[t][0] * BLOCK[t][1]]
        head += struct.pack("<Q", len(name)) + name.encode() + struct.pack("<I", len(ne))
        head += struct.pack("<%dQIQ" % len(ne), *ne, t, len(body))
        body += raw + bytes(-len(raw) % 32)
    dst.write_bytes(bytes(head) + bytes(-len(head) % 32) + bytes(body))


# ---- the types decoded through llama.cpp's own library ----------------------------

LIB_TYPES = {"iq2_xxs": (16, 66), "iq2_xs": (17, 74), "iq3_xxs": (18, 98), "iq1_s": (19, 50), "iq3_s": (21, 110),
             "iq2_s": (22, 82), "iq1_m": (29, 56)}  # ggml's number, bytes per block of 256


def ggml_lib():
    """llama.cpp's libggml-base from node-llama-cpp's build, or None."""
    if engine() is None:
        return None
    found = glob.glob(os.path.join(NODE_DIR, "node_modules", "@node-llama-cpp", "*", "bins", "*", "libggml-base.so"))
    return found[0] if found else None


need_lib = pytest.mark.skipif(ggml_lib() is None, reason="no llama.cpp library (node-llama-cpp not installable)")


class GgmlTraits(ctypes.Structure):  # the leading fields of ggml.h's struct ggml_type_traits
    _fields_ = [("type_name", ctypes.c_char_p), ("blck_size", ctypes.c_int64), ("blck_size_interleave", ctypes.c_int64),
                ("type_size", ctypes.c_size_t), ("is_quantized", ctypes.c_bool),
                ("to_float", ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64))]


def ggml_quantize(lib, typ, x):
    """x (rows, cols) quantized to typ by ggml itself (importance 1), as bytes."""
    g = ctypes.CDLL(lib)
    g.ggml_quantize_chunk.restype = ctypes.c_size_t
    g.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                                      ctypes.c_int64, ctypes.c_void_p]
    x = np.ascontiguousarray(x, np.float32)
    rows, cols = x.shape
    out, imatrix = np.zeros(rows * cols // 256 * LIB_TYPES[typ][1], np.uint8), np.ones(cols, np.float32)
    assert g.ggml_quantize_chunk(LIB_TYPES[typ][0], x.ctypes.data, out.ctypes.data, 0, rows, cols,
                                 imatrix.ctypes.data) == out.size
    return out.tobytes()


def ggml_to_float(lib, typ, raw, n):
    """ggml's own values of n elements of typ's blocks raw."""
    g = ctypes.CDLL(lib)
    g.ggml_get_type_traits.restype, g.ggml_get_type_traits.argtypes = ctypes.POINTER(GgmlTraits), [ctypes.c_int]
    src, y = np.frombuffer(raw, np.uint8).copy(), np.zeros(n, np.float32)
    g.ggml_get_type_traits(LIB_TYPES[typ][0]).contents.to_float(src.ctypes.data, y.ctypes.data, n)
    return y


@need_lib
@pytest.mark.parametrize("typ", sorted(LIB_TYPES))
def test_codebook_types_read_through_llama_cpp(tmp_path, typ):
    """The IQ1-IQ3 types (values from ggml's codebook tables, which stz
    does not copy) are read through the libggml-base STZ_GGML_LIB names:
    every matrix equals ggml's to_float of its blocks, bit for bit (GGUF
    names, rows as stored), the embedding and norms as before."""
    lib = ggml_lib()
    m = wide_dir(tmp_path)
    f32, g, back = tmp_path / "f.gguf", tmp_path / "t.gguf", tmp_path / "back.safetensors"
    stz("export", "--gguf", m, "-o", f32, "-q")
    retype_gguf(f32, g, typ, np.random.default_rng(LIB_TYPES[typ][0]), lib)
    stz("dequantize", g, "-o", back, "--names", "gguf", "-q", env={"STZ_GGML_LIB": lib})
    b, got, seen = g.read_bytes(), load_f32(back), 0
    _, infos, _, data = parse_gguf(b)
    for name, ne, t, off in infos:
        if t == LIB_TYPES[typ][0]:
            raw = b[data + off:data + off + ne[0] * ne[1] // 256 * LIB_TYPES[typ][1]]
            want = ggml_to_float(lib, typ, raw, ne[0] * ne[1]).reshape(ne[1], ne[0])
            assert np.array_equal(got[name], want) and np.abs(want).max() > 0, name
            seen += 1
        elif t == 0:
            assert np.array_equal(got[name].ravel(), np.frombuffer(b[data + off:data + off + 4 * int(np.prod(ne))],
                                                                   np.float32)), name
    assert seen == 8  # the layer's seven matrices and the head


def test_codebook_types_need_llama_cpp(tmp_path):
    """Without a usable libggml-base the IQ1-IQ3 types are refused, naming
    the tensor, the type and what is missing: none loaded (STZ_GGML_LIB
    empty), a path that does not load, a library that is not ggml's, and
    one whose traits do not describe the type as ggml-common.h does."""
    g, out = tmp_path / "k.gguf", tmp_path / "o.safetensors"
    g.write_bytes(gguf_bytes([], [(b"blk.0.ffn_down.weight", 16, 256, 3, 3 * 66)]))  # iq2_xxs
    cases = [("", "STZ_GGML_LIB is empty, so none is loaded"),
             (str(tmp_path / "none.so"), "STZ_GGML_LIB=%s cannot be loaded" % (tmp_path / "none.so"))]
    zstd = ctypes.util.find_library("zstd")
    if zstd:
        cases.append((zstd, "%s has no ggml_get_type_traits" % zstd))
    if shutil.which("cc"):
        fake_ggml_lib(tmp_path / "fake.so")
        cases.append((str(tmp_path / "fake.so"), "%s does not describe iq2_xxs as ggml-common.h does (blocks of 256 "
                      "elements in 66 bytes)" % (tmp_path / "fake.so")))
    for lib, why in cases:
        r = stz("dequantize", g, "-o", out, ok=False, env={"STZ_GGML_LIB": lib})
        assert r.returncode == 1, r.stderr
        assert ("tensor 'blk.0.ffn_down.weight': ggml type iq2_xxs cannot be read: its values come from ggml's "
                "codebook tables, which stz takes from llama.cpp's libggml-base: " + why) in r.stderr, r.stderr
        assert not out.exists()


@need_engine
@pytest.mark.parametrize("typ", ["tq1_0", "tq2_0", "mxfp4"] + sorted(LIB_TYPES))
def test_llama_cpp_reads_like_stz(tmp_path, typ):
    """A model whose matrices are in a type stz reads but does not write
    (the IQ1-IQ3 ones through llama.cpp's library): llama.cpp's logits match
    stz's forward pass on `stz dequantize` of the same file within
    llama.cpp's activation rounding (the tolerance of
    test_llama_cpp_runs_every_type), and are far from the model's before
    its matrices were replaced. (NVFP4 is newer than the pinned engine.)"""
    lib = ggml_lib() if typ in LIB_TYPES else None
    if typ in LIB_TYPES and not lib:
        pytest.skip("no libggml-base in node-llama-cpp's build")
    m = wide_dir(tmp_path)
    f32, g, back = tmp_path / "f.gguf", tmp_path / "t.gguf", tmp_path / "back.safetensors"
    stz("export", "--gguf", m, "-o", f32, "-q")
    retype_gguf(f32, g, typ, np.random.default_rng((LIB_TYPES.get(typ) or READ_ONLY[typ])[0]), lib)
    stz("dequantize", g, "-o", back, "-q", env={"STZ_GGML_LIB": lib} if lib else None)
    tokens = list(range(250, 256)) + list(range(58))
    got, _ = run_engine(tmp_path, g, tokens)
    mine = stz_logits(back, tokens, m / "config.json")
    before = stz_logits(m / "model.safetensors", tokens, m / "config.json")
    d = np.abs(got - mine)
    spread = mine.max() - mine.min()
    assert d.mean() < 0.004 * spread and (got.argmax(1) == mine.argmax(1)).mean() >= 0.85, (d.mean(), spread)
    assert np.abs(got - before).mean() > 8 * d.mean()


# ---- stz tune --gguf ----------------------------------------------------------------

BLOCK_OF = {t: (256 if t.endswith("_k") or t == "iq4_xs" else 32) for t in TYPES}
BLOCK_OF.update(f16=1, f32=1)
NO_TYPE = {v: k for k, v in TYPE_NO.items()}


@need_data
def test_tune_gguf_no_pad(tmp_path):
    """--no-pad: the down projections only in what takes their 172-wide rows
    whole (keep, f16), so the FFN keeps its width; without it the same
    budget pads them."""
    for flag, padded in (("--no-pad", 0), (None, 5)):
        pol = tmp_path / "p.json"
        stz("tune", F32, "--gguf", "--size", 258816, "--tokenizer", TOK, "-o", pol, "-q", "-f", "--no-verify",
            "--fast", *([flag] if flag else []))
        rules = json.loads(pol.read_text())["rules"]
        down = [r for r in rules if "w2" in r["match"]]
        assert len(down) == 5 and sum(r.get("pad", False) for r in down) == padded, down
        assert all(r["action"] in ("keep", "f16") for r in down) == (not padded), down


@need_data
@pytest.mark.parametrize("budget,fast", [("258816", []), ("300000", ["--fast"])])
def test_tune_gguf_file(tmp_path, budget, fast):
    """compress --tune --gguf writes the GGUF: no larger than the budget,
    its bytes predicted exactly (the widened FFN's zero units and key
    included), every matrix in a type its row length allows (no
    super-block type on these 64- and 172-wide rows; the 172-wide ffn_down
    in F16/F32, or in padded 32-blocks with the FFN widened to 192), the
    verified KL the one stz eval measures on the file; the policy saved
    quantizes and exports to the same file byte for byte, with no
    --requantize: calibrated, and with --fast (its rules say "feedback":
    false, which the calibrated default of quantize keeps)."""
    g, pol = tmp_path / "t.gguf", tmp_path / "p.json"
    rep = json.loads(stz("compress", F32, "--tune", "--gguf", "--size", budget, "--tokenizer", TOK, "--name", "s",
                         "-o", g, "--save-policy", pol, "--json", *fast).stdout)
    size = os.path.getsize(g)
    assert size == rep["measured_bytes"] <= int(budget) and rep["predicted_bytes"] == size
    kv, t = read_gguf(g)
    types = {NO_TYPE[typ] for v, typ in t.values() if v.ndim == 2}
    assert len(types) >= 2, types  # a mix, not one type
    wide = kv["llama.feed_forward_length"] == 192
    assert wide == any(typ not in (0, 1) for n, (v, typ) in t.items() if "ffn_down" in n)
    assert kv.get("stz.feed_forward_length") == (172 if wide else None)
    for name, (v, typ) in t.items():
        if name.endswith(".weight") and v.ndim == 2 and typ not in (0, 1):
            cols = v.shape[1] if typ in DECODED else v.shape[1] // BLOCK[typ][1] * BLOCK[typ][0]
            assert cols % BLOCK_OF[NO_TYPE[typ]] == 0 and cols == (192 if "ffn_down" in name else 64), name
            assert BLOCK_OF[NO_TYPE[typ]] == 32 or "ffn_down" not in name, name
        if "ffn_gate" in name or "ffn_up" in name:
            assert v.shape[0] == (192 if wide else 172) and not v[172:].any(), name
    ev = json.loads(stz("eval", "--forward", F32, g, "--sequences", "4", "--seq-len", "64", "--json").stdout)
    assert ev["kl"]["mean"] == pytest.approx(rep["measured_kl"], rel=1e-9)
    q, again = tmp_path / "q.safetensors", tmp_path / "again.gguf"
    stz("quantize", F32, "--policy", pol, "-o", q, "-q")
    stz("export", "--gguf", q, "--tokenizer", TOK, "--name", "s", "-o", again, "-q")
    assert open(again, "rb").read() == open(g, "rb").read()


@pytest.mark.parametrize("cands", ["keep,q4_k,q8_0", "keep,q6_k"])
def test_tune_gguf_row_lengths(tmp_path, cands):
    """A type is offered only to the matrices whose rows are whole blocks of
    it: on a model with 256-wide and 64-wide rows, q4_k/q6_k go to the
    256-wide ones only, whatever the budget asks."""
    m = wide_dir(tmp_path)
    d = json.loads((m / "config.json").read_text())
    d.update(hidden_size=64, num_attention_heads=2, num_key_value_heads=1, intermediate_size=256)
    (m / "config.json").write_text(json.dumps(d))
    rng = np.random.default_rng(3)
    t = {"model.embed_tokens.weight": (256, 64), "lm_head.weight": (256, 64), "model.norm.weight": (64,),
         "model.layers.0.input_layernorm.weight": (64,), "model.layers.0.post_attention_layernorm.weight": (64,),
         "model.layers.0.self_attn.q_proj.weight": (64, 64), "model.layers.0.self_attn.k_proj.weight": (32, 64),
         "model.layers.0.self_attn.v_proj.weight": (32, 64), "model.layers.0.self_attn.o_proj.weight": (64, 64),
         "model.layers.0.mlp.gate_proj.weight": (256, 64), "model.layers.0.mlp.up_proj.weight": (256, 64),
         "model.layers.0.mlp.down_proj.weight": (64, 256)}
    save(m / "model.safetensors", {k: (rng.standard_normal(s) / 8).astype(np.float32) for k, s in t.items()})
    r = json.loads(stz("tune", m, "--gguf", "--fast", "--candidates", cands, "--max-kl", "1", "-o",
                       tmp_path / "p.json", "--json", "--sequences", "2", "--seq-len", "16").stdout)
    chosen = {e["name"]: e["choice"] for e in r["tensors"]}
    assert chosen["model.layers.0.mlp.down_proj.weight"].endswith("_k")  # the 256-wide rows take the k type
    for name, c in chosen.items():
        if c.endswith("_k"):
            assert name.endswith("down_proj.weight"), (name, c)
    assert r["measured_bytes"] == r["predicted_bytes"]


def test_tune_gguf_refusals(tmp_path):
    """--gguf takes only keep and llama.cpp's types as candidates (an stz
    format GGUF cannot hold is refused by name before any work);
    --tokenizer is for --gguf."""
    m = wide_dir(tmp_path)
    r = stz("tune", m, "--gguf", "--candidates", "keep,4:nl:32:U8", "--size", "1M", "-o", tmp_path / "p.json",
            ok=False)
    assert r.returncode == 1 and "candidate '4:nl:32:U8' is not a type GGUF holds" in r.stderr
    assert not (tmp_path / "p.json").exists()
    r = stz("tune", m, "--tokenizer", TOK, "--size", "1M", ok=False)
    assert r.returncode == 2 and "--tokenizer, --name and --pad-vocab are for --gguf" in r.stderr


# ---- stz gguf: the one command ---------------------------------------------------------

LLAMA_FTYPE = {"q4_0": 2, "q4_1": 3, "q8_0": 7, "q5_0": 8, "q5_1": 9, "q2_k": 10, "q3_k_s": 11, "q3_k_m": 12,
               "q3_k_l": 13, "q4_k_s": 14, "q4_k_m": 15, "q5_k_s": 16, "q5_k_m": 17, "q6_k": 18, "iq4_nl": 25,
               "iq4_xs": 30}


class QuantizeParams(ctypes.Structure):  # llama.h's llama_model_quantize_params: its leading fields, then room
    _fields_ = [("nthread", ctypes.c_int32), ("ftype", ctypes.c_int32), ("rest", ctypes.c_char * 248)]


def llama_quantize(src, dst, ftype):
    """llama.cpp's own llama_model_quantize (node-llama-cpp's libllama), no
    importance matrix: 0 when it wrote dst."""
    d = os.path.dirname(ggml_lib())
    for so in ["libggml-base.so"] + glob.glob(os.path.join(d, "libggml.v*.so")):
        ctypes.CDLL(os.path.join(d, so), mode=ctypes.RTLD_GLOBAL)
    lib = ctypes.CDLL(glob.glob(os.path.join(d, "libllama.v*.so"))[0])
    lib.llama_model_quantize_default_params.restype = QuantizeParams
    lib.llama_model_quantize.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(QuantizeParams)]
    lib.llama_backend_init()
    p = lib.llama_model_quantize_default_params()
    p.ftype, p.nthread = LLAMA_FTYPE[ftype], 1
    return lib.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(p))


@need_lib
@pytest.mark.parametrize("shape", [dict(), dict(layers=8, kv_heads=1, tied=True)])
def test_like_sizes_are_llama_quantize(tmp_path, shape):
    """The sizes stz computes for llama-quantize's types (its per-tensor
    rules: the head in Q6_K, attn_v and ffn_down in more bits on chosen
    layers, the GQA rules, a tied embedding as the head) are the bytes
    llama.cpp's own quantizer writes from the same F32 GGUF, for every
    type, on one layer and on eight with a tied embedding and 4 query
    heads per key head."""
    m = wide_dir(tmp_path, **shape)
    f32 = tmp_path / "f32.gguf"
    like = json.loads(stz("export", "--gguf", m, "-o", f32, "--json").stdout)["llama_quantize_bytes"]
    assert sorted(like) == sorted(LLAMA_FTYPE)
    for name in LLAMA_FTYPE:
        out = tmp_path / (name + ".gguf")
        assert llama_quantize(f32, out, name) == 0, name
        assert os.path.getsize(out) == like[name], name


@need_lib
@pytest.mark.parametrize("shape", [dict(), dict(layers=8, kv_heads=1, tied=True)])
def test_type_mix_is_llama_quantize(tmp_path, shape):
    """export --type MIX gives every tensor the type llama-quantize's own
    mix gives it from the same F32 GGUF (same names, types, file_type and
    file size); a plain type keeps its meaning, and an unknown name lists
    the mixes."""
    m = wide_dir(tmp_path, **shape)
    f32 = tmp_path / "f32.gguf"
    stz("export", "--gguf", m, "-o", f32, "-q")
    for mix in ["q3_k_s", "q3_k_m", "q3_k_l", "q4_k_s", "q4_k_m", "q5_k_s", "q5_k_m"]:
        ref, out = tmp_path / ("ref." + mix), tmp_path / ("stz." + mix)
        assert llama_quantize(f32, ref, mix) == 0, mix
        stz("export", "--gguf", m, "-o", out, "--type", mix, "-q")
        (kr, ir, _, _), (ks, is_, _, _) = [parse_gguf(open(f, "rb").read()) for f in (ref, out)]
        assert {n: t for n, _, t, _ in is_} == {n: t for n, _, t, _ in ir}, mix
        assert ks["general.file_type"] == kr["general.file_type"] == LLAMA_FTYPE[mix]
        assert os.path.getsize(out) == os.path.getsize(ref), mix
    r = stz("export", "--gguf", m, "-o", tmp_path / "x.gguf", "--type", "q4_k_x", ok=False)
    assert r.returncode == 2 and "a mix of llama-quantize's: q3_k_s, q3_k_m" in r.stderr and "q5_k_m, not 'q4_k_x'" in r.stderr


@need_data
def test_like_impossible_refused(tmp_path):
    """stories260K's 172-wide down projections: llama-quantize cannot make
    its 32-block types of it ("Unsupported tensor size"), so --like q4_0
    is refused before any work, naming why; a name it does not know lists
    the ones it does."""
    g = tmp_path / "g.gguf"
    r = stz("gguf", F32, "--like", "q4_0", "--tokenizer", TOK, "-o", g, ok=False)
    assert r.returncode == 1 and "llama-quantize q4_0 cannot make a file of this model" in r.stderr
    r = stz("gguf", F32, "--like", "q4_k_x", "--tokenizer", TOK, "-o", g, ok=False)
    assert r.returncode == 1 and "q4_0, q4_1, q5_0" in r.stderr and "q4_k_m" in r.stderr
    assert not g.exists()


@need_data
def test_budget_explained(tmp_path):
    """A bits-per-weight budget below the smallest file: exit 3, nothing
    written, the smallest file named with its fixed parts and its bits per
    weight both ways; with --no-pad, the down projections no block type
    takes are counted."""
    g = tmp_path / "g.gguf"
    r = stz("gguf", F32, "--bits-per-weight", "4.5", "--tokenizer", TOK, "-o", g, "--no-pad", "--fast", ok=False)
    assert r.returncode == 3 and not g.exists()
    assert "the smallest GGUF file these candidates make is" in r.stderr
    assert "of header and vocabulary" in r.stderr and "over the tensors' data" in r.stderr
    assert "5 of them" in r.stderr and "rows are whole blocks of no type offered" in r.stderr


def test_progress_lines(tmp_path):
    """--progress: every stage as plain lines on stderr (no terminal
    needed), items counted as items; -q: none."""
    m = wide_dir(tmp_path)
    r = stz("gguf", m, "--like", "q4_k_m", "-o", tmp_path / "g.gguf", "--progress")
    lines = r.stderr.splitlines()
    assert "\r" not in r.stderr
    for stage in ("sampling", "tune: measure candidates", "tune: feedback", "tune: sensitivity", "feedback",
                  "tune: verify, forward"):
        assert any(re.match(r"%s [0-9,.]+( [kMG]?B)? / [0-9,.]+( [kMG]?B)?  +100%%" % re.escape(stage), l)
                   for l in lines), (stage, lines)
    assert any(re.match(r"tune: sensitivity [0-9,]+ / [0-9,]+ ", l) for l in lines)  # counted, not bytes
    q = stz("gguf", m, "--like", "q4_k_m", "-o", tmp_path / "q.gguf", "--progress", "-q")
    assert q.stderr == ""


def test_gguf_usage(tmp_path):
    """stz gguf calibrates, verifies and writes the GGUF itself: tune's
    --feedback, --no-verify, --gguf and --tune are refused; tune takes no
    --like or --fast; -o is required."""
    m = wide_dir(tmp_path)
    for extra in (["--feedback"], ["--no-verify"], ["--ratio", "4"]):
        r = stz("gguf", m, "--like", "q4_k_m", "-o", tmp_path / "g.gguf", *extra, ok=False)
        assert r.returncode == 2 and extra[0] in r.stderr, r.stderr
    r = stz("gguf", m, "--like", "q4_k_m", ok=False)
    assert r.returncode == 2 and "give -o OUT.gguf" in r.stderr
    r = stz("tune", m, "--like", "q4_k_m", ok=False)
    assert r.returncode == 2 and "see stz gguf" in r.stderr


@need_lib
def test_gguf_like_q4_k_m(tmp_path):
    """The one command at llama.cpp's Q4_K_M size of an eight-layer model:
    no larger than llama.cpp's own file, its bits per weight stated both
    ways, calibrated (the policy says so), lower KL than --fast at the same
    budget and than llama.cpp's Q4_K_M file itself; llama.cpp runs it."""
    m = wide_dir(tmp_path, layers=8, kv_heads=1)
    f32, ref = tmp_path / "f32.gguf", tmp_path / "ref.gguf"
    stz("export", "--gguf", m, "-o", f32, "-q")
    assert llama_quantize(f32, ref, "q4_k_m") == 0
    runs = {}
    for mode in ("calibrated", "fast"):
        g, pol = tmp_path / (mode + ".gguf"), tmp_path / (mode + ".json")
        runs[mode] = json.loads(stz("gguf", m, "--like", "q4_k_m", "-o", g, "--save-policy", pol, "--json",
                                    *(["--fast"] if mode == "fast" else [])).stdout)
        r = runs[mode]
        assert os.path.getsize(g) == r["measured_bytes"] <= os.path.getsize(ref)
        assert r["like"] == "q4_k_m" and r["llama_quantize_bytes"]["q4_k_m"] == os.path.getsize(ref)
        data = (r["measured_bytes"] - r["header_bytes"]) * 8
        params = sum(e["params"] for e in r["tensors"])
        assert r["bits_per_weight"] == pytest.approx(data / params)
        assert r["file_bits_per_weight"] == pytest.approx(r["measured_bytes"] * 8 / params)
        assert ("importance:" in json.loads(pol.read_text())["description"]) == (mode == "calibrated")
    ev = json.loads(stz("eval", "--forward", m, ref, "--sequences", "4", "--seq-len", "64", "--json").stdout)
    assert runs["calibrated"]["measured_kl"] < runs["fast"]["measured_kl"], runs
    assert runs["calibrated"]["measured_kl"] < ev["kl"]["mean"], (runs["calibrated"]["measured_kl"], ev["kl"])
    if engine():
        run_engine(tmp_path, tmp_path / "calibrated.gguf", [255] + list(range(40)))


@need_engine
def test_gguf_from_generated_folder(tmp_path):
    """stz synth --shards writes a Hugging Face folder with model_type and a
    byte-level tokenizer.json covering the vocabulary; stz gguf takes the
    folder as it is (config and tokenizer found beside the shards) and
    llama.cpp runs the file, its tokenizer merging the words."""
    m = tmp_path / "m"
    stz("synth", "tiny", "--dtype", "f32", "--shards", "2", "-o", m, "-q")
    cfg = json.loads((m / "config.json").read_text())
    assert cfg["model_type"] == "qwen2" and cfg["eos_token_id"] == 255
    tok = json.loads((m / "tokenizer.json").read_text())
    assert len(tok["model"]["vocab"]) + len(tok["added_tokens"]) == cfg["vocab_size"]
    g = tmp_path / "m.gguf"
    r = json.loads(stz("gguf", m, "--like", "q4_k_m", "-o", g, "--json").stdout)
    assert os.path.getsize(g) == r["measured_bytes"] <= r["llama_quantize_bytes"]["q4_k_m"]
    _, o = run_engine(tmp_path, g, [255] + list(range(20)), text="abc")
    assert len(o["tokenized"]) >= 1


def test_generated_tokenizer_sizes(tmp_path):
    """Every generated architecture's folder: a tokenizer whose ids are
    exactly 0 .. vocab_size - 1 (words past the byte symbols, each merged
    from its prefix and its last letter)."""
    for arch in ("small", "tiny", "gpt-neo-tiny", "gpt2-tiny", "gemma3-tiny"):
        m = tmp_path / arch
        stz("synth", arch, "--layers", "1", "--shards", "1", "-o", m, "-q")
        cfg = json.loads((m / "config.json").read_text())
        tok = json.loads((m / "tokenizer.json").read_text())
        ids = sorted(list(tok["model"]["vocab"].values()) + [a["id"] for a in tok["added_tokens"]])
        assert ids == list(range(cfg["vocab_size"])), arch
        vocab = tok["model"]["vocab"]
        for merge in tok["model"]["merges"][:3000]:
            a, b = merge.split(" ")
            assert a in vocab and b in vocab and a + b in vocab, merge
