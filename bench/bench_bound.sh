#!/bin/sh
# Quantized files over 1 MB against their order-0 bound and zstd (issue 52,
# target 6): `stz synth small --layers 2` (hidden 512, vocab 32000; 14 MB of
# BF16 weights) quantized by every stz method at 4 and 8 bits and by
# --int4 / --int8 (llama.cpp's types); per file, `stz pack` (default), the
# order-0 entropy bound of its planes (build/plane_entropy: one histogram per
# dtype and plane over the whole file) and `zstd -19 --long`, in the same
# run, every round trip checked byte for byte. PASS: stz no larger than
# zstd, and within 1% of the bound (stz / bound >= 0.99 as ratios of the
# original size).
# Usage: bench/bench_bound.sh [BUILD_DIR] [WORK_DIR]
set -eu
BUILD=$(cd "${1:-build}" && pwd)
WORK=${2:-/dev/shm/stz-bench-bound}
STZ=$BUILD/stz
. "$(dirname "$0")/bench_lib.sh"
command -v zstd >/dev/null || { echo "skip: no zstd"; exit 0; }
[ -x "$BUILD/plane_entropy" ] || { echo "skip: no $BUILD/plane_entropy (make plane_entropy)"; exit 0; }
mkdir -p "$WORK"
cd "$WORK"
"$STZ" synth small --layers 2 -o m.safetensors -q -f
fails=0 n=0
echo "| file | bytes | stz | order-0 bound | zstd -19 --long | stz / zstd | bound / stz |"
echo "|---|---|---|---|---|---|---|"
row() { # file
    f=$1
    pack_vs_zstd "$f"
    s=$stz_bytes z=$zstd_bytes b=$("$BUILD/plane_entropy" "$f" | head -1 | cut -d' ' -f1)
    echo "| $f | $orig_bytes | $s | $b | $z | $(awk "BEGIN { printf \"%.4fx\", $z / $s }") | $(awk "BEGIN { printf \"%.4f\", $b / $s }") |"
    n=$((n + 1))
    awk "BEGIN { exit !($s > $z || $s > $b * 1.01) }" && fails=$((fails + 1))
    rm -f "$f.stz"
}
for spec in "int8:absmax" "int4:absmax" "int4:mse" "int4:nl" "int4:asym" "int3:nl"; do
    w=${spec%%:*} meth=${spec#*:}
    "$STZ" quantize --set "*=$w:method=$meth" m.safetensors -o m.$w-$meth.safetensors -q -f
    row m.$w-$meth.safetensors
done
for p in int4 int8; do
    "$STZ" quantize --$p m.safetensors -o m.$p.safetensors -q -f
    row m.$p.safetensors
done
echo
echo "$((n - fails)) of $n files no larger than zstd -19 --long and within 1% of the bound"
[ "$fails" -eq 0 ]
