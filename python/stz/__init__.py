"""stz from Python: read plain, quantized and packed (.stz) SafeTensors
models into numpy (or PyTorch), write SafeTensors, and run stz's commands.

    import stz
    w = stz.load_file("model.int4.safetensors.stz")            # dict of arrays
    with stz.safe_open("model.stz", framework="np") as f:       # one tensor at a time
        emb = f.get_tensor("model.embed_tokens.weight")
    stz.save_file({"w": w["w"]}, "out.safetensors")
    rows = stz.safe_open("model.stz").get_slice("lm_head.weight")[:8]  # reads 8 rows
    stz.compress("model.safetensors", "model.stz", policy="int4")  # its --json summary

Everything goes through libstz (the C library the stz program is built
on): the same validating reader, container decoder and dequantizer, the
same writer, compress, tune, gguf and evaluate through their C entry
points (stz_compress_model, stz_tune_run, stz_eval_models), and the other
commands run in this process (stz_command). Every failure is a StzError carrying stz's status
name and message.
"""
from ._api import (StzError, TensorSlice, command, compress, decompress, evaluate, export_gguf, gguf, load, load_dir,
                   load_file, model_files, safe_open, save, save_file, tune)

__all__ = ["StzError", "TensorSlice", "safe_open", "load_file", "load", "load_dir", "model_files", "save_file", "save",
           "command", "compress", "decompress", "evaluate", "tune", "export_gguf", "gguf", "__version__"]


def __getattr__(name: str) -> str:
    """__version__: the version of the libstz this package runs (stz_version())."""
    if name == "__version__":
        from ._lib import lib, text
        return text(lib().stz_version())
    raise AttributeError("module 'stz' has no attribute %r" % name)


def __dir__() -> list:
    return sorted(__all__)
