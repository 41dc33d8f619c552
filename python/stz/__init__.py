"""stz from Python: read plain, quantized and packed (.stz) SafeTensors
models into numpy (or PyTorch), write SafeTensors, and run stz's commands.

    import stz
    w = stz.load_file("model.int4.safetensors.stz")            # dict of float32 arrays
    with stz.safe_open("model.stz", framework="np") as f:       # one tensor at a time
        emb = f.get_tensor("model.embed_tokens.weight")
    stz.save_file({"w": w["w"]}, "out.safetensors")

Plain and quantized SafeTensors files are memory-mapped and dequantized with
numpy (docs/FORMAT.md); an .stz container is read through libstz, which
decodes only the chunks of the tensor asked for. The commands (compress,
decompress, evaluate) run the stz program and return its --json document.
"""
import ctypes
import ctypes.util
import json
import os
import shutil
import struct
import subprocess

import numpy as np

__all__ = ["StzError", "safe_open", "load_file", "load_dir", "save_file", "compress", "decompress", "evaluate"]

_HERE = os.path.dirname(os.path.abspath(__file__))
_KINDS = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": "<u2", "I64": "<i8", "I32": "<i4", "I16": "<i2",
          "I8": "i1", "U64": "<u8", "U32": "<u4", "U16": "<u2", "U8": "u1", "BOOL": "?"}


class StzError(Exception):
    """An error from stz: `code` is its stable status name (e.g. STZ_E_FORMAT)."""

    def __init__(self, code, message):
        super().__init__("%s [%s]" % (message, code))
        self.code, self.message = code, message


# ---- libstz (for .stz containers) ------------------------------------------

class _Err(ctypes.Structure):
    _fields_ = [("code", ctypes.c_int), ("msg", ctypes.c_char * 1024)]


_lib = None


def _library():
    """libstz: $STZ_LIBRARY, the system's, or the build tree next to this package."""
    global _lib
    if _lib is not None:
        return _lib
    tried = [os.environ.get("STZ_LIBRARY"), ctypes.util.find_library("stz"),
             os.path.join(_HERE, "..", "..", "build", "libstz.so")]
    for path in [p for p in tried if p]:
        try:
            lib = ctypes.CDLL(path)
            break
        except OSError:
            continue
    else:
        raise StzError("STZ_E_IO", "libstz not found (install stz, or set STZ_LIBRARY to libstz.so)")
    P, E = ctypes.c_void_p, ctypes.POINTER(_Err)
    lib.stz_container_open.argtypes = [ctypes.POINTER(P), ctypes.c_char_p, E]
    lib.stz_container_free.argtypes = [P]
    lib.stz_container_header.argtypes, lib.stz_container_header.restype = [P], P
    lib.stz_reader_header.argtypes = [P, ctypes.POINTER(ctypes.c_size_t)]
    lib.stz_reader_header.restype = ctypes.POINTER(ctypes.c_uint8)
    lib.stz_container_read_tensor.argtypes = [P, ctypes.c_char_p, P, ctypes.c_size_t, ctypes.c_int, E]
    lib.stz_status_name.argtypes, lib.stz_status_name.restype = [ctypes.c_int], ctypes.c_char_p
    _lib = lib
    return lib


def _check(lib, status, err):
    if status:
        raise StzError(lib.stz_status_name(status).decode(), err.msg.decode(errors="replace"))


def _is_container(path):
    with open(path, "rb") as f:
        return f.read(8) == b"\x89STZ\r\n\x1a\n"  # docs/FORMAT.md


# ---- dequantization (docs/FORMAT.md) ------------------------------------------

_F8 = np.array([1.0, 1.09050773, 1.18920712, 1.29683955, 1.41421356, 1.54221083, 1.68179283, 1.83400809],
               dtype=np.float32)
_IQ4NL = [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113]


def _u8_scales(c, base):
    m = (c & 127).astype(np.int32)
    v = np.ldexp(np.float32(base) * _F8[m & 7], (m >> 3) - 15).astype(np.float32)
    v = np.where(m == 0, np.float32(0), v)
    return np.where(c & 128, -v, v)


def _levels(m):
    k = 1 << m["bits"]
    if "levels" in m:
        n = np.array(m["levels"], dtype=np.float64)
    else:
        u = (np.arange(k) - k // 2) / (k // 2)
        v = np.array(_IQ4NL) / 127 if k == 16 else u * (0.6 + 0.4 * np.abs(u))
        n = np.sign(v) * np.floor(np.abs(v) * 32767 + 0.5)
    return n.astype(np.float32) / np.float32(32767)


def _codes(q, bits, n):
    b = np.unpackbits(q, axis=-1)[..., : n * bits].reshape(*q.shape[:-1], n, bits)
    return (b.astype(np.int64) << np.arange(bits - 1, -1, -1)).sum(axis=-1)


def _dequant(get, m):
    """The float32 tensor of quantization entry m; get(name) gives stored tensors."""
    shape = m["shape"]
    if m["method"] == "svd":
        u = get(m["U"]).astype(np.float32) * get(m["U_scales"]).astype(np.float32)[:, None]
        s = get(m["S"]).astype(np.float32) * np.float32(m["S_scale"])
        vh = get(m["Vh"]).astype(np.float32) * get(m["Vh_scales"]).astype(np.float32)[:, None]
        return ((u * s) @ vh).reshape(shape)
    bits, n = m["bits"], shape[-1] if len(shape) >= 2 else int(np.prod(shape))
    q = get(m["name"])
    c = _codes(q.view(np.uint8).reshape(-1, q.shape[-1]), bits, n)
    if m["method"] == "nl":
        v = _levels(m)[c]
    elif m["method"] == "asym":
        v = c.astype(np.float32)
    else:
        v = np.where(c >= 1 << (bits - 1), c - (1 << bits), c).astype(np.float32)
    v = v.reshape(*shape[:-1], n) if len(shape) >= 2 else v.reshape(n)

    def per_block(key, one):
        if key in m:
            s = get(m[key])
            s = _u8_scales(s, m["scale_base"]) if m["scale_dtype"] == "U8" else s.astype(np.float32)
            return np.repeat(s, m["block_size"], axis=-1)[..., :n]
        return np.float32(m.get(one, 0))

    return (v * per_block("scales", "scale") + per_block("mins", "min")).reshape(shape)


# ---- reading -------------------------------------------------------------

def _to_framework(a, framework, dtype):
    if dtype is not None:
        a = a.astype(dtype)
    if framework in ("np", "numpy"):
        return a
    if framework in ("pt", "torch"):
        import torch
        return torch.from_numpy(np.ascontiguousarray(a))
    raise ValueError("framework must be 'np' or 'pt', not %r" % framework)


class safe_open:
    """Like safetensors.safe_open: keys(), metadata(), get_tensor(name).

    Quantized tensors appear under their original names and come back as
    float32 (dequantize=True), or, with dequantize=False, every stored tensor
    (codes, scales) as it is. BF16 tensors come back as float32 for numpy
    (bf16_raw=True: their uint16 bits, no copy to widen) and as
    torch.bfloat16 for PyTorch. threads: decoding threads (0: all cores)."""

    def __init__(self, path, framework="np", dequantize=True, threads=0, bf16_raw=False):
        self.path, self.framework, self.dequantize, self.bf16_raw = os.fspath(path), framework, dequantize, bf16_raw
        self.threads = threads or os.cpu_count() or 1
        self._c = None
        if not os.path.isfile(self.path):
            raise StzError("STZ_E_IO", "%s: not a file" % self.path)
        if _is_container(self.path):
            lib, err, c = _library(), _Err(), ctypes.c_void_p()
            _check(lib, lib.stz_container_open(ctypes.byref(c), os.fsencode(self.path), ctypes.byref(err)), err)
            self._c = c
            n = ctypes.c_size_t()
            h = lib.stz_reader_header(lib.stz_container_header(c), ctypes.byref(n))
            header = json.loads(ctypes.string_at(h, n.value))
            self._data = None
        else:
            with open(self.path, "rb") as f:
                head = f.read(8)
                if len(head) < 8:
                    raise StzError("STZ_E_TRUNCATED", "%s: shorter than a SafeTensors header" % self.path)
                n = struct.unpack("<Q", head)[0]
                try:
                    header = json.loads(f.read(n))
                except ValueError as e:
                    raise StzError("STZ_E_JSON", "%s: header is not JSON (%s)" % (self.path, e))
            has_data = os.path.getsize(self.path) > 8 + n  # numpy cannot map zero bytes
            self._data = np.memmap(self.path, dtype=np.uint8, mode="r", offset=8 + n) if has_data else None
        self._meta = header.pop("__metadata__", {}) or {}
        self._stored = header
        self._quant = {}
        owned = set()
        for k, v in self._meta.items():
            if k.startswith("stz.quant.") and k != "stz.quant.version":
                m = json.loads(v)
                m["name"] = k[len("stz.quant."):]
                self._quant[m["name"]] = m
                owned.update(m.get(x) for x in ("scales", "mins", "U", "U_scales", "S", "Vh", "Vh_scales"))
        if dequantize:
            self._keys = [k for k in header if k not in owned and k not in self._quant]
            self._keys += list(self._quant)
        else:
            self._keys = list(header)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        if self._c is not None:
            _library().stz_container_free(self._c)
            self._c = None

    def __del__(self):
        self.close()

    def keys(self):
        return list(self._keys)

    def _decode_all(self):
        """Decodes every chunk at once: later tensors are views of the result."""
        n = max((e["data_offsets"][1] for e in self._stored.values()), default=0)
        lib, err, buf = _library(), _Err(), np.empty(n, dtype=np.uint8)
        _check(lib, lib.stz_container_read_tensor(self._c, None, buf.ctypes.data, buf.nbytes, self.threads,
                                                  ctypes.byref(err)), err)
        self._data = buf

    def metadata(self):
        return {k: v for k, v in self._meta.items() if not k.startswith("stz.quant.")}

    def _stored_tensor(self, name):
        e = self._stored.get(name)
        if e is None:
            raise StzError("STZ_E_ARG", "%s: no tensor named '%s'" % (self.path, name))
        b, end = e["data_offsets"]
        if self._c is not None and self._data is None:
            lib, err = _library(), _Err()
            buf = np.empty(end - b, dtype=np.uint8)
            _check(lib, lib.stz_container_read_tensor(self._c, name.encode(), buf.ctypes.data, buf.nbytes,
                                                      self.threads, ctypes.byref(err)), err)
        else:
            buf = self._data[b:end] if self._data is not None else np.empty(0, np.uint8)
        return buf.view(_KINDS[e["dtype"]]).reshape(e["shape"]), e["dtype"]

    def get_tensor(self, name, dtype=None):
        if self.dequantize and name in self._quant:
            a = _dequant(lambda n: self._stored_tensor(n)[0], self._quant[name])
            return _to_framework(a, self.framework, dtype)
        if name not in self._keys:
            raise StzError("STZ_E_ARG", "%s: no tensor named '%s'" % (self.path, name))
        a, kind = self._stored_tensor(name)
        if kind == "BF16" and not self.bf16_raw:
            if self.framework in ("pt", "torch") and dtype is None:
                import torch
                return torch.from_numpy(np.array(a).view(np.int16)).view(torch.bfloat16)
            a = (a.astype(np.uint32) << 16).view(np.float32)
        # memory-mapped file bytes are copied out; decoded container bytes are ours already
        return _to_framework(np.array(a) if isinstance(self._data, np.memmap) else a, self.framework, dtype)


def load_file(path, framework="np", dequantize=True, dtype=None, bf16_raw=False):
    """Every tensor of a plain, quantized or .stz file, by name (a container
    is decoded whole, on every core, and the tensors are views of it)."""
    with safe_open(path, framework, dequantize, bf16_raw=bf16_raw) as f:
        if f._c is not None:
            f._decode_all()
        return {k: f.get_tensor(k, dtype) for k in f.keys()}


def load_dir(path, framework="np", dequantize=True, dtype=None):
    """A model directory: its shards (model.safetensors.index.json, plain or
    .stz) or its model.safetensors(.stz)."""
    path = os.fspath(path)
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.isfile(index):
        shards = sorted(set(json.load(open(index))["weight_map"].values()))
    else:
        shards = ["model.safetensors"]
    out = {}
    for s in shards:
        f = os.path.join(path, s)
        if not os.path.exists(f) and os.path.exists(f + ".stz"):
            f += ".stz"
        out.update(load_file(f, framework, dequantize, dtype))
    return out


# ---- writing -------------------------------------------------------------

_DTYPES = {np.dtype("<f8"): "F64", np.dtype("<f4"): "F32", np.dtype("<f2"): "F16", np.dtype("<i8"): "I64",
           np.dtype("<i4"): "I32", np.dtype("<i2"): "I16", np.dtype("i1"): "I8", np.dtype("<u8"): "U64",
           np.dtype("<u4"): "U32", np.dtype("<u2"): "U16", np.dtype("u1"): "U8", np.dtype("?"): "BOOL"}


def save_file(tensors, path, metadata=None):
    """Writes a SafeTensors file (numpy arrays or torch tensors; torch
    bfloat16 stays BF16), under a temporary name renamed at the end."""
    header, blobs, off = {}, [], 0
    if metadata:
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
            raise StzError("STZ_E_METADATA", "metadata must map strings to strings")
        header["__metadata__"] = dict(metadata)
    for name, t in tensors.items():
        kind = None
        if type(t).__module__.startswith("torch"):
            import torch
            if t.dtype == torch.bfloat16:
                t, kind = t.detach().cpu().view(torch.int16).numpy().view("<u2"), "BF16"
            else:
                t = t.detach().cpu().numpy()
        a = np.ascontiguousarray(t)
        a = a.astype(a.dtype.newbyteorder("<")) if a.dtype.byteorder == ">" else a
        kind = kind or _DTYPES.get(a.dtype)
        if kind is None:
            raise StzError("STZ_E_DTYPE", "tensor '%s': dtype %s has no SafeTensors name" % (name, a.dtype))
        b = a.tobytes()
        header[name] = {"dtype": kind, "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    tmp = "%s.tmp-%d" % (path, os.getpid())
    try:
        with open(tmp, "wb") as f:
            f.write(struct.pack("<Q", len(h)) + h)
            for b in blobs:
                f.write(b)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


# ---- commands --------------------------------------------------------------

def _program():
    for p in (os.environ.get("STZ"), shutil.which("stz"), os.path.join(_HERE, "..", "..", "build", "stz")):
        if p and os.path.isfile(p) and os.access(p, os.X_OK):
            return p
    raise StzError("STZ_E_IO", "the stz program was not found (install stz, or set STZ to its path)")


def _run(args):
    p = subprocess.run([_program()] + args + ["--json", "-q"], capture_output=True, text=True)
    if p.returncode not in (0, 3):
        line = (p.stderr.strip().splitlines() or ["stz failed"])[-1]
        code = line[line.rfind("[") + 1:-1] if line.endswith("]") else "STZ_E_IO"
        raise StzError(code, line.replace("stz: error: ", ""))
    return json.loads(p.stdout)


def compress(src, dst=None, policy="int4", lossless=False, force=False):
    """stz compress: returns its --json summary."""
    args = ["compress", os.fspath(src)] + (["--lossless"] if lossless else ["--policy", policy])
    return _run(args + (["-o", os.fspath(dst)] if dst else []) + (["-f"] if force else []))


def decompress(src, dst=None, dequantize=False, force=False):
    """stz decompress: returns its --json summary."""
    args = ["decompress", os.fspath(src)] + (["--dequantize"] if dequantize else [])
    return _run(args + (["-o", os.fspath(dst)] if dst else []) + (["-f"] if force else []))


def export_gguf(src, dst, tokenizer=None, type=None, requantize=False, force=False, **options):
    """stz export --gguf: the model as GGUF for llama.cpp; returns its --json
    summary. options become --key value (config, name, threads)."""
    args = ["export", "--gguf", os.fspath(src), "-o", os.fspath(dst)]
    args += (["--tokenizer", os.fspath(tokenizer)] if tokenizer else []) + (["--type", type] if type else [])
    args += (["--requantize"] if requantize else []) + (["-f"] if force else [])
    for k, v in options.items():
        args += ["--" + k.replace("_", "-"), str(v)]
    return _run(args)


def tune(model, dst=None, force=False, **options):
    """stz tune: a policy for a budget, given as size=, ratio=, bits_per_weight=
    or max_kl=; other options become --key value (candidates, sequences,
    seq_len, tokens, plot, ...). Returns the --json report; "met" is False
    (and nothing is written) when the budget cannot be met."""
    args = ["tune", os.fspath(model)] + (["-o", os.fspath(dst)] if dst else []) + (["-f"] if force else [])
    for k, v in options.items():
        args += ["--" + k.replace("_", "-"), os.fspath(v) if isinstance(v, os.PathLike) else str(v)]
    return _run(args)


def evaluate(original, candidate, forward=False, **options):
    """stz eval (forward=True: --forward); options become --key value."""
    args = ["eval", os.fspath(original), os.fspath(candidate)] + (["--forward"] if forward else [])
    for k, v in options.items():
        args += ["--" + k.replace("_", "-"), str(v)]
    return _run(args)
