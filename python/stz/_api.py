"""stz's Python API (imported by the package's __init__: see its docstring)."""
from __future__ import annotations

import ctypes
import json
import math
import os
import struct
import tempfile
import threading
import time
import warnings
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple, Union

import numpy as np

from . import _lib
from ._lib import Err, StzError, Tensor, call, cstr, lib, text


PathLike = Union[str, "os.PathLike[str]"]

# numpy's view of each SafeTensors dtype (BF16: its bits; F8: its bytes)
_NUMPY = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": "<u2", "I64": "<i8", "I32": "<i4", "I16": "<i2",
          "I8": "i1", "U64": "<u8", "U32": "<u4", "U16": "<u2", "U8": "u1", "BOOL": "?", "C64": "<c8",
          "F8_E4M3": "u1", "F8_E5M2": "u1", "F8_E8M0": "u1", "F8_E4M3FNUZ": "u1", "F8_E5M2FNUZ": "u1"}
_DTYPES = {np.dtype(v): k for k, v in _NUMPY.items() if k not in ("BF16",) and not k.startswith("F8")}


def _to_framework(a: np.ndarray, framework: str, dtype: Any) -> Any:
    if dtype is not None:
        a = a.astype(dtype)
    if framework in ("np", "numpy"):
        return a
    if framework in ("pt", "torch"):
        import torch
        return torch.from_numpy(np.ascontiguousarray(a))
    raise StzError("STZ_E_ARG", "framework must be 'np' or 'pt', not %r" % (framework,))


def _shape(t: Any) -> List[int]:
    return [t.shape[i] for i in range(t.ndim)]


class safe_open:
    """Like safetensors.safe_open: keys(), metadata(), get_tensor(name).

    Opens a plain or quantized SafeTensors file or an .stz container of
    one, checked as the stz program checks it. Quantized tensors appear under
    their original names and come back as float32 (dequantize=True), or,
    with dequantize=False, every stored tensor (codes, scales) as it is.
    BF16 tensors come back as float32 for numpy (bf16_raw=True: their
    uint16 bits) and as torch.bfloat16 for PyTorch; F8 tensors as their
    bytes (uint8). threads: a container's decoding threads (0: all cores)."""

    def __init__(self, path: PathLike, framework: str = "np", dequantize: bool = True, threads: int = 0,
                 bf16_raw: bool = False, _whole: bool = False, _image: Optional[np.ndarray] = None) -> None:
        self.path, self.framework, self.dequantize, self.bf16_raw = os.fspath(path), framework, dequantize, bf16_raw
        self._lib, self._m, self._image, self._mem = lib(), ctypes.c_void_p(), None, ctypes.c_void_p()
        threads = threads or os.cpu_count() or 1
        if _image is not None:
            self._open_image(_image)
        elif _whole and self._lib.stz_is_container(cstr(self.path, "path", True)) == 1:
            self._open_decoded(threads)
        else:
            call(self._lib.stz_qmodel_open, ctypes.byref(self._m), cstr(self.path, "path", True))
            self._lib.stz_qmodel_set_threads(self._m, threads)
        self._r = self._lib.stz_qmodel_reader(self._m)
        if dequantize:  # original names: index in the model's list
            n = self._lib.stz_qmodel_count(self._m)
            self._index = {text(self._lib.stz_qmodel_tensor(self._m, i).contents.name): i for i in range(n)}
        else:  # stored names: index in the file's list
            n = self._lib.stz_reader_count(self._r)
            self._index = {text(self._lib.stz_reader_tensor(self._r, i).contents.name): i for i in range(n)}

    def _open_decoded(self, threads: int) -> None:
        """A container decoded whole on `threads` threads, every checksum and
        the whole-file digest checked, then read as the original file in memory."""
        L, c = self._lib, ctypes.c_void_p()
        call(L.stz_container_open, ctypes.byref(c), cstr(self.path, "path", True))
        try:
            n, gguf = ctypes.c_size_t(), ctypes.c_int()
            L.stz_container_original_header(c, ctypes.byref(n), ctypes.byref(gguf))
            if gguf.value:  # its tensors are the GGUF's bytes, not a model's
                raise StzError("STZ_E_UNSUPPORTED", "%s: holds a GGUF file: unpack it (stz.decompress) and read the "
                               ".gguf with stz's commands" % self.path)
            head = L.stz_reader_header(L.stz_container_header(c), ctypes.byref(n))
            image = np.empty(L.stz_container_original_size(c), dtype=np.uint8)
            image[:8] = np.frombuffer(struct.pack("<Q", n.value), dtype=np.uint8)
            ctypes.memmove(image.ctypes.data + 8, head, n.value)
            data = image[8 + n.value:]
            call(L.stz_container_read_tensor, c, None, data.ctypes.data, data.nbytes, threads)
        finally:
            L.stz_container_free(c)
        self._open_image(image)

    def _open_image(self, image: np.ndarray) -> None:
        """A whole file's bytes in memory, checked as a file is."""
        self._image = image  # the readers point into it
        call(self._lib.stz_reader_open_mem, ctypes.byref(self._mem), image.ctypes.data, image.nbytes,
             cstr(self.path, "path", True))
        call(self._lib.stz_qmodel_open_reader, ctypes.byref(self._m), self._mem)

    def __enter__(self) -> "safe_open":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        if getattr(self, "_m", None):
            self._lib.stz_qmodel_free(self._m)
            self._m = None
        if getattr(self, "_mem", None):
            self._lib.stz_reader_free(self._mem)
            self._mem = None

    def __del__(self) -> None:
        self.close()

    def keys(self) -> List[str]:
        return list(self._index)

    def metadata(self) -> Dict[str, str]:
        """__metadata__ without stz's own description of quantized tensors."""
        r, n = self._r, self._lib.stz_reader_meta_count(self._r)
        pairs = ((text(self._lib.stz_reader_meta_key(r, i)), text(self._lib.stz_reader_meta_value(r, i)))
                 for i in range(n))
        return {k: v for k, v in pairs if not k.startswith("stz.quant.")}

    def _position(self, name: str) -> int:
        if self._m is None:
            raise StzError("STZ_E_ARG", "%s: the file is closed" % self.path)
        i = self._index.get(name)
        if i is None:
            raise StzError("STZ_E_ARG", "%s: no tensor named '%s'" % (self.path, name))
        return i

    def _stored(self, t: Tensor) -> np.ndarray:
        """Tensor t's bytes as the file holds them, viewed as its dtype."""
        kind = text(self._lib.stz_dtype_name(t.dtype))
        buf = np.empty(t.end - t.begin, dtype=np.uint8)
        call(self._lib.stz_reader_read, self._r, ctypes.byref(t), 0, buf.ctypes.data, buf.nbytes)
        if kind not in _NUMPY:  # F4 / F6: packed below a byte
            return buf
        return buf.view(_NUMPY[kind]).reshape(_shape(t))

    def _floats(self, i: int) -> np.ndarray:
        """Quantized tensor i of the model, dequantized by libstz."""
        q = self._lib.stz_qmodel_tensor(self._m, i).contents
        out = np.empty(q.numel, dtype=np.float32)
        call(self._lib.stz_qmodel_read_rows, self._m, i, 0, q.rows, out.ctypes.data)
        if q.transposed:  # stored as its transpose (GPT-2's Conv1D): rows of cols
            return np.ascontiguousarray(out.reshape(q.rows, q.cols).T)
        return out.reshape(_shape(q))

    def _decoded(self, i: int) -> bool:
        """Tensor i comes back dequantized (a quantized tensor read by its original name)."""
        return bool(self.dequantize and self._lib.stz_qmodel_tensor(self._m, i).contents.bits)

    def _file_tensor(self, name: str, i: int) -> Tensor:
        """The file's entry of tensor `name` (position i) stored as it is."""
        ri = self._lib.stz_reader_find(self._r, cstr(name, "tensor name")) if self.dequantize else i
        return self._lib.stz_reader_tensor(self._r, ri).contents

    def _convert(self, a: np.ndarray, kind: str, dtype: Any) -> Any:
        """Values of SafeTensors dtype `kind` for the caller: BF16 as float32
        for numpy (bf16_raw: its uint16 bits), as torch.bfloat16 for PyTorch."""
        if kind == "BF16" and not self.bf16_raw:
            if self.framework in ("pt", "torch") and dtype is None:
                import torch
                return torch.from_numpy(np.ascontiguousarray(a).view(np.int16)).view(torch.bfloat16)
            a = (np.asarray(a).astype(np.uint32) << np.uint32(16)).view(np.float32)
        return _to_framework(a, self.framework, dtype)

    def get_tensor(self, name: str, dtype: Any = None) -> Any:
        i = self._position(name)
        if self._decoded(i):
            return _to_framework(self._floats(i), self.framework, dtype)
        t = self._file_tensor(name, i)
        return self._convert(self._stored(t), text(self._lib.stz_dtype_name(t.dtype)), dtype)

    def get_slice(self, name: str) -> "TensorSlice":
        """Like safetensors' get_slice: the tensor's shape and dtype without
        reading it, and the values of an index, reading only the rows its
        first index selects."""
        return TensorSlice(self, name)


class TensorSlice:
    """safe_open(...).get_slice(name): get_shape(), get_dtype() ("F32" for a
    quantized tensor read dequantized), and slice[index] with numpy's
    indexing; an integer or slice first reads (or decodes) only those rows."""

    def __init__(self, f: safe_open, name: str) -> None:
        self._f, self._name, self._i = f, name, f._position(name)
        self._decoded = f._decoded(self._i)
        t = f._lib.stz_qmodel_tensor(f._m, self._i).contents if self._decoded else f._file_tensor(name, self._i)
        self._shape = _shape(t)
        self._dtype = "F32" if self._decoded else text(f._lib.stz_dtype_name(t.dtype))

    def get_shape(self) -> List[int]:
        return list(self._shape)

    def get_dtype(self) -> str:
        return self._dtype

    def _rows(self, lo: int, hi: int) -> np.ndarray:
        """Rows [lo, hi) of the first dimension as stored (or decoded)."""
        f, shape, kind = self._f, self._shape, self._dtype
        if self._decoded:
            if len(shape) != 2 or f._lib.stz_qmodel_tensor(f._m, self._i).contents.transposed:
                return f._floats(self._i)[lo:hi]
            out = np.empty((hi - lo, shape[1]), dtype=np.float32)
            if hi > lo:
                call(f._lib.stz_qmodel_read_rows, f._m, self._i, lo, hi - lo, out.ctypes.data)
            return out
        t = f._file_tensor(self._name, self._i)
        if not shape:  # a scalar
            return f._stored(t)
        if kind not in _NUMPY:  # F4 / F6: packed below a byte
            return f._stored(t)[lo:hi]
        row = int(np.prod(shape[1:], dtype=np.int64)) * np.dtype(_NUMPY[kind]).itemsize
        buf = np.empty((hi - lo) * row, dtype=np.uint8)
        if buf.nbytes:
            call(f._lib.stz_reader_read, f._r, ctypes.byref(t), lo * row, buf.ctypes.data, buf.nbytes)
        return buf.view(_NUMPY[kind]).reshape([hi - lo] + shape[1:])

    def __getitem__(self, key: Any) -> Any:
        self._f._position(self._name)  # a StzError once the file is closed
        key, shape = key if isinstance(key, tuple) else (key,), self._shape
        first = key[0] if key and shape else None
        if isinstance(first, (int, np.integer)) and not isinstance(first, bool):
            k = int(first) + (shape[0] if first < 0 else 0)
            if not 0 <= k < shape[0]:
                raise IndexError("%s: index %d is out of bounds for axis 0 with size %d" % (self._name, first, shape[0]))
            a = self._rows(k, k + 1)
            rest = (0,) + key[1:]
        elif isinstance(first, slice):
            start, stop, step = first.indices(shape[0])
            lo, hi = (start, max(start, stop)) if step > 0 else (stop + 1, start + 1) if start > stop else (0, 0)
            a = self._rows(lo, hi)
            local = slice(start - lo, stop - lo if stop >= lo else None, step) if hi > lo else slice(0, 0)
            rest = (local,) + key[1:]
        else:  # Ellipsis, None, arrays: the whole tensor, then numpy's indexing
            a, rest = self._rows(0, shape[0] if shape else 0), key
        return self._f._convert(a[rest], self._dtype, None)


def load_file(path: PathLike, framework: str = "np", dequantize: bool = True, dtype: Any = None,
              bf16_raw: bool = False) -> Dict[str, Any]:
    """Every tensor of a plain, quantized or .stz file, by name (a container
    is decoded whole on every core, all its checks made, then read)."""
    with safe_open(path, framework, dequantize, bf16_raw=bf16_raw, _whole=True) as f:
        return {k: f.get_tensor(k, dtype) for k in f.keys()}


def load(data: bytes, framework: str = "np", dequantize: bool = True, dtype: Any = None,
         bf16_raw: bool = False) -> Dict[str, Any]:
    """Like safetensors' load: every tensor of a SafeTensors file (plain or
    quantized) given as bytes, checked as a file is."""
    image = np.frombuffer(data, dtype=np.uint8)
    with safe_open("<bytes>", framework, dequantize, bf16_raw=bf16_raw, _image=image) as f:
        return {k: f.get_tensor(k, dtype) for k in f.keys()}


def model_files(path: PathLike) -> List[str]:
    """The files a model path stands for, as libstz finds them: a file; a
    sharded directory's shards (plain or .stz), checked against its index;
    a directory's model.safetensors(.stz)."""
    files = ctypes.POINTER(ctypes.c_char_p)()
    n = ctypes.c_size_t()
    L = lib()
    call(L.stz_model_files, cstr(os.fspath(path), "path", path=True), ctypes.byref(files), ctypes.byref(n))
    try:
        return [os.fsdecode(files[i]) for i in range(n.value)]
    finally:
        L.stz_model_files_free(files, n)


def load_dir(path: PathLike, framework: str = "np", dequantize: bool = True, dtype: Any = None) -> Dict[str, Any]:
    """Every tensor of a model directory (model_files: its shards, plain or
    .stz, or its model.safetensors(.stz)), by name."""
    out: Dict[str, Any] = {}
    for f in model_files(path):
        out.update(load_file(f, framework, dequantize, dtype))
    return out


# ---- writing -------------------------------------------------------------

def _as_array(name: str, t: Any) -> Tuple[np.ndarray, str]:
    """A tensor's little-endian contiguous array and its SafeTensors dtype."""
    if type(t).__module__.startswith("torch"):
        import torch
        if t.dtype == torch.bfloat16:
            return np.ascontiguousarray(t.detach().cpu().view(torch.int16).numpy().view("<u2")), "BF16"
        t = t.detach().cpu().numpy()
    a = np.ascontiguousarray(t)
    if a.dtype.byteorder == ">":
        a = a.astype(a.dtype.newbyteorder("<"))
    kind = _DTYPES.get(a.dtype)
    if kind is None:
        raise StzError("STZ_E_DTYPE", "tensor '%s': dtype %s has no SafeTensors name" % (name, a.dtype))
    return a, kind


def save_file(tensors: Mapping[str, Any], path: PathLike, metadata: Optional[Mapping[str, str]] = None) -> None:
    """Writes a SafeTensors file with libstz's writer (numpy arrays or torch
    tensors; torch bfloat16 stays BF16): under a temporary name renamed at
    the end, replacing only a regular file. __metadata__ is {"format": "pt"}
    (as PyTorch's writer and transformers expect) updated with `metadata`."""
    L, w = lib(), ctypes.c_void_p()
    arrays = [(name, *_as_array(name, t)) for name, t in tensors.items()]
    call(L.stz_writer_open, ctypes.byref(w), cstr(path, "path", True), 1)  # STZ_WRITE_FORCE
    try:
        for k, v in (metadata or {}).items():
            if not isinstance(k, str) or not isinstance(v, str):
                raise StzError("STZ_E_METADATA", "%s: metadata must map strings to strings" % os.fspath(path))
            call(L.stz_writer_set_meta, w, cstr(k, "metadata key"), cstr(v, "metadata value"))
        for name, a, kind in arrays:
            code = ctypes.c_int()
            L.stz_dtype_parse(kind.encode(), ctypes.byref(code))
            shape = (ctypes.c_uint64 * max(a.ndim, 1))(*a.shape)
            call(L.stz_writer_add, w, cstr(name, "tensor name"), code.value, a.ndim, shape)
        for _, a, _ in arrays:
            call(L.stz_writer_write, w, a.ctypes.data, a.nbytes)
        call(L.stz_writer_finish, w)
    finally:
        L.stz_writer_free(w)


def save(tensors: Mapping[str, Any], metadata: Optional[Mapping[str, str]] = None) -> bytes:
    """Like safetensors' save: the bytes save_file writes for these tensors
    (through a file in a private temporary directory, removed after)."""
    with tempfile.TemporaryDirectory(prefix="stz-save-") as d:
        path = os.path.join(d, "tensors.safetensors")
        save_file(tensors, path, metadata)
        with open(path, "rb") as f:
            return f.read()


# ---- commands --------------------------------------------------------------

def _arguments(options: Mapping[str, Any]) -> List[str]:
    """key=value as --key value (True: --key alone; False, None: left out)."""
    args: List[str] = []
    for k, v in options.items():
        if v is None or v is False:
            continue
        args.append("--" + k.replace("_", "-"))
        if v is not True:
            args.append(os.fspath(v) if isinstance(v, os.PathLike) else str(v))
    return args


def command(name: str, /, *args: Any, **options: Any) -> Dict[str, Any]:
    """Runs `stz NAME ARGS --OPTIONS --json` in this process (libstz's
    stz_command) and returns its JSON document. Exit status 3 (a gate: eval's
    --threshold or --max-kl, tune's budget) returns the document, which says
    what failed; errors raise StzError. Ctrl-C interrupts the command."""
    argv = [name] + [os.fspath(a) if isinstance(a, os.PathLike) else str(a) for a in args]
    argv += _arguments(options) + ["--json"]
    if "-" in argv or "-c" in argv:
        raise StzError("STZ_E_ARG", "stz %s: standard input/output ('-') is not available from Python" % name)
    L, c_argv = lib(), (ctypes.c_char_p * (len(argv) + 1))(*[cstr(a, "argument", True) for a in argv], None)
    out, err = ctypes.c_void_p(), Err()
    try:
        rc = _interruptible(lambda: L.stz_command(len(argv), c_argv, ctypes.byref(out), ctypes.byref(err)))
    except KeyboardInterrupt:
        L.stz_command_free(out)
        raise
    if rc not in (0, 3):
        raise StzError(text(L.stz_status_name(err.code)), err.msg.decode(errors="replace"))
    try:
        return json.loads(ctypes.string_at(out.value).decode()) if out.value else {}
    finally:
        L.stz_command_free(out)


def _interruptible(fn: Callable[[], int]) -> int:
    """fn() (a long libstz call) on a thread, ctypes releasing the GIL, so
    that Ctrl-C reaches Python, which asks stz to stop and re-raises once
    fn returned. Polls a list, not join(): join() interrupted by
    KeyboardInterrupt can report a live thread as done."""
    status: List[int] = []
    threading.Thread(target=lambda: status.append(fn()), daemon=True).start()
    try:
        while not status:
            time.sleep(0.02)
    except KeyboardInterrupt:
        lib().stz_interrupt_request()
        while not status:
            time.sleep(0.02)
        lib().stz_interrupt_clear()  # the next call runs (the flag is process-wide)
        raise
    return status[0]


# error feedback's sequences unless told otherwise (STZ_FEEDBACK_SEQS, stz_forward.h)
_FEEDBACK_SEQS = {"nseq": 16, "len": 0, "default_len": 256, "seed": 1, "temperature": 1.0, "top_p": 0.9}
_POLICY_FEEDBACK_ALL = 1  # STZ_POLICY_FEEDBACK_ALL (stz_policy.h)
_COMPRESS_OPTIONS = {"int4", "int8", "set", "keep", "method", "block_size", "imatrix", "feedback", "fast", "config",
                     "tokens", "sequences", "seq_len", "seed", "best", "no_eval", "threads", "quiet"}


def _fail(L: ctypes.CDLL, err: Err) -> None:
    raise StzError(text(L.stz_status_name(err.code)), err.msg.decode(errors="replace"))


def _usage(cmd: str, message: str) -> None:
    raise StzError("STZ_E_ARG", "stz %s: %s" % (cmd, message))


def _c_name(fn: Callable[..., int], *args: Any) -> str:
    """The name a libstz call of the form fn(dst, cap, ...) -> length writes."""
    n = fn(None, 0, *args) + 1
    buf = ctypes.create_string_buffer(n)
    fn(buf, n, *args)
    return os.fsdecode(buf.value)


def _texts(v: Any) -> List[str]:
    """An option given once (a string) or several times (a list)."""
    return [] if v is None else [v] if isinstance(v, (str, os.PathLike)) else list(v)


def _seq_spec(defaults: Dict[str, Any], o: Dict[str, Any]) -> Any:
    """stz_seq_spec: the defaults, then tokens=, sequences=, seq_len= and seed= as given (the
    structure keeps the path's bytes alive)."""
    seqs = _lib.SeqSpec(**defaults)
    if o.get("tokens") is not None:
        seqs.path = cstr(os.fspath(o["tokens"]), "path", path=True)
    for k, field in (("sequences", "nseq"), ("seq_len", "len"), ("seed", "seed")):
        if o.get(k) is not None:
            setattr(seqs, field, int(o[k]))
    return seqs


def _compress_policy(src: str, policy: Optional[str], o: Dict[str, Any]) -> Tuple[Any, Any, Any]:
    """The policy (stz_policy_for_model: calibrated by default), the importance
    matrix and error feedback's sequences, as stz compress loads them; the
    set= and keep= rules in the order of the keywords, before the policy's."""
    L = lib()
    rules = [_lib.PolicyRuleText(cstr(os.fspath(t), "rule"), k == "keep") for k in o if k in ("set", "keep")
             for t in _texts(o[k])]
    arr = (_lib.PolicyRuleText * max(1, len(rules)))(*rules)
    spec = _lib.PolicySpec(cstr(policy, "policy", True) if policy else None, arr, len(rules),
                           cstr(o["method"], "method") if o.get("method") else None, int(o.get("block_size") or 0),
                           _POLICY_FEEDBACK_ALL if o.get("feedback") else 0)
    seq_keys = [k for k in ("tokens", "sequences", "seq_len", "seed") if o.get(k) is not None]
    seqs = _seq_spec(_FEEDBACK_SEQS, o)
    config = cstr(os.fspath(o["config"]), "path", path=True) if o.get("config") else None
    pol, im, note, err = ctypes.c_void_p(), ctypes.c_void_p(), Err(), Err()
    model = cstr(src, "path", path=True)
    if L.stz_policy_for_model(ctypes.byref(spec), model, config, bool(o.get("fast")), bool(seq_keys),
                              ctypes.byref(pol), ctypes.byref(note), ctypes.byref(err)):
        _fail(L, err)
    if note.msg and not o.get("quiet"):
        warnings.warn("quantized by tensor names alone, without calibration: " + note.msg.decode(errors="replace"))
    if o.get("imatrix") and L.stz_imatrix_load_for(ctypes.byref(im), cstr(os.fspath(o["imatrix"]), "path", path=True),
                                                    model, ctypes.byref(err)):
        L.stz_policy_free(pol)
        _fail(L, err)
    return pol, im, (ctypes.pointer(seqs) if seq_keys else None)


def compress(src: PathLike, dst: Optional[PathLike] = None, policy: Optional[str] = None, lossless: bool = False,
             force: bool = False, **options: Any) -> Dict[str, Any]:
    """stz compress (a file, a folder holding model.safetensors, or a sharded
    directory) through libstz's stz_compress_model; returns the document
    stz compress --json prints. policy: a shipped name or a file (default
    "int4"; int4=True, int8=True name them too); options as the program's
    (set= and keep= rules, a string or a list; method, block_size, imatrix,
    config, tokens, sequences, seq_len, seed, best, no_eval, threads,
    quiet). A model stz runs forward is calibrated on its own sampled
    sequences (error feedback) unless fast=True; one it does not run is
    quantized by names, with a warning saying why. tune=True with a budget
    (size=, bits_per_weight=, ...) chooses the policy instead, as compress
    --tune does, returning tune's report."""
    if options.get("tune"):  # --tune chooses the policy
        if policy or lossless:
            _usage("compress", "'--%s' is not an option of --tune, which chooses the policy itself (its options: stz "
                               "tune --help)" % ("lossless" if lossless else "policy"))
        return _tune("compress", src, dst, force, {k: v for k, v in options.items() if k != "tune"})
    unknown = sorted(set(options) - _COMPRESS_OPTIONS)
    if unknown:
        _usage("compress", "unrecognized option '--%s'" % unknown[0].replace("_", "-"))
    named = [n for n in ("int4", "int8") if options.get(n)] + ([policy] if policy else [])
    if len(set(named)) > 1:
        _usage("compress", "give one policy: '%s' and '%s' conflict" % tuple(sorted(set(named))[:2]))
    given = [k for k in _COMPRESS_OPTIONS - {"best", "no_eval", "threads", "quiet"} if options.get(k)]
    if lossless and (named or given):
        _usage("compress", "--lossless takes no policy options")
    if options.get("fast") and options.get("feedback"):
        _usage("compress", "--fast skips the error feedback --feedback asks for: give one of them")
    if os.fspath(src) == "-" or (dst is not None and os.fspath(dst) == "-"):
        _usage("compress", "standard input/output ('-') is not available from Python")
    policy = None if lossless else named[0] if named else "int4"
    L, src_s = lib(), os.fspath(src)
    dst_s = os.fspath(dst) if dst is not None else _c_name(L.stz_compress_output_name, cstr(src_s, "path", True),
                                                            lossless, cstr(policy, "policy", True) if policy else None)
    pol, im, seqs = ctypes.c_void_p(), ctypes.c_void_p(), None
    if not lossless:
        pol, im, seqs = _compress_policy(src_s, policy, options)
    threads = int(options.get("threads") or os.sysconf("SC_NPROCESSORS_ONLN"))
    p = _lib.CompressParams(pol, im, seqs, cstr(os.fspath(options["config"]), "path", path=True)
                            if options.get("config") else None, threads, bool(options.get("best")),
                            1 if force else 0, 1, None, None, None)  # 1: STZ_WRITE_FORCE; quiet
    r, err = _lib.CompressResult(), Err()
    t0 = time.monotonic()
    try:
        if _interruptible(lambda: L.stz_compress_model(ctypes.byref(p), cstr(src_s, "path", path=True),
                                                       cstr(dst_s, "path", path=True), ctypes.byref(r),
                                                       ctypes.byref(err))):
            _fail(L, err)
        calibrated = bool(pol and L.stz_policy_feedback(pol))
    finally:
        L.stz_policy_free(pol)
        L.stz_imatrix_free(im)
    return _compress_document(src_s, dst_s, "lossless" if lossless else policy or "custom", lossless, calibrated,
                              not lossless and not options.get("no_eval"), r, time.monotonic() - t0)


def _compress_document(src: str, dst: str, mode: str, lossless: bool, calibrated: bool, show_eval: bool,
                       r: Any, secs: float) -> Dict[str, Any]:
    """stz compress --json's document from libstz's stz_compress_result."""
    q = r.stats
    d: Dict[str, Any] = {"input": src, "output": dst, "mode": mode, "files": r.files, "in_bytes": r.in_bytes,
                         "out_bytes": r.out_bytes, "ratio": r.in_bytes / r.out_bytes if r.out_bytes else 0,
                         "seconds": secs}
    if not lossless:
        d.update(tensors_quantized=q.quantized, params_quantized_share=q.params_quantized / q.params if q.params else 0,
                 calibrated=calibrated)
    if show_eval:
        d.update(weighted_cosine=q.weighted_cosine, min_cosine=q.min_cosine, worst_tensor=text(q.worst))
    return d


def decompress(src: PathLike, dst: Optional[PathLike] = None, dequantize: bool = False, force: bool = False,
               **options: Any) -> Dict[str, Any]:
    """stz decompress: returns its --json summary."""
    return command("decompress", src, dequantize=dequantize, output=dst, force=force, **options)


def export_gguf(src: PathLike, dst: PathLike, tokenizer: Optional[PathLike] = None, type: Optional[str] = None,
                requantize: bool = False, force: bool = False, **options: Any) -> Dict[str, Any]:
    """stz export --gguf: the model as GGUF for llama.cpp; returns its --json
    summary. options become --key value (config, name, threads)."""
    return command("export", "--gguf", src, output=dst, tokenizer=tokenizer, type=type, requantize=requantize,
                   force=force, **options)


# tune's sequences unless told otherwise (STZ_TUNE_SEQS, stz_tune.h)
_TUNE_SEQS = {"nseq": 4, "len": 0, "default_len": 64, "seed": 1, "temperature": 1.0, "top_p": 0.9}
# the budgets, as stz_tune_goal numbers them, with their ranges
_BUDGETS = {"size": (0, 1, 1e18), "ratio": (1, 0.01, 1e6), "bits_per_weight": (2, 0.01, 64), "max_kl": (3, 0, 1e9)}
_STZ_TUNE_DATA_BPW, _STZ_TUNE_LIKE = 4, 5
_TUNE_OPTIONS = {"candidates", "imatrix", "tokens", "sequences", "seq_len", "seed", "config", "plot", "fast",
                 "no_pad", "tokenizer", "pad_vocab", "name", "threads", "quiet"}
_NOT_FOR = {"tune": {"like", "save_policy"}, "compress": {"like", "no_verify"},  # options a command does not take
            "gguf": {"ratio", "gguf", "no_verify", "feedback"}}


def _amount(cmd: str, key: str, v: Any) -> float:
    """A budget's amount in its range; --size takes the suffixes K, M, G (powers of 1024) in a string."""
    lo, hi = _BUDGETS[key][1:]
    mul, t = 1.0, str(v)
    if key == "size" and t[-1:] in ("K", "k", "M", "G"):
        mul, t = {"K": 1024.0, "k": 1024.0, "M": 1048576.0, "G": 1073741824.0}[t[-1]], t[:-1]
    try:
        x = float(t) * mul
    except ValueError:
        x = math.nan
    if not lo <= x <= hi:
        _usage(cmd, "--%s takes a number in [%g, %g], not '%s'" % (key.replace("_", "-"), lo, hi, v))
    return x


def _tune_params(cmd: str, o: Dict[str, Any]) -> Tuple[Any, List[Any]]:
    """stz_tune_run_params from tune's options (and what must live while they are used)."""
    gguf = cmd == "gguf" or bool(o.get("gguf"))
    budgets = [k for k in list(_BUDGETS) + ["like"] if o.get(k) is not None]
    if len(budgets) != 1:
        _usage(cmd, "give exactly one budget: " + ("--like, --size, --bits-per-weight or --max-kl" if cmd == "gguf"
                                                    else "--size, --ratio, --bits-per-weight or --max-kl"))
    if o.get("fast") and o.get("feedback"):
        _usage(cmd, "--fast skips the error feedback --feedback asks for: give one of them")
    if o.get("tokens") is not None and any(o.get(k) is not None for k in ("sequences", "seq_len", "seed")):
        _usage(cmd, "--tokens gives the sequences: --sequences, --seq-len and --seed do not apply")
    if not gguf and any(o.get(k) for k in ("tokenizer", "name", "pad_vocab")):
        _usage(cmd, "--tokenizer, --name and --pad-vocab are for --gguf")
    keep: List[Any] = []

    def c(v: Any, path: bool = False) -> Optional[bytes]:
        if v is None:
            return None
        keep.append(cstr(os.fspath(v) if path else str(v), "option", path))
        return keep[-1]

    seqs = _seq_spec(_TUNE_SEQS, o)
    b = budgets[0]
    goal = _STZ_TUNE_LIKE if b == "like" else _BUDGETS[b][0]
    if cmd == "gguf" and goal == _BUDGETS["bits_per_weight"][0]:
        goal = _STZ_TUNE_DATA_BPW  # llama.cpp's count: over the tensors' data
    fast, candidates = bool(o.get("fast")), o.get("candidates")
    p = _lib.TuneRunParams(goal=goal, amount=0 if b == "like" else _amount(cmd, b, o[b]), like=c(o.get("like")),
                           candidates=c(candidates), imatrix=c(o.get("imatrix"), True), calibrate=not fast, seqs=seqs,
                           config=c(o.get("config"), True),
                           feedback=bool(o.get("feedback")) or (not fast and "+fb" not in (candidates or "")),
                           gguf=gguf, no_pad=bool(o.get("no_pad")), tokenizer=c(o.get("tokenizer"), True),
                           name=c(o.get("name")), pad_vocab=bool(o.get("pad_vocab")), verify=not o.get("no_verify"),
                           threads=int(o.get("threads") or os.sysconf("SC_NPROCESSORS_ONLN")), quiet=1)
    return p, keep


def _tune(cmd: str, model: PathLike, dst: Optional[PathLike], force: bool, o: Dict[str, Any]) -> Dict[str, Any]:
    """stz tune, stz compress --tune or stz gguf through libstz's stz_tune_run:
    the outputs checked, the run, the policy and plot written, the report
    (stz_tune_report_json, as --json prints it)."""
    allowed = _TUNE_OPTIONS | set(_BUDGETS) | {"like", "no_verify", "gguf", "feedback", "save_policy"}
    bad = sorted((set(o) - allowed) | (set(o) & _NOT_FOR[cmd]))
    if bad:
        _usage(cmd, "unrecognized option '--%s'" % bad[0].replace("_", "-"))
    L, model_s = lib(), os.fspath(model)
    compress = cmd != "tune"
    if dst is None and compress:
        _usage(cmd, "give -o OUT.gguf" if cmd == "gguf" or o.get("gguf") else "--tune needs -o OUT.stz")
    out = os.fspath(dst) if dst is not None else _c_name(L.stz_output_name_for, cstr(model_s, "path", True),
                                                            b".tune.json")
    p, keep = _tune_params(cmd, o)
    if not p.gguf and out.lower().endswith(".gguf"):
        _usage(cmd, "%s: %s writes %s, not a GGUF file llama.cpp runs: give gguf=True, or use export_gguf"
               % (out, cmd, "an stz container" if compress else "a policy"))
    if compress and not p.verify:
        _usage(cmd, "--tune writes the verified container: --no-verify does not apply")
    out_b, model_b = cstr(out, "path", True), cstr(model_s, "path", True)
    extra = [o.get("save_policy") if compress else o.get("plot"), o.get("plot") if compress else None]
    err = Err()
    for path in [out] + [os.fspath(x) for x in extra if x]:
        if L.stz_output_check(cstr(path, "path", True), force, ctypes.byref(err)):
            _fail(L, err)
    if not compress and L.stz_refuse_input_as_output(model_b, out_b, ctypes.byref(err)):
        _fail(L, err)
    p.out, p.scratch, p.write_flags = out_b if compress else None, out_b, 1 if force else 0
    r = ctypes.create_string_buffer(L.stz_struct_size(b"stz_tune_result"))  # stz_tune_result, read by libstz only
    try:
        if _interruptible(lambda: L.stz_tune_run(ctypes.byref(p), model_b, r, ctypes.byref(err))):
            _fail(L, err)
        doc = L.stz_tune_report_json(ctypes.byref(p), model_b, out_b, compress, r)
        if not doc:
            raise StzError("STZ_E_NOMEM", "out of memory building the JSON document")
        try:
            report = json.loads(ctypes.string_at(doc).decode())
        finally:
            L.stz_free(doc)
        if report["met"] is False and "closest_bytes" in report:
            return report  # nothing written
        policy_out = o.get("save_policy") if compress else out
        if policy_out and L.stz_tune_write_policy(cstr(os.fspath(policy_out), "path", True), r, force,
                                                  ctypes.byref(err)):
            _fail(L, err)
        if o.get("plot") and L.stz_tune_write_plot(cstr(os.fspath(o["plot"]), "path", True), r, p.gguf, force,
                                                   ctypes.byref(err)):
            _fail(L, err)
        return report
    finally:
        L.stz_tune_result_free(r)


def tune(model: PathLike, dst: Optional[PathLike] = None, force: bool = False, **options: Any) -> Dict[str, Any]:
    """stz tune through libstz's stz_tune_run: a policy for a budget, given as
    size= (bytes; a string may end in K, M or G), ratio=, bits_per_weight= or
    max_kl=; other options as the program's (candidates, imatrix, tokens,
    sequences, seq_len, seed, config, plot, no_verify, gguf, tokenizer,
    name, pad_vocab, no_pad, feedback, threads). Calibrated on the model's
    own sequences unless fast=True. Returns the document tune --json prints;
    "met" is False (and nothing is written) when the budget cannot be met.
    The policy goes to dst (default MODEL.tune.json)."""
    return _tune("tune", model, dst, force, options)


def gguf(model: PathLike, dst: PathLike, force: bool = False, **options: Any) -> Dict[str, Any]:
    """stz gguf through libstz's stz_tune_run: the best GGUF file for llama.cpp
    for a budget, given as like= (llama-quantize's type: "q4_k_m"...),
    bits_per_weight= (llama.cpp's count, over the tensors' data), size= or
    max_kl=, calibrated on the model's own sequences (fast=True skips it);
    other options as the program's (tokenizer, tokens, candidates, imatrix,
    config, name, pad_vocab, no_pad, save_policy, plot, threads). Returns the
    document stz gguf --json prints ("met" False, nothing written, when the
    budget cannot be met)."""
    return _tune("gguf", model, dst, force, options)


def _figure(v: float) -> Optional[float]:
    return v if math.isfinite(v) else None  # as --json writes it


def _eval_document(original: str, candidate: str, r: Any, threshold: Optional[float],
                   allow_missing: bool) -> Dict[str, Any]:
    """stz eval --json's document from libstz's stz_eval_result."""
    rows = [r.rows[i] for i in range(r.nrows)]
    names = [[text(r.problems[i].name) for i in range(r.nproblems) if r.problems[i].kind == k] for k in range(3)]
    below = [text(w.name) for w in rows if threshold is not None and w.m.cosine < threshold]
    doc: Dict[str, Any] = {
        "original": original, "candidate": candidate,
        "tensors": [{"name": text(w.name), "action": text(w.action), "params": w.params,
                     "cosine": _figure(w.m.cosine), "rel_frobenius": _figure(w.m.rel_frobenius),
                     "snr_db": _figure(w.m.snr_db), "max_abs_error": _figure(w.m.max_abs)} for w in rows],
        "weighted_cosine": r.weighted_cosine if rows else None, "min_cosine": r.min_cosine if rows else None,
        "params_quantized_share": r.params_quantized / r.params if r.params else 0,
        "tensors_compared": r.compared, "missing_from_candidate": names[0], "only_in_candidate": names[1],
        "mismatched": names[2]}
    if threshold is not None:
        doc.update(threshold=threshold, below_threshold=below)
    doc["passed"] = bool(lib().stz_eval_passed(ctypes.byref(r), -2 if threshold is None else threshold,
                                               allow_missing, None))
    return doc


def evaluate(original: PathLike, candidate: PathLike, forward: bool = False, threshold: Optional[float] = None,
             allow_missing: bool = False, **options: Any) -> Dict[str, Any]:
    """stz eval's --json document: every tensor of the candidate against the
    original (libstz's stz_eval_models; "passed" as the program's exit status
    says it). forward=True compares the models' outputs instead (stz eval
    --forward; options become --key value)."""
    if forward:
        return command("eval", original, candidate, forward=True, threshold=threshold, allow_missing=allow_missing,
                       **options)
    if options:
        raise TypeError("evaluate() takes no option %r without forward=True" % sorted(options)[0])
    if threshold is not None and not -1 <= threshold <= 1:
        raise StzError("STZ_E_ARG", "threshold takes a cosine in [-1, 1], not %r" % (threshold,))
    pa, pb = os.fspath(original), os.fspath(candidate)
    L, a, b, r = lib(), _lib.ModelSet(), _lib.ModelSet(), _lib.EvalResult()
    try:
        call(L.stz_model_set_open, ctypes.byref(a), cstr(pa, "path", path=True))
        call(L.stz_model_set_open_like, ctypes.byref(b), cstr(pb, "path", path=True), ctypes.byref(a))
        err = Err()
        if _interruptible(lambda: L.stz_eval_models(ctypes.byref(a), ctypes.byref(b), None, None, ctypes.byref(r),
                                                    ctypes.byref(err))):
            raise StzError(text(L.stz_status_name(err.code)), err.msg.decode(errors="replace"))
        return _eval_document(pa, pb, r, threshold, allow_missing)
    finally:
        L.stz_eval_result_free(ctypes.byref(r))
        L.stz_model_set_free(ctypes.byref(b))
        L.stz_model_set_free(ctypes.byref(a))
