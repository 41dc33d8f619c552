#!/bin/sh
# Shards in parallel: a generated model (stz synth small, 8 layers, BF16)
# split into 4 shards, compressed (--int4 and --lossless) and decompressed
# with -T 1 and -T 2, best of 3; the outputs must be identical for both.
# Usage: bench/bench_shards.sh [BUILD_DIR] [WORK_DIR]
set -eu
. "$(dirname "$0")/bench_lib.sh"
BUILD=${1:-build}
WORK=${2:-/dev/shm/stz-bench-shards}
STZ=$(cd "$(dirname "$BUILD/stz")" && pwd)/stz
mkdir -p "$WORK"
cd "$WORK"
"$STZ" synth small -o m.safetensors -q -f
rm -rf sh && mkdir sh
python3 - m.safetensors sh 4 <<'P'
import json, struct, sys
src, out, k = sys.argv[1], sys.argv[2], int(sys.argv[3])
b = open(src, "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
meta = h.pop("__metadata__")
names = sorted(h, key=lambda x: h[x]["data_offsets"][0])
wm = {}
for s in range(k):
    f = "model-%05d-of-%05d.safetensors" % (s + 1, k)
    part, hh, data, off = names[s * len(names) // k:(s + 1) * len(names) // k], {}, [], 0
    for name in part:
        a, z = h[name]["data_offsets"]
        hh[name] = dict(h[name], data_offsets=[off, off + z - a])
        data.append(b[8 + n + a: 8 + n + z])
        off += z - a
        wm[name] = f
    hj = json.dumps(hh).encode()
    open(out + "/" + f, "wb").write(struct.pack("<Q", len(hj)) + hj + b"".join(data))
json.dump({"metadata": {"total_size": len(b)}, "weight_map": wm}, open(out + "/model.safetensors.index.json", "w"))
open(out + "/config.json", "w").write(meta["config"])
P
best() { best_time 3 "$@"; } # OUTDIR CMD...
echo "## Shards in parallel ($(nproc) cores, 4 shards of stz synth small, $(du -sb sh | cut -f1) bytes)"
echo
echo "| run | -T 1 (s) | -T 2 (s) | speed-up | outputs identical |"
echo "|---|---|---|---|---|"
for mode in "--policy int4-nl" --lossless; do
    a=$(best c1 "$STZ" compress $mode sh -o c1 -T 1 -q)
    b=$(best c2 "$STZ" compress $mode sh -o c2 -T 2 -q)
    same=$(diff -r c1 c2 >/dev/null && echo yes || echo NO)
    echo "| compress $mode | $a | $b | $(awk "BEGIN { printf \"%.2fx\", $a / $b }") | $same |"
    x=$(best d1 "$STZ" decompress c1 -o d1 -T 1 -q)
    y=$(best d2 "$STZ" decompress c1 -o d2 -T 2 -q)
    same=$(diff -r d1 d2 >/dev/null && echo yes || echo NO)
    echo "| decompress ($mode container) | $x | $y | $(awk "BEGIN { printf \"%.2fx\", $x / $y }") | $same |"
done
cd / && rm -rf "$WORK"
