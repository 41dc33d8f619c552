"""libstz through ctypes: finding it, its structures, and its errors.

Everything the package does goes through the C library: reading (the
validating SafeTensors reader, the container decoder and the dequantizer),
writing (the SafeTensors writer), whole models (stz_compress_model,
stz_tune_run, stz_eval_models) and the other commands (stz_command). Nothing of the file
formats is implemented twice.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
from typing import Any, Callable, Optional

_HERE = os.path.dirname(os.path.abspath(__file__))


class StzError(Exception):
    """An error from stz: `code` is its stable status name (e.g. STZ_E_FORMAT),
    `message` its text (naming the file and the tensor)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__("%s [%s]" % (message, code))
        self.code, self.message = code, message


class Err(ctypes.Structure):  # stz_err (stz.h)
    _fields_ = [("code", ctypes.c_int), ("msg", ctypes.c_char * 1024)]


_U64P = ctypes.POINTER(ctypes.c_uint64)


class Tensor(ctypes.Structure):  # stz_tensor (stz_safetensors.h)
    _fields_ = [("name", ctypes.c_char_p), ("dtype", ctypes.c_int), ("ndim", ctypes.c_int), ("shape", _U64P),
                ("numel", ctypes.c_uint64), ("begin", ctypes.c_uint64), ("end", ctypes.c_uint64)]


class QTensor(ctypes.Structure):  # stz_qtensor (stz_model.h)
    _fields_ = [("name", ctypes.c_char_p), ("dtype", ctypes.c_int), ("ndim", ctypes.c_int), ("shape", _U64P),
                ("numel", ctypes.c_uint64), ("rows", ctypes.c_uint64), ("cols", ctypes.c_uint64),
                ("bits", ctypes.c_int), ("rank", ctypes.c_uint64), ("stored_bytes", ctypes.c_uint64),
                ("method", ctypes.c_char_p), ("block_size", ctypes.c_uint32), ("scale_dtype", ctypes.c_int),
                ("scales_name", ctypes.c_char_p), ("gguf_type", ctypes.c_char_p),
                ("transposed", ctypes.c_int)]


class ModelSet(ctypes.Structure):  # stz_model_set (stz_model.h)
    _fields_ = [("m", ctypes.POINTER(ctypes.c_void_p)), ("n", ctypes.c_size_t)]


class Metrics(ctypes.Structure):  # stz_metrics (stz_eval.h)
    _fields_ = [("cosine", ctypes.c_double), ("rel_frobenius", ctypes.c_double), ("snr_db", ctypes.c_double),
                ("max_abs", ctypes.c_double), ("n", ctypes.c_uint64)]


class EvalRow(ctypes.Structure):  # stz_eval_row (stz_eval.h)
    _fields_ = [("name", ctypes.c_char_p), ("action", ctypes.c_char_p), ("params", ctypes.c_uint64), ("m", Metrics)]


class EvalProblem(ctypes.Structure):  # stz_eval_problem (stz_eval.h)
    _fields_ = [("kind", ctypes.c_int), ("name", ctypes.c_char_p), ("why", ctypes.c_char_p)]


class EvalResult(ctypes.Structure):  # stz_eval_result (stz_eval.h)
    _fields_ = [("rows", ctypes.POINTER(EvalRow)), ("nrows", ctypes.c_size_t),
                ("problems", ctypes.POINTER(EvalProblem)), ("nproblems", ctypes.c_size_t),
                ("count", ctypes.c_size_t * 3), ("compared", ctypes.c_size_t), ("weighted_cosine", ctypes.c_double),
                ("min_cosine", ctypes.c_double), ("params", ctypes.c_uint64), ("params_quantized", ctypes.c_uint64)]


class PolicyRuleText(ctypes.Structure):  # stz_policy_rule_text (stz_policy.h)
    _fields_ = [("text", ctypes.c_char_p), ("keep", ctypes.c_int)]


class PolicySpec(ctypes.Structure):  # stz_policy_spec (stz_policy.h)
    _fields_ = [("policy", ctypes.c_char_p), ("rules", ctypes.POINTER(PolicyRuleText)), ("nrules", ctypes.c_size_t),
                ("method", ctypes.c_char_p), ("block_size", ctypes.c_int), ("feedback", ctypes.c_int)]


class SeqSpec(ctypes.Structure):  # stz_seq_spec (stz_forward.h)
    _fields_ = [("path", ctypes.c_char_p), ("nseq", ctypes.c_size_t), ("len", ctypes.c_size_t),
                ("default_len", ctypes.c_size_t), ("seed", ctypes.c_uint64), ("temperature", ctypes.c_double),
                ("top_p", ctypes.c_double)]


class CompressParams(ctypes.Structure):  # stz_compress_params (stz_pipeline.h)
    _fields_ = [("policy", ctypes.c_void_p), ("imatrix", ctypes.c_void_p), ("feedback_seqs", ctypes.POINTER(SeqSpec)),
                ("config", ctypes.c_char_p), ("threads", ctypes.c_int), ("best", ctypes.c_int),
                ("write_flags", ctypes.c_uint), ("quiet", ctypes.c_int), ("progress", ctypes.c_void_p),
                ("ranks", ctypes.c_void_p), ("feedback_drawn", ctypes.c_void_p)]


class QuantStats(ctypes.Structure):  # stz_quant_stats (stz_pipeline.h)
    _fields_ = [("in_bytes", ctypes.c_uint64), ("out_bytes", ctypes.c_uint64), ("tensors", ctypes.c_size_t),
                ("quantized", ctypes.c_size_t), ("params", ctypes.c_uint64), ("params_quantized", ctypes.c_uint64),
                ("min_cosine", ctypes.c_double), ("weighted_cosine", ctypes.c_double), ("worst", ctypes.c_char * 256)]


class CompressResult(ctypes.Structure):  # stz_compress_result (stz_pipeline.h)
    _fields_ = [("in_bytes", ctypes.c_uint64), ("out_bytes", ctypes.c_uint64), ("files", ctypes.c_size_t),
                ("stats", QuantStats)]


class TuneRunParams(ctypes.Structure):  # stz_tune_run_params (stz_tune.h)
    _fields_ = [("goal", ctypes.c_int), ("amount", ctypes.c_double), ("like", ctypes.c_char_p),
                ("candidates", ctypes.c_char_p), ("imatrix", ctypes.c_char_p), ("calibrate", ctypes.c_int),
                ("seqs", SeqSpec), ("config", ctypes.c_char_p), ("feedback", ctypes.c_int), ("gguf", ctypes.c_int),
                ("no_pad", ctypes.c_int), ("tokenizer", ctypes.c_char_p), ("name", ctypes.c_char_p),
                ("pad_vocab", ctypes.c_int), ("verify", ctypes.c_int), ("threads", ctypes.c_int),
                ("quiet", ctypes.c_int), ("progress", ctypes.c_void_p), ("ranks", ctypes.c_void_p),
                ("out", ctypes.c_char_p), ("scratch", ctypes.c_char_p), ("write_flags", ctypes.c_uint)]


def _candidates() -> list:
    """Where libstz is looked for, in order: $STZ_LIBRARY; the copy installed
    with this package; the build tree beside the sources (running from a
    checkout); the system's (make install)."""
    return [os.environ.get("STZ_LIBRARY"), os.path.join(_HERE, "libstz.so.0"),
            os.path.join(_HERE, "..", "..", "build", "libstz.so.0"), ctypes.util.find_library("stz")]


# argument and result types of every function used: (name, restype, argtypes)
_P, _S, _E = ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(Err)
_PP = ctypes.POINTER(ctypes.c_void_p)
_SIGNATURES = [
    ("stz_status_name", ctypes.c_char_p, [ctypes.c_int]),
    ("stz_version", ctypes.c_char_p, []),
    ("stz_dtype_name", ctypes.c_char_p, [ctypes.c_int]),
    ("stz_dtype_parse", ctypes.c_int, [ctypes.c_char_p, ctypes.POINTER(ctypes.c_int)]),
    ("stz_qmodel_open", ctypes.c_int, [_PP, ctypes.c_char_p, _E]),
    ("stz_qmodel_free", None, [_P]),
    ("stz_qmodel_set_threads", None, [_P, ctypes.c_int]),
    ("stz_qmodel_count", _S, [_P]),
    ("stz_qmodel_tensor", ctypes.POINTER(QTensor), [_P, _S]),
    ("stz_qmodel_reader", _P, [_P]),
    ("stz_qmodel_read_rows", ctypes.c_int, [_P, _S, ctypes.c_uint64, _S, _P, _E]),
    ("stz_qmodel_open_reader", ctypes.c_int, [_PP, _P, _E]),
    ("stz_is_container", ctypes.c_int, [ctypes.c_char_p]),
    ("stz_model_files", ctypes.c_int, [ctypes.c_char_p, ctypes.POINTER(ctypes.POINTER(ctypes.c_char_p)),
                                       ctypes.POINTER(_S), _E]),
    ("stz_model_files_free", None, [ctypes.POINTER(ctypes.c_char_p), _S]),
    ("stz_container_open", ctypes.c_int, [_PP, ctypes.c_char_p, _E]),
    ("stz_container_free", None, [_P]),
    ("stz_container_header", _P, [_P]),
    ("stz_container_original_size", ctypes.c_uint64, [_P]),
    ("stz_container_original_header", _P, [_P, ctypes.POINTER(_S), ctypes.POINTER(ctypes.c_int)]),
    ("stz_container_read_tensor", ctypes.c_int, [_P, ctypes.c_char_p, _P, _S, ctypes.c_int, _E]),
    ("stz_reader_header", _P, [_P, ctypes.POINTER(_S)]),
    ("stz_reader_open_mem", ctypes.c_int, [_PP, _P, _S, ctypes.c_char_p, _E]),
    ("stz_reader_free", None, [_P]),
    ("stz_reader_count", _S, [_P]),
    ("stz_reader_tensor", ctypes.POINTER(Tensor), [_P, _S]),
    ("stz_reader_find", ctypes.c_long, [_P, ctypes.c_char_p]),
    ("stz_reader_meta_count", _S, [_P]),
    ("stz_reader_meta_key", ctypes.c_char_p, [_P, _S]),
    ("stz_reader_meta_value", ctypes.c_char_p, [_P, _S]),
    ("stz_reader_read", ctypes.c_int, [_P, ctypes.POINTER(Tensor), ctypes.c_uint64, _P, _S, _E]),
    ("stz_writer_open", ctypes.c_int, [_PP, ctypes.c_char_p, ctypes.c_uint, _E]),
    ("stz_writer_set_meta", ctypes.c_int, [_P, ctypes.c_char_p, ctypes.c_char_p, _E]),
    ("stz_writer_add", ctypes.c_int, [_P, ctypes.c_char_p, ctypes.c_int, ctypes.c_int, _U64P, _E]),
    ("stz_writer_write", ctypes.c_int, [_P, _P, _S, _E]),
    ("stz_writer_finish", ctypes.c_int, [_P, _E]),
    ("stz_writer_free", None, [_P]),
    ("stz_command", ctypes.c_int, [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p), _PP, _E]),
    ("stz_command_free", None, [_P]),
    ("stz_interrupt_request", None, []),
    ("stz_interrupt_clear", None, []),
    ("stz_struct_size", _S, [ctypes.c_char_p]),
    ("stz_model_set_open", ctypes.c_int, [ctypes.POINTER(ModelSet), ctypes.c_char_p, _E]),
    ("stz_model_set_open_like", ctypes.c_int, [ctypes.POINTER(ModelSet), ctypes.c_char_p, ctypes.POINTER(ModelSet),
                                               _E]),
    ("stz_model_set_free", None, [ctypes.POINTER(ModelSet)]),
    ("stz_eval_models", ctypes.c_int, [ctypes.POINTER(ModelSet), ctypes.POINTER(ModelSet), _P, _P,
                                       ctypes.POINTER(EvalResult), _E]),
    ("stz_eval_result_free", None, [ctypes.POINTER(EvalResult)]),
    ("stz_eval_passed", ctypes.c_int, [ctypes.POINTER(EvalResult), ctypes.c_double, ctypes.c_int,
                                       ctypes.POINTER(_S)]),
    ("stz_policy_for_model", ctypes.c_int, [ctypes.POINTER(PolicySpec), ctypes.c_char_p, ctypes.c_char_p,
                                            ctypes.c_int, ctypes.c_int, _PP, _E, _E]),
    ("stz_policy_free", None, [_P]),
    ("stz_imatrix_load_for", ctypes.c_int, [_PP, ctypes.c_char_p, ctypes.c_char_p, _E]),
    ("stz_imatrix_free", None, [_P]),
    ("stz_compress_output_name", _S, [ctypes.c_char_p, _S, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p]),
    ("stz_compress_model", ctypes.c_int, [ctypes.POINTER(CompressParams), ctypes.c_char_p, ctypes.c_char_p,
                                          ctypes.POINTER(CompressResult), _E]),
    ("stz_policy_feedback", ctypes.c_int, [_P]),
    ("stz_model_is_sharded", ctypes.c_int, [ctypes.c_char_p]),
    ("stz_output_name_for", _S, [ctypes.c_char_p, _S, ctypes.c_char_p, ctypes.c_char_p]),
    ("stz_output_check", ctypes.c_int, [ctypes.c_char_p, ctypes.c_int, _E]),
    ("stz_refuse_input_as_output", ctypes.c_int, [ctypes.c_char_p, ctypes.c_char_p, _E]),
    ("stz_tune_run", ctypes.c_int, [ctypes.POINTER(TuneRunParams), ctypes.c_char_p, _P, _E]),
    ("stz_tune_result_free", None, [_P]),
    ("stz_tune_report_json", _P, [ctypes.POINTER(TuneRunParams), ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int,
                                  _P]),
    ("stz_tune_write_policy", ctypes.c_int, [ctypes.c_char_p, _P, ctypes.c_int, _E]),
    ("stz_tune_write_plot", ctypes.c_int, [ctypes.c_char_p, _P, ctypes.c_int, ctypes.c_int, _E]),
    ("stz_free", None, [_P]),
]

# the structures mirrored here, by their C names
_MIRRORS = [("stz_err", Err), ("stz_tensor", Tensor), ("stz_qtensor", QTensor), ("stz_model_set", ModelSet),
            ("stz_metrics", Metrics), ("stz_eval_row", EvalRow), ("stz_eval_problem", EvalProblem),
            ("stz_eval_result", EvalResult), ("stz_policy_rule_text", PolicyRuleText),
            ("stz_policy_spec", PolicySpec), ("stz_seq_spec", SeqSpec), ("stz_compress_params", CompressParams),
            ("stz_quant_stats", QuantStats), ("stz_compress_result", CompressResult),
            ("stz_tune_run_params", TuneRunParams)]


def check_mirrors(loaded: ctypes.CDLL, path: str, mirrors: list = _MIRRORS) -> None:
    """Each mirrored structure as large as the library's own, or StzError
    naming the library and the structure: a copy of another layout would
    read the wrong bytes."""
    for cname, cls in mirrors:
        size = loaded.stz_struct_size(cname.encode())
        if size != ctypes.sizeof(cls):
            raise StzError("STZ_E_UNSUPPORTED", "%s: its %s is %d bytes, this package's copy %d: the library and the "
                                                "package are of different versions" % (path, cname, size,
                                                                                       ctypes.sizeof(cls)))

_lib: Optional[ctypes.CDLL] = None


def lib() -> ctypes.CDLL:
    """The loaded library, its functions typed (loaded once)."""
    global _lib
    if _lib is not None:
        return _lib
    tried = []
    for path in [p for p in _candidates() if p]:
        try:
            loaded = ctypes.CDLL(path)
            break
        except OSError as e:
            tried.append(str(e))
    else:
        raise StzError("STZ_E_IO", "libstz not found (build it with make, install it with make install, or set "
                                   "STZ_LIBRARY to libstz.so.0); tried: %s" % "; ".join(tried or ["nothing"]))
    for name, res, args in _SIGNATURES:
        f = getattr(loaded, name)
        f.restype, f.argtypes = res, args
    check_mirrors(loaded, path)
    _lib = loaded
    return loaded


def call(fn: Callable[..., int], *args: Any) -> None:
    """Calls fn(*args, &err) and raises StzError if it fails."""
    err = Err()
    status = fn(*args, ctypes.byref(err))
    if status:
        raise StzError(lib().stz_status_name(status).decode(), err.msg.decode(errors="replace"))


def cstr(s: Any, what: str, path: bool = False) -> bytes:
    """s as a C string (a path through os.fsencode, else UTF-8): ValueError
    when it holds a NUL, which C would read as its end (a path, name or key
    cut short there)."""
    b = os.fsencode(s) if path else s.encode("utf-8", "surrogateescape")
    if b"\0" in b:
        raise ValueError("%s %r holds a NUL character" % (what, os.fsdecode(b) if path else s))
    return b


def text(b: Optional[bytes]) -> str:
    """A C string of stz's (UTF-8, checked by the reader) as str."""
    return b.decode("utf-8", errors="surrogateescape") if b is not None else ""
