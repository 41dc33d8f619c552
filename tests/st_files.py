"""SafeTensors files read and written with the standard library and numpy
alone: the tests' independent reference for what stz reads and writes."""
import json
import struct

import numpy as np

KINDS = {"F32": "<f4", "BF16": "<u2", "F16": "<f2", "I32": "<i4", "U8": "u1", "I8": "i1"}


def load(path, dtypes=tuple(KINDS)):
    """(tensors, __metadata__); BF16 widened to float32. A dtype not in
    `dtypes` fails the test."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        head = json.loads(f.read(n))
        data = f.read()
    meta = head.pop("__metadata__", {})
    out = {}
    for name, t in head.items():
        b, e = t["data_offsets"]
        assert t["dtype"] in dtypes, (name, t["dtype"])
        a = np.frombuffer(data[b:e], dtype=KINDS[t["dtype"]]).reshape(t["shape"])
        out[name] = (a.astype(np.uint32) << 16).view(np.float32) if t["dtype"] == "BF16" else a
    return out, meta


def save(path, tensors, meta=None):
    """tensors as F32, with __metadata__ `meta` if given."""
    head, off, blobs = ({"__metadata__": meta} if meta is not None else {}), 0, []
    for name, v in tensors.items():
        b = np.ascontiguousarray(v, dtype="<f4").tobytes()
        head[name] = {"dtype": "F32", "shape": list(v.shape), "data_offsets": [off, off + len(b)]}
        off += len(b)
        blobs.append(b)
    h = json.dumps(head).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
