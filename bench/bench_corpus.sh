#!/bin/sh
# Lossless corpus benchmark (the "never worse than plain zstd" targets):
# per file, in the same run, stz pack (default and --best, 2 threads)
# against whole-file zstd -3 and zstd -19 (-T2), every round trip checked
# byte for byte. Files: stories260K BF16/F32 (shared data, when present),
# stz synth's `small` model dense and pruned (--sparsity 0.5 and 2:4, BF16;
# 0.5 in F32), and a zero-heavy F32 table (mel-filterbank-like triangles,
# masks, an embedding with unused rows), a speech front-end's DFT and
# position tables. Targets: stz >= 0.99x zstd -3's
# ratio, stz --best >= 0.99x zstd -19's.
# Usage: bench/bench_corpus.sh [BUILD_DIR] [WORK_DIR]
set -eu
BUILD=${1:-build}
WORK=${2:-/dev/shm/stz-bench-corpus}
STZ=$BUILD/stz
DATA=$(dirname "$0")/../../shared/data
mkdir -p "$WORK"
fails=0
size() { stat -c %s "$1"; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.4f", a / b }'; }

"$STZ" synth small -o "$WORK/small.bf16.safetensors" -q -f
"$STZ" synth small --sparsity 0.5 -o "$WORK/small.sparse50.bf16.safetensors" -q -f
"$STZ" synth small --sparsity 2:4 -o "$WORK/small.2of4.bf16.safetensors" -q -f
"$STZ" synth small --sparsity 0.5 --dtype f32 -o "$WORK/small.sparse50.f32.safetensors" -q -f
PY=python3 # one with numpy (Debian's python3-numpy)
for p in /usr/bin/python3 python3; do "$p" -c "import numpy" 2>/dev/null && PY=$p && break; done
"$PY" - "$WORK/tables.f32.safetensors" "$WORK/frontend.f32.safetensors" <<'P'
import json, struct, sys
import numpy as np


def save(path, t):
    """t's F32 tensors as a SafeTensors file."""
    head, off, blobs = {}, 0, []
    for name, v in t.items():
        b = np.ascontiguousarray(v, "<f4").tobytes()
        head[name] = {"dtype": "F32", "shape": list(v.shape), "data_offsets": [off, off + len(b)]}
        off += len(b)
        blobs.append(b)
    h = json.dumps(head).encode()
    h += b" " * (-len(h) % 8)
    open(path, "wb").write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


rng = np.random.default_rng(7)
t = {}
# mel filterbanks: triangles over FFT bins, zero elsewhere
for n_mels, n_fft in ((80, 201), (128, 513), (40, 257)):
    fb = np.zeros((n_mels, n_fft), np.float32)
    edges = np.linspace(0, n_fft - 1, n_mels + 2)
    for m in range(n_mels):
        lo, c, hi = edges[m], edges[m + 1], edges[m + 2]
        k = np.arange(n_fft)
        fb[m] = np.clip(np.minimum((k - lo) / (c - lo), (hi - k) / (hi - c)), 0, None)
    t["mel_%d_%d" % (n_mels, n_fft)] = fb
# attention masks and position tables
t["causal_mask"] = np.triu(np.full((512, 512), -1e9, np.float32), 1)
t["window"] = (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(400) / 400)).astype(np.float32)
# an embedding whose last 40% rows were never trained (zero)
e = (rng.standard_normal((8000, 256)) * 0.02).astype(np.float32)
e[4800:] = 0
t["embedding"] = e
# a pruned projection: 70% zeros, the rest trained-like
w = (rng.standard_normal((1024, 1024)) * 0.03).astype(np.float32)
w[rng.random(w.shape) < 0.7] = 0
t["pruned_proj"] = w
save(sys.argv[1], t)
# a speech front-end's tables: DFT bases (values from a small set, scattered: no element repeats
# the one before it) and a sinusoidal position table
t = {}
for n_fft in (400, 512):
    k, n = np.arange(n_fft // 2 + 1)[:, None], np.arange(n_fft)[None, :]
    t["dft%d_real" % n_fft] = np.cos(2 * np.pi * ((k * n) % n_fft) / n_fft).astype(np.float32)
    t["dft%d_imag" % n_fft] = (-np.sin(2 * np.pi * ((k * n) % n_fft) / n_fft)).astype(np.float32)
ang = np.arange(1500)[:, None] / 10000 ** (np.arange(192)[None, :] / 191)
t["positional_embedding"] = np.concatenate([np.sin(ang), np.cos(ang)], 1).astype(np.float32)
save(sys.argv[2], t)
P

echo "## stz lossless corpus benchmark"
echo
echo "$(date -u +%Y-%m-%d), $(nproc) cores; zstd $(zstd -V | grep -o 'v[0-9.]*'); ratios (original / stored)."
echo
echo "| file | MB | stz | zstd -3 | stz / zstd -3 | stz --best | zstd -19 | --best / zstd -19 |"
echo "|---|---|---|---|---|---|---|---|"
set -- "$WORK/small.bf16.safetensors" "$WORK/small.sparse50.bf16.safetensors" "$WORK/small.2of4.bf16.safetensors" \
    "$WORK/small.sparse50.f32.safetensors" "$WORK/tables.f32.safetensors" "$WORK/frontend.f32.safetensors"
[ -f "$DATA/stories260K.bf16.safetensors" ] && set -- "$DATA/stories260K.bf16.safetensors" \
    "$DATA/stories260K.f32.safetensors" "$@"
for F in "$@"; do
    N=$(size "$F")
    "$STZ" pack "$F" -o "$WORK/o.stz" -f -q -T 2
    "$STZ" unpack "$WORK/o.stz" -o "$WORK/o.back" -f -q -T 2 && cmp -s "$F" "$WORK/o.back" || { echo "round trip differs"; exit 1; }
    "$STZ" pack --best "$F" -o "$WORK/b.stz" -f -q -T 2
    "$STZ" unpack "$WORK/b.stz" -o "$WORK/o.back" -f -q -T 2 && cmp -s "$F" "$WORK/o.back" || { echo "round trip differs"; exit 1; }
    zstd -3 -T2 -q -f "$F" -o "$WORK/o.zst"
    zstd -19 -T2 -q -f "$F" -o "$WORK/o19.zst"
    A=$(ratio "$N" "$(size "$WORK/o.stz")") Z=$(ratio "$N" "$(size "$WORK/o.zst")")
    B=$(ratio "$N" "$(size "$WORK/b.stz")") Z19=$(ratio "$N" "$(size "$WORK/o19.zst")")
    R3=$(ratio "$A" "$Z") R19=$(ratio "$B" "$Z19")
    printf "| %s | %.1f | %s | %s | %s | %s | %s | %s |\n" "$(basename "$F")" "$(awk -v n="$N" 'BEGIN { print n / 1e6 }')" \
        "$A" "$Z" "$R3" "$B" "$Z19" "$R19"
    awk -v r="$R3" 'BEGIN { exit !(r < 0.99) }' && { echo "FAIL: $(basename "$F"): stz below 0.99x zstd -3"; fails=$((fails + 1)); }
    awk -v r="$R19" 'BEGIN { exit !(r < 0.99) }' && { echo "FAIL: $(basename "$F"): stz --best below 0.99x zstd -19"; fails=$((fails + 1)); }
done
echo
echo "$fails target(s) missed."
rm -rf "$WORK"
