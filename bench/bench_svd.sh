#!/bin/sh
# SVD benchmark.
# 1. Exact vs randomized at rank 128 on the 4864 x 896 and 896 x 4864 F32
#    matrices of the generated Qwen2-0.5B-shaped model, 1 and 2 OpenBLAS
#    threads, with the default q = 1 power iteration (the issue's target)
#    and with q = 2; then the same on GPT-Neo-1.3B-shaped 2048 x 2048 k_proj
#    and 8192 x 2048 MLP matrices.
# 2. Whole policies: SVD on every k_proj of the generated Qwen2-0.5B-shaped
#    model (rank 64: its k_proj are 128 x 896), exact and randomized, and the
#    shipped gpt-neo-surgical policy (exact) and its randomized twin on the
#    generated GPT-Neo-1.3B-shaped model: time, size, cosine of each SVD
#    tensor.
# Usage: bench/bench_svd.sh [BUILD_DIR] [WORK_DIR]
set -eu
BUILD=${1:-build}
WORK=${2:-/dev/shm/stz-bench}
STZ=$BUILD/stz
mkdir -p "$WORK"
Q=$WORK/qwen2-0.5b.f32.safetensors
"$STZ" synth qwen2-0.5b --dtype f32 -o "$Q" -q -f
N=$WORK/gpt-neo-1.3b.bf16.safetensors
"$STZ" synth gpt-neo-1.3b -o "$N" -q -f
echo "## stz SVD benchmark"
echo
for q in 1 2; do
    for T in 1 2; do
        echo "### Rank 128, $T OpenBLAS thread(s), q = $q power iteration(s), oversampling 10, best of 3"
        echo
        "$BUILD/svd_bench" "$Q" 128 $T $q model.layers.0.mlp.gate_proj.weight model.layers.0.mlp.down_proj.weight
        echo
    done
done
for q in 1 2; do
    echo "### GPT-Neo-1.3B-shaped matrices (BF16 read as F32), rank 128, 2 threads, q = $q"
    echo
    "$BUILD/svd_bench" "$N" 128 2 $q transformer.h.3.attn.attention.k_proj.weight transformer.h.3.mlp.c_fc.weight
    echo
done

# quantize MODEL with POLICY; prints time, RSS, size and the SVD tensors' cosines
run_policy() {
    /usr/bin/time -f "%e %M" -o "$WORK/time" "$STZ" quantize --policy "$2" "$1" -o "$WORK/svd.safetensors" -f -q
    set -- "$1" "$2" $(cat "$WORK/time")
    IN=$(stat -c %s "$1")
    OUT=$(stat -c %s "$WORK/svd.safetensors")
    echo "quantize: $3 s, peak RSS $(($4 / 1024)) MiB; $IN -> $OUT bytes ($(awk -v a="$IN" -v b="$OUT" 'BEGIN{printf "%.3f", a/b}')x before packing)"
    echo
    echo "| SVD tensor | cosine | rel. error |"
    echo "|---|---|---|"
    "$STZ" eval "$1" "$WORK/svd.safetensors" --csv | grep ',svd,' |
        awk -F, '{ gsub(/"/, "", $1); printf "| %s | %.6f | %.4f |\n", $1, $4, $5; if (min == "" || $4 < min) min = $4 } END { printf "\nminimum cosine of the SVD tensors: %.6f\n", min }'
    echo
    rm -f "$WORK/svd.safetensors" "$WORK/time"
}

QB=$WORK/qwen2-0.5b.bf16.safetensors
"$STZ" synth qwen2-0.5b -o "$QB" -q -f
for METHOD in exact randomized; do
    P=$WORK/qwen-kproj-$METHOD.json
    cat > "$P" <<JSON
{"default": "keep", "rules": [
  {"match": "*.self_attn.k_proj.weight", "action": "svd", "rank": 64, "method": "$METHOD", "fallback": "int8"}]}
JSON
    echo "### SVD (rank 64, $METHOD) on every k_proj of qwen2-0.5b BF16 synthetic ($(stat -c %s "$QB") bytes), 2 threads"
    echo
    run_policy "$QB" "$P"
    rm -f "$P"
done
echo "### gpt-neo-surgical (exact) on gpt-neo-1.3b BF16 synthetic ($(stat -c %s "$N") bytes), 2 threads"
echo
"$STZ" plan --policy gpt-neo-surgical "$N" 2>/dev/null | grep -c "svd/r128" | sed 's/^/tensors with rank-128 SVD: /'
echo
run_policy "$N" gpt-neo-surgical
P=$WORK/neo-surgical-randomized.json
cat > "$P" <<JSON
{"default": "keep", "rules": [
  {"match": "*.mlp.*", "action": "keep"},
  {"match": "transformer.h.4.attn.attention.k_proj.weight", "action": "keep"},
  {"match": "*.attn.attention.k_proj.weight", "action": "svd", "rank": 128, "method": "randomized", "fallback": "int8"}]}
JSON
echo "### The same policy with \"method\": \"randomized\" (q = 1), 2 threads"
echo
run_policy "$N" "$P"
rm -f "$P"
