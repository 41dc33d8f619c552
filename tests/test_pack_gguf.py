"""stz pack / unpack of GGUF files: every file comes back byte for byte
(SHA-256 compared), whatever its types, alignment, padding or layout; the
container codes llama.cpp's blocks field by field (stz inspect shows the
planes) and beats zstd -19 on them; bad input is refused by name and leaves
nothing behind. Run with pytest (STZ names the stz binary)."""
import hashlib
import json
import os
import shutil
import struct
import subprocess

import numpy as np
import pytest
from test_gguf import TYPES, gguf_bytes, quantize_dir, stz, wide_dir


def sha(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def roundtrip(tmp_path, g, *opts):
    """Packs g, checks the container, unpacks it; the container's path."""
    c, back = tmp_path / (g.name + ".stz"), tmp_path / (g.name + ".back")
    stz("pack", g, "-o", c, "-q", "-f", *opts)
    stz("verify", c, "-q")
    stz("unpack", c, "-o", back, "-q", "-f")
    assert sha(back) == sha(g), g
    back.unlink()
    return c


def inspect(c):
    return json.loads(stz("inspect", c, "--json").stdout)


@pytest.mark.parametrize("typ", TYPES)
def test_every_type_exactly(tmp_path, typ):
    """The GGUF export of a model quantized to each of llama.cpp's types
    packs and unpacks to the same bytes, on any thread count and chunk
    size (chunks of 64 KiB start inside blocks: each record says where),
    with every block tensor coded by the ggml transform's planes."""
    m = wide_dir(tmp_path)
    quantize_dir(m, typ)
    g = tmp_path / "t.gguf"
    stz("export", "--gguf", m, "-o", g, "-q")
    c = roundtrip(tmp_path, g)
    doc = inspect(c)
    assert doc["original_format"] == "gguf" and doc["original_size"] == os.path.getsize(g)
    mats = [t for t in doc["tensors"] if t.get("type") == typ]
    assert len(mats) == 9, [t.get("type") for t in doc["tensors"]]
    planes = [p["name"] for p in mats[0]["planes"]]
    assert planes[-1] == "partial" and ("codes" in planes) == (typ in ("q4_k", "q5_0", "q5_1", "q5_k", "q6_k")), planes
    one = c.read_bytes()
    for opts in (("-T", "3"), ("--chunk-size", "65536", "-T", "2")):
        again = roundtrip(tmp_path, g, *opts)
        if opts[0] == "-T":
            assert again.read_bytes() == one


def test_any_layout(tmp_path):
    """GGUF files llama.cpp would refuse or that stz's own reader refuses
    still pack byte for byte: types stz does not know, tensors listed out of
    order, sharing an offset or said to lie past the end, non-zero padding,
    bytes before the first tensor and after the last, another alignment,
    no tensors at all, a float tensor whose span is not whole values."""
    rng = np.random.default_rng(3)

    def noise(n):
        return rng.integers(0, 256, n, dtype=np.uint8).tobytes()

    cases = {
        "unknown_type": gguf_bytes([], [(b"x", 99, 64, 3, 700), (b"y", 12, 256, 2, 288)]),
        "no_tensors": gguf_bytes([(b"general.name", b"empty")], []),
        "small_f32": gguf_bytes([], [(b"a", 0, 3, 1, 12), (b"b", 14, 256, 1, 210)]),
    }
    # a layout written by hand: alignment 64, offsets out of order, one shared, one past the end,
    # random padding and a tail after the last tensor
    head = b"GGUF" + struct.pack("<IQQ", 3, 5, 1)
    head += struct.pack("<Q", 17) + b"general.alignment" + struct.pack("<II", 4, 64)
    for name, typ, ne0, off in ((b"late", 8, 64, 192), (b"early", 6, 64, 64), (b"same", 1, 32, 64),
                                (b"gone", 0, 8, 1 << 40), (b"f", 0, 16, 320)):
        head += struct.pack("<Q", len(name)) + name + struct.pack("<IQIQ", 1, ne0, typ, off)
    head += noise(-len(head) % 64)
    cases["hand_made"] = head + noise(64) + noise(44) + noise(84) + noise(68) + noise(60) + noise(64 + 999)
    for name, data in cases.items():
        g = tmp_path / (name + ".gguf")
        g.write_bytes(data)
        roundtrip(tmp_path, g)
    doc = inspect(tmp_path / "hand_made.gguf.stz")
    assert [t["name"] for t in doc["tensors"]] == ["(data before the first tensor)", "early", "same", "late", "f"]
    assert [t["bytes"] for t in doc["tensors"]] == [64, 0, 128, 128, 44 + 84 + 68 + 60 + 64 + 999 - 256]


def test_beats_zstd_on_blocks(tmp_path):
    """On llama.cpp's 5- and 6-bit blocks, whose codes the container keeps
    whole, the default container is smaller than zstd -19 of the file."""
    if not shutil.which("zstd"):
        pytest.skip("no zstd command")
    m = wide_dir(tmp_path)
    quantize_dir(m, "q6_k")
    g = tmp_path / "t.gguf"
    stz("export", "--gguf", m, "-o", g, "-q")
    c = roundtrip(tmp_path, g)
    z = subprocess.run(["zstd", "-19", "-c", g], capture_output=True, check=True).stdout
    assert os.path.getsize(c) < 0.98 * len(z), (os.path.getsize(c), len(z))


def test_bad_input(tmp_path):
    """A GGUF whose header is cut off, a GGUF from a pipe, a damaged chunk:
    refused by name, nothing written; compress/decompress --lossless give
    the same file back."""
    g = tmp_path / "cut.gguf"
    g.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 1, 0) + struct.pack("<Q", 1 << 40))
    out = tmp_path / "o.stz"
    r = stz("pack", g, "-o", out, ok=False)
    assert r.returncode == 1 and "cut.gguf: 1 tensors and 0 keys cannot fit the file" in r.stderr, r.stderr
    assert not out.exists()
    good = tmp_path / "good.gguf"
    good.write_bytes(gguf_bytes([], [(b"w", 8, 32, 4096, 4096 * 34)]))
    r = subprocess.run([os.environ.get("STZ", "build/stz"), "pack", "-", "-o", out], stdin=open(good, "rb"),
                       capture_output=True, text=True)
    assert r.returncode != 0 and "a GGUF file" in r.stderr and not out.exists()
    c = roundtrip(tmp_path, good)
    raw = bytearray(c.read_bytes())
    raw[len(raw) // 2] ^= 0x40
    bad = tmp_path / "bad.stz"
    bad.write_bytes(bytes(raw))
    r = stz("unpack", bad, "-o", tmp_path / "x.gguf", ok=False)
    assert r.returncode != 0 and "tensor 'w'" in r.stderr and not (tmp_path / "x.gguf").exists(), r.stderr
    stz("compress", "--lossless", good, "-o", out, "-q", "-f")
    stz("decompress", out, "-o", tmp_path / "d.gguf", "-q", "-f")
    assert sha(tmp_path / "d.gguf") == sha(good)


def test_bad_header_in_a_large_file(tmp_path):
    """A large GGUF whose header is refused (a key twice) is refused without
    reading the whole file into memory: the header is read in growing
    slices up to 256 MiB, never past that (peak memory of a 1.5 GiB file
    well under its size)."""
    if not os.path.exists("/usr/bin/time"):
        pytest.skip("no /usr/bin/time")
    g = tmp_path / "big.gguf"
    with open(g, "wb") as f:
        f.write(gguf_bytes([(b"k", b"1"), (b"k", b"2")], [(b"w", 8, 32, 1, 34)]))
        f.truncate(3 << 29)  # sparse
    r = subprocess.run(["/usr/bin/time", "-f", "%M", os.environ.get("STZ", "build/stz"), "pack", g, "-o",
                        tmp_path / "o.stz"], capture_output=True, text=True)
    assert r.returncode == 1 and "key 'k' appears twice" in r.stderr, r.stderr
    assert int(r.stderr.strip().splitlines()[-1]) < 600 * 1024, r.stderr
    assert not (tmp_path / "o.stz").exists()


def test_packed_gguf_as_a_model(tmp_path):
    """A GGUF container is the GGUF's bytes, not a model: eval and export
    refuse it and say what to do; decompress --dequantize gives the floats
    stz dequantize gives from the GGUF itself."""
    m = wide_dir(tmp_path)
    quantize_dir(m, "q4_k")
    g, c = tmp_path / "t.gguf", tmp_path / "t.gguf.stz"
    stz("export", "--gguf", m, "-o", g, "-q")
    stz("pack", g, "-o", c, "-q")
    for args in (("eval", m / "model.safetensors", c), ("export", "--gguf", c, "-o", tmp_path / "x.gguf")):
        r = stz(*args, ok=False)
        assert r.returncode == 1 and "holds a GGUF file: 'stz unpack' it" in r.stderr, r.stderr
    stz("decompress", "--dequantize", c, "-o", tmp_path / "a.safetensors", "-q")
    stz("dequantize", g, "-o", tmp_path / "b.safetensors", "-q")
    assert sha(tmp_path / "a.safetensors") == sha(tmp_path / "b.safetensors")
