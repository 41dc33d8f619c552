#!/usr/bin/env python3
"""What a container of small tensors could weigh under three designs, against
`zstd -19` of the whole file (issue 52, target 6: docs/BENCHMARKS.md, "Small
files and small tensors against zstd"). A model of the sizes, not a writer:
each tensor is coded alone, by the cheapest of
  - zstd -19 of its bytes (what format 2 does for small tensors),
  - its float planes (byte k of each element) each by zstd -19 or raw,
  - and, in designs B and C, an adaptive binary arithmetic coder: each symbol's
    bits high first, a context per node of a tree over its top 5 bits, then per
    (top bits, bit position); counts with the KT estimator; cost = the ideal
    code length + 4 bytes; on the bytes, on nibbles, and (C) on stz's B-bit
    codes unpacked one per symbol (rows byte-aligned, as docs/FORMAT.md).
Structure: file head, index head and trailer 120 bytes; the header section
zstd -19; A and B: a chunk of its own per tensor over 1 KiB (24-byte record
head, 32-byte index entry, 8 bytes per plane), 14 bytes of shared overhead for
smaller ones; C: tensors up to 16 KiB as members of 64 KiB groups (8 bytes a
member, 56 a group).
Usage: bench/small_pack_model.py FILE.safetensors..."""
import collections, json, math, struct, subprocess, sys


def zstd19(b):
    return len(subprocess.run(["zstd", "-19", "-c", "-q", "--no-check"], input=b, capture_output=True).stdout)


def adaptive(symbols, bits, top=5):
    counts, cost = {}, 0.0
    for s in symbols:
        node = 1
        for i in range(bits - 1, -1, -1):
            bit, depth = (s >> i) & 1, bits - 1 - i
            ctx = ("t", node) if depth < top else ("l", s >> max(bits - top, 0), i)
            c = counts.setdefault(ctx, [0, 0])
            cost -= math.log2((2 * c[bit] + 1) / (2 * (c[0] + c[1]) + 2))
            c[bit] += 1
            node = node * 2 + bit if depth < top else node
    return cost / 8 + 4


def unpacked(d, shape, q):
    bits, rowb, ncol, out = q["bits"], shape[-1], q["shape"][-1], []
    for r in range(0, len(d), rowb):
        s = "".join(format(x, "08b") for x in d[r:r + rowb])
        out += [int(s[i * bits:(i + 1) * bits], 2) for i in range(ncol)]
    return out, bits


def tensor_cost(d, e, q, design):
    best = zstd19(d)
    if e["dtype"] in ("F16", "F32", "BF16"):
        w = 4 if e["dtype"] == "F32" else 2
        planes = [bytes(d[i::w]) for i in range(w)]
        best = min(best, sum(min(zstd19(p), len(p), adaptive(p, 8) if design != "A" else len(p)) + 8
                             for p in planes) - 8)
    if design != "A" and len(d) <= 65536:
        best = min(best, adaptive(d, 8), adaptive([y for x in d for y in (x >> 4, x & 15)], 4))
        if design == "C" and q and q.get("packing") not in (None, "ggml") and q["bits"] < 8:
            best = min(best, adaptive(*unpacked(d, e["shape"], q)))
    return best


def model(path, design):
    f = open(path, "rb").read()
    n = struct.unpack("<Q", f[:8])[0]
    h = json.loads(f[8:8 + n])
    meta = h.pop("__metadata__", {})
    total, grouped = 120 + zstd19(f[:8 + n]), 0
    for name, e in h.items():
        a, b = e["data_offsets"]
        d = f[8 + n + a:8 + n + b]
        q = json.loads(meta.get("stz.quant." + name, "null"))
        small = len(d) <= (16384 if design == "C" else 1024)
        total += tensor_cost(d, e, q, design) + 8 + (0 if design == "C" and small else 14 if small else 56)
        grouped += len(d) if small else 0
    if design == "C":
        total += 56 * math.ceil(grouped / 65536)
    return total, zstd19(f)


if __name__ == "__main__":
    print("| file | zstd -19 | A: format 2 | B: + arithmetic coder | C: + members, codes unpacked |")
    print("|---|---|---|---|---|")
    for p in sys.argv[1:]:
        r = {k: model(p, k) for k in "ABC"}
        z = r["A"][1]
        print("| %s | %d | %s |" % (p.split("/")[-1], z, " | ".join("%d (%.4fx)" % (r[k][0], z / r[k][0]) for k in "ABC")))
