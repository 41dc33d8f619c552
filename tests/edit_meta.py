#!/usr/bin/env python3
"""Writes a copy of a SafeTensors file with one __metadata__ entry changed.

edit_meta.py IN OUT KEY VALUE        sets KEY to VALUE ("-" removes it)
edit_meta.py IN OUT KEY FIELD=VALUE  sets FIELD of the JSON object stored in KEY
(numbers in VALUE become JSON numbers)
edit_meta.py --get IN KEY            prints KEY's value
edit_meta.py --rename IN OUT OLD NEW renames the tensors, OLD replaced by NEW in their names
Standard library only."""
import json
import struct
import sys

if sys.argv[1] == "--get":
    with open(sys.argv[2], "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        print(json.loads(f.read(n))["__metadata__"][sys.argv[3]])
    sys.exit(0)
rename = sys.argv[1] == "--rename"
src, dst, key, value = sys.argv[1 + rename:5 + rename]
with open(src, "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    header = json.loads(f.read(n))
    data = f.read()
meta = header.setdefault("__metadata__", {})
if rename:
    header = {k.replace(key, value): v for k, v in header.items()}
elif "=" in value:
    field, v = value.split("=", 1)
    obj = json.loads(meta[key])
    obj[field] = int(v) if v.lstrip("-").isdigit() else v
    meta[key] = json.dumps(obj, separators=(",", ":"))
elif value == "-":
    del meta[key]
else:
    meta[key] = value
text = json.dumps(header, separators=(",", ":")).encode()
text += b" " * (-len(text) % 8)
with open(dst, "wb") as f:
    f.write(struct.pack("<Q", len(text)) + text + data)
