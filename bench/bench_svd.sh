#!/bin/sh
# SVD benchmark: exact vs randomized at rank 128 on the 4864 x 896 and
# 896 x 4864 F32 matrices of the generated Qwen2-0.5B-shaped model (1 and
# 2 OpenBLAS threads), then the gpt-neo-surgical policy (rank-128 SVD on
# every k_proj but layer 4) on the generated GPT-Neo-1.3B-shaped model:
# time, ratio, cosine of each SVD tensor.
# Usage: bench/bench_svd.sh [BUILD_DIR] [WORK_DIR]
set -eu
BUILD=${1:-build}
WORK=${2:-/dev/shm/stz-bench}
STZ=$BUILD/stz
mkdir -p "$WORK"
Q=$WORK/qwen2-0.5b.f32.safetensors
"$STZ" synth qwen2-0.5b --dtype f32 -o "$Q" -q -f
echo "## stz SVD benchmark"
echo
for T in 1 2; do
    echo "### Rank 128, $T OpenBLAS thread(s), q = 2 power iterations, oversampling 10, best of 3"
    echo
    "$BUILD/svd_bench" "$Q" 128 $T 2 model.layers.0.mlp.gate_proj.weight model.layers.0.mlp.down_proj.weight
    echo
done
N=$WORK/gpt-neo-1.3b.bf16.safetensors
"$STZ" synth gpt-neo-1.3b -o "$N" -q -f
echo "### gpt-neo-surgical on gpt-neo-1.3b BF16 synthetic ($(stat -c %s "$N") bytes)"
echo
"$STZ" plan --policy gpt-neo-surgical "$N" 2>/dev/null | grep -c "svd/r128" | sed 's/^/tensors with rank-128 SVD: /'
/usr/bin/time -f "%e %M" -o "$WORK/time" "$STZ" quantize --policy gpt-neo-surgical "$N" -o "$WORK/neo.svd.safetensors" -f -q
set -- $(cat "$WORK/time")
OUT=$(stat -c %s "$WORK/neo.svd.safetensors")
echo "quantize: $1 s, peak RSS $(($2 / 1024)) MiB; $(stat -c %s "$N") -> $OUT bytes ($(awk -v a="$(stat -c %s "$N")" -v b="$OUT" 'BEGIN{printf "%.3f", a/b}')x before packing)"
echo
echo "| SVD tensor | cosine | rel. error |"
echo "|---|---|---|"
"$STZ" eval "$N" "$WORK/neo.svd.safetensors" --csv | grep ',int8,' | grep k_proj |
    awk -F, '{ gsub(/"/, "", $1); printf "| %s | %.6f | %.4f |\n", $1, $4, $5; if (min == "" || $4 < min) min = $4 } END { printf "\nminimum cosine of the SVD tensors: %.6f\n", min }'
rm -f "$WORK/neo.svd.safetensors" "$WORK/time"
