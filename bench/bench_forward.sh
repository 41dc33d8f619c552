#!/bin/sh
# Forward-pass benchmark (stz eval --forward): the generated Qwen2-0.5B-shaped
# BF16 model against its int8-b128 quantization (--int8 when the figures were recorded), 4 sequences x 128 tokens, both
# models, 1 and 2 threads; tokens per second and GFLOP/s against OpenBLAS
# sgemm on the model's own matrix shapes, measured in the same run (target:
# at least 50%). Then the same through the command line, timed; then
# GPT-Neo-1.3B's, Gemma-2-2B's and GPT-2 124M's shapes (4 layers), whose
# shares must be no lower.
# Usage: bench/bench_forward.sh [BUILD_DIR] [WORK_DIR]
set -eu
BUILD=${1:-build}
WORK=${2:-/dev/shm/stz-bench}
STZ=$BUILD/stz
mkdir -p "$WORK"
Q=$WORK/qwen2-0.5b.safetensors
"$STZ" synth qwen2-0.5b -o "$Q" -q -f
"$STZ" quantize --policy int8-b128 --fast "$Q" -o "$WORK/qwen2-0.5b.int8.safetensors" -q -f
echo "## stz forward-pass benchmark"
for T in 1 2; do
    echo
    echo "### $T thread(s)"
    echo
    "$BUILD/forward_bench" "$Q" "$WORK/qwen2-0.5b.int8.safetensors" $T 4 128
done
echo
echo "### stz eval --forward (sampling 4 x 128 tokens from the original, then both models), 2 threads"
echo
start=$(date +%s.%N)
"$STZ" eval "$Q" "$WORK/qwen2-0.5b.int8.safetensors" --forward -T 2 -q
echo "wall time: $(awk "BEGIN { printf \"%.1f\", $(date +%s.%N) - $start }") s"
rm -f "$Q" "$WORK/qwen2-0.5b.int8.safetensors"
# GPT-Neo's path (LayerNorm, GELU, learned positions, local layers),
# Gemma 2's (post-norms, GeGLU, soft-capping, windowed layers) and GPT-2's
# (Conv1D weights read transposed) against the same reference: their
# shares beside the Llama family's above (FAMILIES: some of them)
for A in ${FAMILIES:-gpt-neo-1.3b gemma2-2b gpt2}; do
    G=$WORK/$A.safetensors
    "$STZ" synth $A --layers 4 -o "$G" -q -f
    "$STZ" quantize --policy int8-b128 --fast "$G" -o "$WORK/$A.int8.safetensors" -q -f
    for T in 1 2; do
        echo
        echo "### $A shape, 4 layers, $T thread(s)"
        echo
        "$BUILD/forward_bench" "$G" "$WORK/$A.int8.safetensors" $T 4 128
    done
    rm -f "$G" "$WORK/$A.int8.safetensors"
done
