#!/bin/sh
# stz's quantizers for llama.cpp's types against ggml's own, side by side
# (bench/ggml_types_bench.c): importance-weighted error and speed on one
# thread, and whether ggml's to_float reads stz's blocks to stz's values
# bit for bit; and for the types stz reads but does not write, ggml's
# to_float against stz's dequantizer on ggml's own blocks and random bytes.
# The 32-block types on stories260K's 31 matrices (when
# ../shared/data is there), the 256-block types on the generated
# Qwen2-0.5B-shaped model's first two layers (its 4864-wide down_proj rows;
# the other rows, 896 wide, are not whole 256-blocks). ggml is built here
# from a snapshot of github.com/ggml-org/ggml (its ggml-base library, where
# llama-quantize's quantize_* functions live): GGML_SRC names a source tree
# or a git directory (default: the fetch tool's /work/.mirror copy); the
# bench skips when there is none. Never part of the build or the tests.
# Usage: bench/bench_ggml_types.sh [BUILD_DIR] [WORK_DIR]
set -eu
. "$(dirname "$0")/bench_lib.sh"
BUILD=$(cd "${1:-build}" && pwd)
WORK=${2:-/dev/shm/stz-bench-ggml}
SRC=${GGML_SRC:-/work/.mirror/ggml-org+ggml/repo}
HERE=$(cd "$(dirname "$0")" && pwd)
DATA=$HERE/../../shared/data
mkdir -p "$WORK"
if ! source_tree "$SRC" "$WORK/ggml-src"; then
    echo "skip: no ggml source at $SRC (set GGML_SRC)"
    exit 0
fi
G=$TREE
cmake -S "$G" -B "$WORK/ggml-build" -DCMAKE_BUILD_TYPE=Release -DGGML_BUILD_TESTS=OFF -DGGML_BUILD_EXAMPLES=OFF \
    -DGGML_NATIVE=ON >/dev/null
cmake --build "$WORK/ggml-build" --target ggml-base -j2 >/dev/null
ggml_cc ggml_types_bench.c "$BUILD" "$G/include" "$WORK/ggml-build/src" "$WORK/ggml_types_bench"
"$BUILD/stz" synth qwen2-0.5b --layers 2 -o "$WORK/qwen2.safetensors" -q -f
for imatrix in "" --no-imatrix; do
    echo "== ${imatrix:-with the same importance weights}"
    if [ -f "$DATA/stories260K.f32.safetensors" ]; then
        echo "-- stories260K (32-blocks)"
        "$WORK/ggml_types_bench" "$DATA/stories260K.f32.safetensors" $imatrix q4_0 q4_1 q5_0 q5_1 q8_0 iq4_nl
    else
        echo "skip: stories260K (no $DATA)"
    fi
    echo "-- generated Qwen2-0.5B, layers 0-1 (256-blocks)"
    "$WORK/ggml_types_bench" "$WORK/qwen2.safetensors" $imatrix q2_k q3_k q4_k q5_k q6_k iq4_xs
done
echo "== read only: ggml's to_float against stz's dequantizer (ggml's blocks of each tensor, and random bytes)"
"$WORK/ggml_types_bench" "$WORK/qwen2.safetensors" --read tq1_0 tq2_0 mxfp4 nvfp4
