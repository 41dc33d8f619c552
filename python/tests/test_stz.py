"""The Python package (python/stz): loading plain, quantized and packed
files equals what the stz program writes; safe_open on a container decodes
only the tensor asked for; save_file writes what the reference reader
reads; every bad input is a StzError with the code the C reader gives;
loading is linear in the tensor count; the commands run in-process; pip
installs it offline into a venv whose package finds its own libstz.

STZ names the stz program (the tests' independent maker of files);
STZ_LIBRARY the libstz.so.0 under test (default: the build tree's)."""
import json
import math
import os
import re
import signal
import struct
import subprocess
import sys
import time
import warnings

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path[:0] = [os.path.join(ROOT, "python"), os.path.join(ROOT, "tests")]
STZ = os.path.abspath(os.environ.get("STZ", os.path.join(ROOT, "build", "stz")))
os.environ.setdefault("STZ_LIBRARY", os.path.join(os.path.dirname(STZ), "libstz.so.0"))
CORPUS = os.path.join(ROOT, "tests", "corpus")
import stz  # noqa: E402
from st_files import load  # noqa: E402


def run(*args):
    subprocess.run([STZ] + [str(a) for a in args], check=True, capture_output=True)


def raw_load(path):
    """The reference: a plain SafeTensors file with the standard library and numpy."""
    return load(path)[0]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("py")
    m = d / "tiny.safetensors"
    run("synth", "tiny", "-o", m, "-q")
    run("quantize", "--int4", m, "-o", d / "q.safetensors", "-q")  # llama.cpp's types
    run("quantize", "--policy", "int4-nl", m, "-o", d / "qnl.safetensors", "-q")  # stz's nl codes and .scales
    for q in ("q", "qnl"):
        run("dequantize", d / (q + ".safetensors"), "--dtype", "f32", "-o", d / (q + ".f32.safetensors"), "-q")
    run("compress", "--lossless", m, "-o", d / "m.stz", "-q")
    run("compress", "--int4", m, "-o", d / "q.stz", "-q")
    return d


def test_plain_file_equals_reference(files):
    got, want = stz.load_file(files / "tiny.safetensors"), raw_load(files / "tiny.safetensors")
    assert set(got) == set(want) and len(got) == 27
    for k in want:
        assert got[k].dtype == np.float32 and np.array_equal(got[k], want[k]), k


@pytest.mark.parametrize("q", ["q", "qnl"])
def test_quantized_file_equals_stz_dequantize(files, q):
    got, want = stz.load_file(files / (q + ".safetensors")), raw_load(files / (q + ".f32.safetensors"))
    assert set(got) == set(want)
    for k in want:
        assert got[k].shape == want[k].shape and np.array_equal(got[k], want[k]), k
    raw = stz.load_file(files / (q + ".safetensors"), dequantize=False)
    assert any(k.endswith(".scales") for k in raw) == (q == "qnl")
    assert raw["model.layers.0.mlp.up_proj.weight"].dtype == np.uint8


def test_transposed_matrices(tmp_path):
    """GPT-2's Conv1D weights, stored (in, out), are quantized along their
    input and stored transposed: read back (in, out), whole or by rows, as
    stz dequantize writes them."""
    m, q, f = tmp_path / "g.safetensors", tmp_path / "q.safetensors", tmp_path / "f.safetensors"
    run("synth", "gpt2-tiny", "-o", m, "-q")
    run("quantize", "--int4", "--fast", m, "-o", q, "-q")
    run("dequantize", q, "--dtype", "f32", "-o", f, "-q")
    got, want = stz.load_file(q), raw_load(f)
    assert got.keys() == want.keys() and got["transformer.h.0.attn.c_attn.weight"].shape == (64, 192)
    assert all(np.array_equal(got[k], want[k]) for k in want)
    with stz.safe_open(q) as o:
        name = "transformer.h.1.mlp.c_fc.weight"
        assert np.array_equal(o.get_slice(name)[3:9], want[name][3:9])


def test_containers(files):
    lossless, plain = stz.load_file(files / "m.stz"), stz.load_file(files / "tiny.safetensors")
    assert all(np.array_equal(lossless[k], plain[k]) for k in plain)
    packed, want = stz.load_file(files / "q.stz"), raw_load(files / "q.f32.safetensors")
    assert all(np.array_equal(packed[k], want[k]) for k in want)
    with stz.safe_open(files / "q.stz") as f:
        assert f.metadata()["stz.synth.arch"] == "tiny"
        w = f.get_tensor("model.layers.1.mlp.down_proj.weight")
        assert w.shape == (64, 172)


def test_container_reads_one_tensor(tmp_path):
    """A tensor from a 100 MB container takes time for its own chunks, not the file's."""
    import time
    big = tmp_path / "big.safetensors"
    rng = np.random.default_rng(0)
    stz.save_file({"a": rng.standard_normal((64, 64)).astype(np.float32),
                   "b": rng.standard_normal((6400, 4000)).astype(np.float32)}, big)
    run("pack", big, "-o", tmp_path / "big.stz", "-q")
    with stz.safe_open(tmp_path / "big.stz") as f:
        t0 = time.perf_counter()
        a = f.get_tensor("a")
        small = time.perf_counter() - t0
        t0 = time.perf_counter()
        b = f.get_tensor("b")
        whole = time.perf_counter() - t0
    assert a.shape == (64, 64) and b.shape == (6400, 4000)
    assert small < whole / 10, (small, whole)


def test_save_file_round_trip(tmp_path):
    t = {"x": np.arange(12, dtype=np.float32).reshape(3, 4), "i": np.array([1, -2, 3], dtype=np.int32),
         "h": np.ones((2, 2), dtype=np.float16)}
    p = tmp_path / "s.safetensors"
    stz.save_file(t, p, metadata={"k": "v"})
    back = raw_load(p)
    assert all(np.array_equal(back[k], t[k]) for k in t)
    run("inspect", p)  # stz accepts what it wrote
    with stz.safe_open(p) as f:
        assert f.metadata() == {"format": "pt", "k": "v"}  # as torch writes; "format" given replaces it


def test_load_dir(files, tmp_path):
    d = tmp_path / "repo"
    d.mkdir()
    os.link(files / "tiny.safetensors", d / "model.safetensors")
    assert len(stz.load_dir(d)) == 27
    s = stz.compress(d, tmp_path / "d.stz", policy="int8")  # the folder's model.safetensors
    t = stz.compress(files / "tiny.safetensors", tmp_path / "f.stz", policy="int8")
    assert s["in_bytes"] == t["in_bytes"] and (tmp_path / "d.stz").read_bytes() == (tmp_path / "f.stz").read_bytes()


def test_commands(files, tmp_path):
    s = stz.compress(files / "tiny.safetensors", tmp_path / "c.stz", policy="int8")
    assert s["output"].endswith("c.stz") and s["ratio"] > 1 and s["calibrated"] is True
    fast = stz.compress(files / "tiny.safetensors", tmp_path / "fast.stz", policy="int8", fast=True)
    assert fast["calibrated"] is False and (tmp_path / "fast.stz").read_bytes() != (tmp_path / "c.stz").read_bytes()
    e = stz.evaluate(files / "tiny.safetensors", tmp_path / "c.stz")
    assert e["passed"] and e["min_cosine"] > 0.999
    f = stz.evaluate(files / "tiny.safetensors", files / "q.safetensors", forward=True, sequences=2, seq_len=16)
    assert f["positions"] == 30 and f["kl"]["mean"] > 0


def same_document(a, b):
    """JSON documents alike, floats to cJSON's printing (15 significant
    digits where they read back within an epsilon: the last bit can go)."""
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same_document(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(map(same_document, a, b))
    if isinstance(a, float) or isinstance(b, float):
        return math.isclose(a, b, rel_tol=4e-16, abs_tol=0)
    return a == b


def test_evaluate_through_c(files, tmp_path):
    """evaluate() calls libstz's stz_eval_models, not the program: the same
    document as stz eval --json, figures, lists and gate alike."""
    orig, c = files / "tiny.safetensors", tmp_path / "c.stz"
    stz.compress(orig, c, policy="int4")
    for kw in ({}, {"threshold": 0.9999}, {"threshold": 0.5}):
        assert same_document(stz.evaluate(orig, c, **kw), stz.command("eval", orig, c, **kw))
    t = stz.load_file(orig)
    gone = sorted(t)[0]
    del t[gone]
    stz.save_file(t, tmp_path / "less.safetensors")
    for allow in (False, True):
        d = stz.evaluate(orig, tmp_path / "less.safetensors", allow_missing=allow)
        assert same_document(d, stz.command("eval", orig, tmp_path / "less.safetensors", allow_missing=allow))
        assert d["missing_from_candidate"] == [gone] and d["passed"] == allow
    with pytest.raises(TypeError, match="csv"):
        stz.evaluate(orig, c, csv=True)


def test_compress_through_c(files, tmp_path):
    """compress() calls libstz's stz_compress_model, not the program: the same
    bytes and the same document as stz compress --json (but its seconds),
    for a calibrated, a fast, a lossless and a rule-edited policy; a model
    stz does not run is quantized by names with a warning; the errors the
    program gives."""
    orig = files / "tiny.safetensors"
    for kw in ({"policy": "int4"}, {"policy": "int8", "fast": True}, {"lossless": True},
               {"int4": True, "sequences": 2, "seq_len": 16, "seed": 3},
               {"policy": "int4", "set": "*.mlp.*=int8", "keep": "lm_head.weight", "fast": True},
               {"policy": "int4-nl", "method": "mse", "block_size": 64, "no_eval": True, "fast": True}):
        a = stz.compress(orig, tmp_path / "a.stz", force=True, **kw)
        b = stz.command("compress", orig, output=tmp_path / "b.stz", force=True, **kw)
        a.pop("seconds"), b.pop("seconds")
        b["output"] = a["output"]
        assert same_document(a, b), kw
        assert (tmp_path / "a.stz").read_bytes() == (tmp_path / "b.stz").read_bytes(), kw
    assert stz.compress(orig, tmp_path / "s.stz", set="*.mlp.*=int8", fast=True)["mode"] == "int4"  # the default
    named = stz.compress(orig, policy="int8", fast=True)  # the program's default name
    assert named["output"] == str(files / "tiny.int8.safetensors.stz") and os.path.exists(named["output"])
    os.remove(named["output"])
    gpt2, other = tmp_path / "gpt2.safetensors", tmp_path / "bloom.safetensors"  # a family stz does not run
    stz.command("synth", "gpt2-tiny", output=gpt2)
    subprocess.run([sys.executable, os.path.join(ROOT, "tests", "edit_meta.py"), gpt2, other, "config",
                    "model_type=bloom"], check=True)
    with pytest.warns(UserWarning, match="without calibration: .*model_type 'bloom' is not supported"):
        assert stz.compress(other, tmp_path / "bloom.stz", policy="int8")["calibrated"] is False
    for kw, said in (({"lossless": True, "policy": "int8"}, "--lossless takes no policy options"),
                     ({"fast": True, "feedback": True}, "--fast skips"),
                     ({"int4": True, "int8": True}, "give one policy"),
                     ({"tokens": "t.txt", "fast": True}, "calibration's: not with --fast"),
                     ({"bogus": 1}, "'--bogus'")):
        with pytest.raises(stz.StzError, match=re.escape(said)) as e:
            stz.compress(orig, tmp_path / "x.stz", **kw)
        assert e.value.code == "STZ_E_ARG" and not (tmp_path / "x.stz").exists()
    with pytest.raises(stz.StzError, match="not a GGUF file") as e:
        stz.compress(orig, tmp_path / "x.gguf", policy="int8", fast=True)
    assert e.value.code == "STZ_E_ARG" and not (tmp_path / "x.gguf").exists()
    with warnings.catch_warnings():  # a missing model is an error, not one to quantize by names
        warnings.simplefilter("error")
        with pytest.raises(stz.StzError, match="cannot open") as e:
            stz.compress(tmp_path / "missing.safetensors", tmp_path / "x.stz")
    assert e.value.code == "STZ_E_IO"


def test_tune(files, tmp_path):
    r = stz.tune(files / "tiny.safetensors", tmp_path / "p.json", size=100000, sequences=2, seq_len=16)
    assert r["met"] and r["measured_bytes"] <= 100000 and (tmp_path / "p.json").exists()
    assert {t["name"] for t in r["tensors"]} >= {"lm_head.weight"}
    no = stz.tune(files / "tiny.safetensors", tmp_path / "no.json", size=1000)
    assert not no["met"] and no["closest_bytes"] > 1000 and not (tmp_path / "no.json").exists()
    c = stz.compress(files / "tiny.safetensors", tmp_path / "t.stz", tune=True, size=100000, sequences=2, seq_len=16)
    assert c["met"] and c["container"] == str(tmp_path / "t.stz") and os.path.getsize(tmp_path / "t.stz") <= 100000
    with pytest.raises(stz.StzError, match="not an option of --tune"):
        stz.compress(files / "tiny.safetensors", tmp_path / "u.stz", policy="int8", tune=True, size=100000)


def test_tune_through_c(files, tmp_path):
    """tune(), gguf() and compress(tune=True) call libstz's stz_tune_run, not
    the program: the same report as --json (policy, container and GGUF names
    aside), the same policy, plot, container and GGUF bytes."""
    orig, m = files / "tiny.safetensors", tmp_path / "m"
    stz.command("synth", "tiny", "--shards", "1", output=m)
    runs = [("tune", orig, {"size": "100K", "sequences": 2, "seq_len": 16}, ".json", "policy"),
            ("tune", orig, {"size": 1000}, ".json", None),
            ("tune", orig, {"max_kl": 0.05, "fast": True, "candidates": "keep,8:absmax:32:F16,4:nl:32:U8"}, ".json",
             "policy"),
            ("compress", orig, {"size": 100000, "sequences": 2, "seq_len": 16}, ".stz", "container"),
            ("gguf", m, {"like": "q4_k_m"}, ".gguf", "gguf"),
            ("gguf", m, {"bits_per_weight": 6, "fast": True}, ".gguf", "gguf")]
    for cmd, model, kw, ext, key in runs:
        a, b = tmp_path / ("a" + ext), tmp_path / ("b" + ext)
        plots = {"plot": tmp_path / "a.svg"}, {"plot": tmp_path / "b.svg"}
        if cmd == "compress":
            ra = stz.compress(model, a, tune=True, force=True, **kw, **plots[0])
            rb = stz.command("compress", model, "--tune", output=b, force=True, **kw, **plots[1])
        else:
            ra = getattr(stz, cmd)(model, a, force=True, **kw, **plots[0])
            rb = stz.command(cmd, model, output=b, force=True, **kw, **plots[1])
        if key:
            assert ra[key] == str(a) and rb[key] == str(b)
            ra[key] = rb[key]
            assert a.read_bytes() == b.read_bytes(), (cmd, kw)
            svg = [p.read_text().replace(str(a), "").replace(str(b), "") for p in (tmp_path / "a.svg", tmp_path / "b.svg")]
            assert svg[0] == svg[1]
        else:
            assert not a.exists() and not b.exists() and ra["met"] is False
        assert same_document(ra, rb), (cmd, kw)
        for f in (a, b, tmp_path / "a.svg", tmp_path / "b.svg"):
            f.unlink(missing_ok=True)
    named = stz.tune(orig, size=100000, sequences=2, seq_len=16)  # the program's default name
    assert named["policy"] == str(files / "tiny.tune.json") and os.path.exists(named["policy"])
    os.remove(named["policy"])
    for fn, kw, said in ((stz.tune, {"size": 1, "max_kl": 1}, "give exactly one budget"),
                         (stz.tune, {"like": "q4_k_m"}, "'--like'"),
                         (stz.gguf, {"like": "q4_k_m", "ratio": 2}, "'--ratio'"),
                         (stz.gguf, {"like": "q4_k_m", "no_verify": True}, "'--no-verify'"),
                         (stz.tune, {"size": "12Q"}, "--size takes a number"),
                         (stz.tune, {"size": 1000, "tokenizer": "t.json"}, "are for --gguf"),
                         (stz.tune, {"size": 1000, "fast": True, "feedback": True}, "--fast skips")):
        with pytest.raises(stz.StzError, match=re.escape(said)) as e:
            fn(orig, tmp_path / "x.gguf" if fn is stz.gguf else tmp_path / "x.json", **kw)
        assert e.value.code == "STZ_E_ARG"
    with pytest.raises(stz.StzError, match="--like q9_k") as e:
        stz.gguf(m, tmp_path / "x.gguf", like="q9_k")
    assert e.value.code == "STZ_E_ARG" and not (tmp_path / "x.gguf").exists()


def test_gguf(tmp_path):
    """The one command from Python: a generated Hugging Face folder to a
    GGUF at llama-quantize's Q4_K_M size; --fast through fast=True."""
    m = tmp_path / "m"
    stz.command("synth", "tiny", "--shards", "1", output=m)
    r = stz.gguf(m, tmp_path / "m.gguf", like="q4_k_m")
    assert r["met"] and r["measured_bytes"] <= r["llama_quantize_bytes"]["q4_k_m"]
    assert (tmp_path / "m.gguf").stat().st_size == r["measured_bytes"]
    fast = stz.gguf(m, tmp_path / "f.gguf", like="q4_k_m", fast=True)
    assert fast["measured_kl"] > r["measured_kl"]


def test_export_gguf(files, tmp_path):
    tok = tmp_path / "tok.bin"  # a llama2.c tokenizer of the tiny model's 256 tokens
    tok.write_bytes(struct.pack("<i", 8) + b"".join(struct.pack("<fi", -i, 3) + b"t%02x" % i for i in range(256)))
    s = stz.export_gguf(files / "tiny.safetensors", tmp_path / "t.gguf", tokenizer=tok, type="q8_0", name="tiny")
    assert s["architecture"] == "llama" and s["types"]["q8_0"]["tensors"] > 0
    assert (tmp_path / "t.gguf").read_bytes()[:4] == b"GGUF"
    with pytest.raises(stz.StzError) as e:
        stz.export_gguf(files / "tiny.safetensors", tmp_path / "u.gguf")
    assert e.value.code == "STZ_E_ARG" and "no tokenizer" in e.value.message
    # the GGUF packed losslessly and given back byte for byte
    c = stz.compress(tmp_path / "t.gguf", tmp_path / "t.gguf.stz", lossless=True)
    assert c["out_bytes"] < c["in_bytes"] == os.path.getsize(tmp_path / "t.gguf")
    stz.decompress(tmp_path / "t.gguf.stz", tmp_path / "back.gguf")
    assert (tmp_path / "back.gguf").read_bytes() == (tmp_path / "t.gguf").read_bytes()


def test_errors(tmp_path):
    bad = tmp_path / "bad.stz"
    bad.write_bytes(b"\x89STZ\r\n\x1a\n" + b"\0" * 100)
    with pytest.raises(stz.StzError) as e:
        stz.load_file(bad)
    assert e.value.code.startswith("STZ_E_")
    with pytest.raises(stz.StzError) as e:
        stz.compress(tmp_path / "missing.safetensors")
    assert e.value.code == "STZ_E_IO" and "missing.safetensors" in e.value.message
    with pytest.raises(stz.StzError) as e:
        stz.command("eval", tmp_path / "missing.safetensors", tmp_path / "b.safetensors", bogus=1)
    assert e.value.code == "STZ_E_ARG" and "--bogus" in e.value.message
    with pytest.raises(stz.StzError) as e:
        stz.compress(tmp_path / "missing.safetensors", "-")
    assert e.value.code == "STZ_E_ARG"


def test_torch(files):
    torch = pytest.importorskip("torch")
    t = stz.load_file(files / "tiny.safetensors", framework="pt", dequantize=False)
    assert t["model.norm.weight"].dtype == torch.bfloat16


def _tree(path):
    return sorted(os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs)


def test_install_in_venv(tmp_path):
    """The README's way: a venv over Debian's packages, pip offline (no
    index, build isolation on: the backend needs nothing); the installed
    package finds the libstz it carries with no library path set, and the
    install writes nothing into the source tree."""
    before = _tree(os.path.join(ROOT, "python"))
    venv = tmp_path / "venv"
    made = subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], capture_output=True,
                          text=True)
    if made.returncode or not (venv / "bin" / "pip").exists():
        pytest.skip("no venv with pip (apt-get install python3-venv): " + made.stderr.strip()[-200:])
    env = {k: v for k, v in os.environ.items() if k not in ("STZ_LIBRARY", "PYTHONPATH", "LD_LIBRARY_PATH")}
    env["STZ_LIBRARY"] = os.environ["STZ_LIBRARY"]  # the library under test goes into the wheel
    p = subprocess.run([str(venv / "bin" / "pip"), "install", "--no-index", "-q", os.path.join(ROOT, "python")],
                       capture_output=True, text=True, env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    del env["STZ_LIBRARY"]
    check = ("import stz, sys; f = stz.load_file(sys.argv[1]); "
             "print(stz.__file__, len(f), stz.command('inspect', sys.argv[1])['tensor_count'])")
    model = str(tmp_path / "m.safetensors")
    run("synth", "tiny", "-o", model, "-q")
    out = subprocess.run([str(venv / "bin" / "python"), "-c", check, model], capture_output=True, text=True,
                         env=env, cwd=str(tmp_path))
    assert out.returncode == 0, out.stderr
    where, n, m = out.stdout.split()
    assert where.startswith(str(venv)) and n == m == "27", out.stdout
    assert (venv / "lib").glob("python3*/site-packages/stz/libstz.so.0")
    assert _tree(os.path.join(ROOT, "python")) == before


def test_st_corpus_same_codes_as_c():
    """Every file of the SafeTensors corpus: the C reader's expected status
    (MANIFEST), as a StzError or a load."""
    d = os.path.join(CORPUS, "safetensors")
    rows = [l.split() for l in open(os.path.join(d, "MANIFEST")) if l.strip() and not l.startswith("#")]
    assert len(rows) > 40
    for name, want in rows:
        try:
            stz.load_file(os.path.join(d, name), dequantize=False)
            got = "STZ_OK"
        except stz.StzError as e:
            got = e.code
        assert got == want, name


def test_container_corpus_same_codes_as_c():
    d = os.path.join(CORPUS, "stz")
    rows = [l.split() for l in open(os.path.join(d, "MANIFEST")) if l.strip() and not l.startswith("#")]
    assert len(rows) > 20
    for name, want in rows:
        if name == "valid_gguf.stz":  # a GGUF's bytes, not a model: load_file says so
            want = "STZ_E_UNSUPPORTED"
        try:
            stz.load_file(os.path.join(d, name))
            got = "STZ_OK"
        except stz.StzError as e:
            got = e.code
        assert (got == "STZ_OK") == (want == "STZ_OK"), (name, got, want)
        assert want != "STZ_E_UNSUPPORTED" or got == want, (name, got)


def test_quant_corpus_equals_dequantize(tmp_path):
    """Quantized files (good and lying): the values stz dequantize writes, or
    a StzError where it refuses; never another exception."""
    d = os.path.join(CORPUS, "quant")
    names = sorted(f for f in os.listdir(d) if f.endswith(".safetensors"))
    refused = 0
    for name in names:
        out = tmp_path / name
        p = subprocess.run([STZ, "dequantize", os.path.join(d, name), "--dtype", "f32", "-o", str(out), "-q"],
                           capture_output=True, text=True)
        if p.returncode:
            with pytest.raises(stz.StzError):
                stz.load_file(os.path.join(d, name))
            refused += 1
            continue
        got, want = stz.load_file(os.path.join(d, name)), load(out, ("F32", "I32", "U8", "I8"))[0]
        assert set(got) == set(want), name
        assert all(np.array_equal(got[k], want[k]) for k in want), name
    assert refused >= 4 and len(names) - refused >= 10


def test_hostile_files(tmp_path):
    """What used to escape as MemoryError, TypeError, KeyError, IndexError."""
    cases = {"text": b"# a README, not a model\n" * 40, "short": b"\x10\x00", "empty": b"",
             "cut": struct.pack("<Q", 64) + b'{"a":', "neg": None, "dup": None, "overlap": None}
    head = lambda h: struct.pack("<Q", len(h)) + h  # noqa: E731
    cases["neg"] = head(b'{"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}}') + b"\0" * 4
    cases["dup"] = head(b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},'
                        b'"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}') + b"\0" * 8
    cases["overlap"] = head(b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},'
                            b'"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}') + b"\0" * 12
    for name, data in cases.items():
        f = tmp_path / (name + ".safetensors")
        f.write_bytes(data)
        with pytest.raises(stz.StzError) as e:
            stz.load_file(f)
        assert str(f) in e.value.message, (name, e.value.message)
    with stz.safe_open(os.path.join(CORPUS, "quant", "int4.safetensors")) as f:
        with pytest.raises(stz.StzError):
            f.get_tensor("no such tensor")
    with pytest.raises(stz.StzError):
        stz.load_file(os.path.join(CORPUS, "quant", "int4.safetensors"), framework="tf")


def _many(path, n):
    """A file of n one-element F32 tensors, its header written directly."""
    h = json.dumps({"t%06d" % i: {"dtype": "F32", "shape": [1], "data_offsets": [4 * i, 4 * i + 4]}
                    for i in range(n)}, separators=(",", ":")).encode()
    path.write_bytes(struct.pack("<Q", len(h)) + h + np.arange(n, dtype=np.float32).tobytes())


def test_load_time_linear_in_tensor_count(tmp_path):
    """Opening and loading 10x the tensors costs ~10x, not ~100x (the old
    package took over 60 s for 100k)."""
    cost = []
    for n in (20000, 200000):
        _many(tmp_path / ("m%d.safetensors" % n), n)
        t0 = time.perf_counter()
        d = stz.load_file(tmp_path / ("m%d.safetensors" % n))
        cost.append(time.perf_counter() - t0)
        assert len(d) == n and d["t%06d" % (n - 1)][0] == n - 1
    assert cost[1] / cost[0] < 30, cost


def test_ctrl_c_interrupts_a_command(tmp_path):
    """SIGINT while a long command runs in-process: KeyboardInterrupt within
    seconds (stz_interrupt_request), and the next command runs normally."""
    model = tmp_path / "small.safetensors"
    run("synth", "small", "-o", model, "-q")
    code = ("import stz, sys, time\ntry:\n    stz.evaluate(sys.argv[1], sys.argv[1], forward=True, sequences=64,"
            " seq_len=256, threads=1)\n    print('finished')\nexcept KeyboardInterrupt:\n    t = time.time()\n"
            "    print('interrupted', stz.command('inspect', sys.argv[1])['tensor_count'])\n")
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    p = subprocess.Popen([sys.executable, "-c", code, str(model)], stdout=subprocess.PIPE, text=True, env=env)
    time.sleep(2)
    assert p.poll() is None, "the command ended before the signal"
    t0 = time.perf_counter()
    p.send_signal(signal.SIGINT)
    out, _ = p.communicate(timeout=120)
    assert out.split() == ["interrupted", "74"] and time.perf_counter() - t0 < 10, out


def test_bf16_raw(files):
    raw = stz.load_file(files / "tiny.safetensors", bf16_raw=True)
    wide = stz.load_file(files / "tiny.safetensors")
    w = raw["model.norm.weight"]
    assert w.dtype == np.uint16 and np.array_equal((w.astype(np.uint32) << 16).view(np.float32), wide["model.norm.weight"])


def test_load_dir_sharded(tmp_path):
    """A sharded directory: the index's shards, plain and packed alike."""
    d = tmp_path / "sharded"
    d.mkdir()
    a, b = np.ones((4, 8), np.float32), np.arange(6, dtype=np.float32)
    stz.save_file({"a": a}, d / "model-00001-of-00002.safetensors")
    stz.save_file({"b": b}, d / "model-00002-of-00002.safetensors")
    index = {"metadata": {}, "weight_map": {"a": "model-00001-of-00002.safetensors",
                                            "b": "model-00002-of-00002.safetensors"}}
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    got = stz.load_dir(d)
    assert np.array_equal(got["a"], a) and np.array_equal(got["b"], b)
    run("pack", d / "model-00002-of-00002.safetensors", "-o", d / "model-00002-of-00002.safetensors.stz")
    os.unlink(d / "model-00002-of-00002.safetensors")
    assert np.array_equal(stz.load_dir(d)["b"], b)
    assert [os.path.basename(f) for f in stz.model_files(d)] == ["model-00001-of-00002.safetensors",
                                                                 "model-00002-of-00002.safetensors.stz"]
    # the index is checked against the shards, as the program checks it
    index["weight_map"]["b"] = "model-00001-of-00002.safetensors"
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(stz.StzError, match="maps tensor 'b' to model-00001-of-00002.safetensors, which does not hold"):
        stz.load_dir(d)


def test_nul_in_strings_refused(tmp_path):
    """Issue 52, 6: a path, tensor name or metadata key holding a NUL was cut
    there on its way to C (another file opened, another name written);
    ValueError now, before anything is opened or written."""
    a = {"w": np.ones(4, np.float32)}
    with pytest.raises(ValueError, match="NUL"):
        stz.save_file({"a\0b": np.ones(4, np.float32)}, tmp_path / "n.safetensors")
    with pytest.raises(ValueError, match="NUL"):
        stz.save_file(a, tmp_path / "n.safetensors", metadata={"k\0x": "v"})
    with pytest.raises(ValueError, match="NUL"):
        stz.save_file(a, tmp_path / "n.safetensors", metadata={"k": "v\0x"})
    with pytest.raises(ValueError, match="NUL"):
        stz.save_file(a, str(tmp_path / "n.safetensors") + "\0.x")
    assert not os.listdir(tmp_path)
    stz.save_file(a, tmp_path / "n.safetensors")
    with pytest.raises(ValueError, match="NUL"):
        stz.safe_open(str(tmp_path / "n.safetensors") + "\0x")
    with stz.safe_open(tmp_path / "n.safetensors") as f, pytest.raises(stz.StzError, match="no tensor named"):
        f.get_tensor("w\0x")  # looked up whole, not cut to 'w'
    with pytest.raises(ValueError, match="NUL"):
        stz.command("inspect", str(tmp_path / "n.safetensors") + "\0x")


def test_struct_mirrors_checked():
    """The ctypes copies of stz_err, stz_tensor and stz_qtensor are as large
    as the loaded library's (checked when it loads); a copy of another
    layout is refused, naming the structure."""
    import ctypes
    from stz import _lib
    lib = _lib.lib()
    for cname, cls in _lib._MIRRORS:
        assert lib.stz_struct_size(cname.encode()) == ctypes.sizeof(cls) > 0
    assert lib.stz_struct_size(b"stz_nothing") == 0

    class Short(ctypes.Structure):
        _fields_ = [("name", ctypes.c_char_p)]
    with pytest.raises(stz.StzError) as e:
        _lib.check_mirrors(lib, "libstz.so.0", [("stz_qtensor", Short)])
    assert e.value.code == "STZ_E_UNSUPPORTED" and "stz_qtensor" in e.value.message


SLICES = [np.s_[:], np.s_[3], np.s_[-1], np.s_[2:7], np.s_[7:2:-1], np.s_[::-2], np.s_[::3, 1:5], np.s_[..., 0],
          np.s_[5:5], np.s_[1, ::2], np.s_[None], np.s_[10**6], np.s_[-10**6:2]]


@pytest.mark.parametrize("name", ["tiny.safetensors", "q.safetensors", "qnl.safetensors", "q.stz", "m.stz"])
def test_get_slice_is_get_tensor_indexed(files, name):
    """get_slice(n)[key] is get_tensor(n)[key] for every tensor and index
    (plain BF16, both quantized kinds, containers; bf16_raw too), with the
    same IndexError where numpy gives one; the shape and dtype come without
    reading the tensor."""
    for raw in (False, True):
        with stz.safe_open(files / name, bf16_raw=raw) as f:
            for k in f.keys():
                whole, s = f.get_tensor(k), f.get_slice(k)
                assert s.get_shape() == list(whole.shape), k
                assert s.get_dtype() in ("F32", "BF16", "F16"), k
                for key in SLICES:
                    try:
                        want = whole[key]
                    except IndexError:
                        with pytest.raises(IndexError):
                            s[key]
                        continue
                    got = s[key]
                    assert got.dtype == want.dtype and np.array_equal(got, want), (k, key)
    with pytest.raises(stz.StzError, match="closed"):  # not a read through a freed reader
        s[0]
    assert s.get_shape() == list(whole.shape)


def test_save_and_load_bytes(files, tmp_path):
    """save() gives the bytes save_file writes; load() reads them (and a
    quantized file's bytes, dequantized as load_file does); cut bytes are
    the reader's error."""
    t = {"x": np.arange(12, dtype=np.float32).reshape(3, 4), "i": np.array([1, -2, 3], dtype=np.int32)}
    b = stz.save(t, metadata={"k": "v"})
    stz.save_file(t, tmp_path / "s.safetensors", metadata={"k": "v"})
    assert b == (tmp_path / "s.safetensors").read_bytes()
    back = stz.load(b)
    assert set(back) == set(t) and all(np.array_equal(back[k], t[k]) for k in t)
    want = stz.load_file(files / "q.safetensors")
    got = stz.load((files / "q.safetensors").read_bytes())
    assert set(got) == set(want) and all(np.array_equal(got[k], want[k]) for k in want)
    with pytest.raises(stz.StzError):
        stz.load(b[:-3])


def test_version_and_namespace():
    """__version__ is the library's and the program's; the module holds
    only its API (and private names)."""
    out = subprocess.run([STZ, "--version"], capture_output=True, text=True, check=True).stdout.split()
    assert stz.__version__ == out[1]
    assert 'version = "%s"' % stz.__version__ in open(os.path.join(ROOT, "python", "pyproject.toml")).read()
    public = {n for n in vars(stz) if not n.startswith("_")}
    assert public == set(stz.__all__) - {"__version__"}
    assert dir(stz) == sorted(stz.__all__)
