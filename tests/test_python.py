"""The Python package (python/stz): loading plain, quantized and packed
files equals what the stz program writes; safe_open on a container decodes
only the tensor asked for; save_file writes what the reference reader
reads; errors carry stz's codes. STZ names the stz binary; the library is
found next to it (build tree) or through STZ_LIBRARY."""
import json
import os
import struct
import subprocess
import sys

import numpy as np
import pytest
from st_files import load

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))
STZ = os.path.abspath(os.environ.get("STZ", os.path.join(ROOT, "build", "stz")))
os.environ.setdefault("STZ", STZ)
os.environ.setdefault("STZ_LIBRARY", os.path.join(os.path.dirname(STZ), "libstz.so"))
import stz  # noqa: E402


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
    run("quantize", "--int4", m, "-o", d / "q.safetensors", "-q")
    run("dequantize", d / "q.safetensors", "--dtype", "f32", "-o", d / "q.f32.safetensors", "-q")
    run("compress", "--lossless", m, "-o", d / "m.stz", "-q")
    run("compress", "--int4", m, "-o", d / "q.stz", "-q")
    return d


def test_plain_file_equals_reference(files):
    got, want = stz.load_file(files / "tiny.safetensors"), raw_load(files / "tiny.safetensors")
    assert set(got) == set(want) and len(got) == 27
    for k in want:
        assert got[k].dtype == np.float32 and np.array_equal(got[k], want[k]), k


def test_quantized_file_equals_stz_dequantize(files):
    got, want = stz.load_file(files / "q.safetensors"), raw_load(files / "q.f32.safetensors")
    assert set(got) == set(want)
    for k in want:
        assert got[k].shape == want[k].shape and np.array_equal(got[k], want[k]), k
    raw = stz.load_file(files / "q.safetensors", dequantize=False)
    assert any(k.endswith(".scales") for k in raw) and raw["model.layers.0.mlp.up_proj.weight"].dtype == np.uint8


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
        assert f.metadata() == {"k": "v"}


def test_load_dir(files, tmp_path):
    d = tmp_path / "repo"
    d.mkdir()
    os.link(files / "tiny.safetensors", d / "model.safetensors")
    assert len(stz.load_dir(d)) == 27


def test_commands(files, tmp_path):
    s = stz.compress(files / "tiny.safetensors", tmp_path / "c.stz", policy="int8")
    assert s["output"].endswith("c.stz") and s["ratio"] > 1
    e = stz.evaluate(files / "tiny.safetensors", tmp_path / "c.stz")
    assert e["passed"] and e["min_cosine"] > 0.999
    f = stz.evaluate(files / "tiny.safetensors", files / "q.safetensors", forward=True, sequences=2, seq_len=16)
    assert f["positions"] == 30 and f["kl"]["mean"] > 0


def test_tune(files, tmp_path):
    r = stz.tune(files / "tiny.safetensors", tmp_path / "p.json", size=100000, sequences=2, seq_len=16)
    assert r["met"] and r["measured_bytes"] <= 100000 and (tmp_path / "p.json").exists()
    assert {t["name"] for t in r["tensors"]} >= {"lm_head.weight"}
    no = stz.tune(files / "tiny.safetensors", tmp_path / "no.json", size=1000)
    assert not no["met"] and no["closest_bytes"] > 1000 and not (tmp_path / "no.json").exists()


def test_export_gguf(files, tmp_path):
    tok = tmp_path / "tok.bin"  # a llama2.c tokenizer of the tiny model's 256 tokens
    tok.write_bytes(struct.pack("<i", 8) + b"".join(struct.pack("<fi", -i, 3) + b"t%02x" % i for i in range(256)))
    s = stz.export_gguf(files / "tiny.safetensors", tmp_path / "t.gguf", tokenizer=tok, type="q8_0", name="tiny")
    assert s["architecture"] == "llama" and s["types"]["q8_0"]["tensors"] > 0
    assert (tmp_path / "t.gguf").read_bytes()[:4] == b"GGUF"
    with pytest.raises(stz.StzError) as e:
        stz.export_gguf(files / "tiny.safetensors", tmp_path / "u.gguf")
    assert e.value.code == "STZ_E_ARG" and "no tokenizer" in e.value.message


def test_errors(tmp_path):
    bad = tmp_path / "bad.stz"
    bad.write_bytes(b"\x89STZ\r\n\x1a\n" + b"\0" * 100)
    with pytest.raises(stz.StzError) as e:
        stz.load_file(bad)
    assert e.value.code.startswith("STZ_E_")
    with pytest.raises(stz.StzError) as e:
        stz.compress(tmp_path / "missing.safetensors")
    assert e.value.code == "STZ_E_IO" and "missing.safetensors" in e.value.message


def test_torch(files):
    torch = pytest.importorskip("torch")
    t = stz.load_file(files / "tiny.safetensors", framework="pt", dequantize=False)
    assert t["model.norm.weight"].dtype == torch.bfloat16


def test_pip_install(tmp_path):
    """pip installs the package offline (Debian's pip and setuptools, no build isolation)."""
    p = subprocess.run([sys.executable, "-m", "pip", "install", "--no-build-isolation", "--no-deps", "--no-index",
                        "--target", str(tmp_path / "site"), os.path.join(ROOT, "python")],
                       capture_output=True, text=True)
    if "No module named pip" in p.stderr:
        pytest.skip("no pip (apt-get install python3-pip)")
    assert p.returncode == 0, p.stderr
    check = "import sys; sys.path.insert(0, sys.argv[1]); import stz; print(stz.__file__)"
    out = subprocess.run([sys.executable, "-c", check, str(tmp_path / "site")], capture_output=True, text=True)
    assert out.returncode == 0 and str(tmp_path / "site") in out.stdout, out.stderr


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
