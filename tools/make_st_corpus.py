#!/usr/bin/env python3
"""Writes tests/corpus/safetensors/: hand-made SafeTensors files, each breaking
one rule (or valid in an unusual way), and MANIFEST naming the status code
stz_reader_open must return for each. Re-run after changing the list; the
files are committed so tests need no Python."""
import json, os, struct, sys

out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "tests", "corpus", "safetensors")
os.makedirs(out, exist_ok=True)
cases = []

def raw(name, code, data):
    with open(os.path.join(out, name), "wb") as f:
        f.write(data)
    cases.append((name, code))

def st(name, code, header, data=b"", n=None):
    h = header.encode() if isinstance(header, str) else header
    raw(name, code, struct.pack("<Q", len(h) if n is None else n) + h + data)

T = '"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}'
D8 = bytes(range(8))

# valid files
st("good_minimal.safetensors", "STZ_OK", "{" + T + "}", D8)
st("good_padded.safetensors", "STZ_OK", "{" + T + "}" + " " * 13, D8)
st("good_pretty.safetensors", "STZ_OK", json.dumps({"__metadata__": {"format": "pt"}, "t": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, indent=2) + "\n", D8)
st("good_empty.safetensors", "STZ_OK", "{}")
st("good_meta_only.safetensors", "STZ_OK", '{"__metadata__":{"k":"v","\u00e9":"\u6f22\u5b57"}}'.encode())
st("good_scalar_and_empty.safetensors", "STZ_OK",
   '{"s":{"dtype":"I64","shape":[],"data_offsets":[0,8]},"z":{"dtype":"BF16","shape":[0,7],"data_offsets":[8,8]}}', D8)
st("good_unsorted_header.safetensors", "STZ_OK",
   '{"b":{"dtype":"U8","shape":[2],"data_offsets":[2,4]},"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}', b"abcd")
st("good_subbyte.safetensors", "STZ_OK",
   '{"f4":{"dtype":"F4","shape":[2,3],"data_offsets":[0,3]},"f6":{"dtype":"F6_E2M3","shape":[4],"data_offsets":[3,6]}}', b"123456")
st("good_null_metadata.safetensors", "STZ_OK", '{"__metadata__":null,' + T + "}", D8)

# length prefix and header size
raw("trunc_length.safetensors", "STZ_E_TRUNCATED", b"\x08\x00\x00")
st("header_past_eof.safetensors", "STZ_E_HEADER_SIZE", "{" + T + "}", D8, n=1000)
st("header_over_limit.safetensors", "STZ_E_HEADER_SIZE", "{}", n=100_000_001)
st("header_huge.safetensors", "STZ_E_HEADER_SIZE", "{}", n=2**64 - 1)
st("header_zero.safetensors", "STZ_E_JSON", "")
# JSON level
st("json_invalid.safetensors", "STZ_E_JSON", '{"t":{"dtype":')
st("json_array.safetensors", "STZ_E_JSON", "[1,2]")
st("json_not_utf8.safetensors", "STZ_E_JSON", b'{"\xff\xfe":{}}')
st("json_overlong_utf8.safetensors", "STZ_E_JSON", b'{"\xc0\xaf":{}}')
st("json_trailing.safetensors", "STZ_E_JSON", "{} x")
st("json_nul_escape.safetensors", "STZ_E_JSON", '{"a\\u0000b":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', b"x")
st("json_leading_space.safetensors", "STZ_E_JSON", " {}")
# structure
st("entry_not_object.safetensors", "STZ_E_FORMAT", '{"t":5}')
st("missing_dtype.safetensors", "STZ_E_FORMAT", '{"t":{"shape":[2],"data_offsets":[0,8]}}', D8)
st("missing_shape.safetensors", "STZ_E_FORMAT", '{"t":{"dtype":"F32","data_offsets":[0,8]}}', D8)
st("missing_offsets.safetensors", "STZ_E_FORMAT", '{"t":{"dtype":"F32","shape":[2]}}', D8)
st("dtype_not_string.safetensors", "STZ_E_FORMAT", '{"t":{"dtype":32,"shape":[2],"data_offsets":[0,8]}}', D8)
st("shape_not_array.safetensors", "STZ_E_FORMAT", '{"t":{"dtype":"F32","shape":2,"data_offsets":[0,8]}}', D8)
st("offsets_one_number.safetensors", "STZ_E_FORMAT", '{"t":{"dtype":"F32","shape":[2],"data_offsets":[0]}}', D8)
# dtype
st("dtype_unknown.safetensors", "STZ_E_DTYPE", '{"t":{"dtype":"F128","shape":[2],"data_offsets":[0,8]}}', D8)
st("dtype_lowercase.safetensors", "STZ_E_DTYPE", '{"t":{"dtype":"f32","shape":[2],"data_offsets":[0,8]}}', D8)
# shape
st("shape_negative.safetensors", "STZ_E_SHAPE", '{"t":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}}', D8)
st("shape_fraction.safetensors", "STZ_E_SHAPE", '{"t":{"dtype":"F32","shape":[1.5],"data_offsets":[0,8]}}', D8)
st("shape_string.safetensors", "STZ_E_SHAPE", '{"t":{"dtype":"F32","shape":["2"],"data_offsets":[0,8]}}', D8)
st("shape_above_2p53.safetensors", "STZ_E_SHAPE", '{"t":{"dtype":"U8","shape":[18014398509481984],"data_offsets":[0,8]}}', D8)
st("shape_product_overflow.safetensors", "STZ_E_SHAPE", '{"t":{"dtype":"U8","shape":[4294967296,4294967296],"data_offsets":[0,8]}}', D8)
st("shape_bits_overflow.safetensors", "STZ_E_SHAPE", '{"t":{"dtype":"F64","shape":[2147483648,1073741824],"data_offsets":[0,8]}}', D8)
st("shape_f4_odd.safetensors", "STZ_E_SHAPE", '{"t":{"dtype":"F4","shape":[3],"data_offsets":[0,2]}}', b"ab")
st("shape_too_many_dims.safetensors", "STZ_E_SHAPE", '{"t":{"dtype":"U8","shape":[' + ",".join(["1"] * 65) + '],"data_offsets":[0,1]}}', b"x")
# offsets
st("offsets_size_mismatch.safetensors", "STZ_E_OFFSETS", '{"t":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}}', D8[:4])
st("offsets_reversed.safetensors", "STZ_E_OFFSETS", '{"t":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}}', D8)
st("offsets_fraction.safetensors", "STZ_E_OFFSETS", '{"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8.5]}}', D8)
st("offsets_negative.safetensors", "STZ_E_OFFSETS", '{"t":{"dtype":"F32","shape":[2],"data_offsets":[-8,0]}}', D8)
st("offsets_gap.safetensors", "STZ_E_OFFSETS",
   '{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[4],"data_offsets":[8,12]}}', bytes(12))
st("offsets_not_from_zero.safetensors", "STZ_E_OFFSETS", '{"t":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}}', bytes(8))
st("offsets_overlap.safetensors", "STZ_E_OFFSETS",
   '{"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]},"b":{"dtype":"U8","shape":[8],"data_offsets":[4,12]}}', bytes(12))
st("offsets_past_eof.safetensors", "STZ_E_TRUNCATED", '{"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}', D8[:5])
st("offsets_not_covering.safetensors", "STZ_E_OFFSETS", '{"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}', D8 + b"extra")
# names and metadata
st("duplicate_name.safetensors", "STZ_E_DUPLICATE",
   '{"t":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"t":{"dtype":"U8","shape":[2],"data_offsets":[2,4]}}', b"abcd")
st("metadata_number.safetensors", "STZ_E_METADATA", '{"__metadata__":{"a":1}}')
st("metadata_nested.safetensors", "STZ_E_METADATA", '{"__metadata__":{"a":{"b":"c"}}}')
st("metadata_array.safetensors", "STZ_E_METADATA", '{"__metadata__":["a"]}')
st("metadata_twice.safetensors", "STZ_E_METADATA", '{"__metadata__":{},"__metadata__":{}}')

with open(os.path.join(out, "MANIFEST"), "w") as f:
    f.write("# file expected-status (written by tools/make_st_corpus.py)\n")
    for name, code in cases:
        f.write(f"{name} {code}\n")
print(f"{len(cases)} files in {out}")
