#!/bin/sh
# Calibration's sampling on a large vocabulary, against a baseline build:
# stz imatrix (sampling 16 x 128 tokens, the importance collected on the
# way) on the Qwen2-0.5B shape cut to 2 layers (151,936-token vocabulary,
# so choosing each token weighs as much as the layers), both programs run
# one after the other, twice, best time each; the files they write (the
# last runs') must be the same bytes. docs/BENCHMARKS.md records the figures.
# Usage: bench/bench_sampling.sh BASELINE_STZ [BUILD_DIR] [WORK_DIR]
set -eu
OLD=$(realpath "$1")
STZ=$(cd "${2:-build}" && pwd)/stz
WORK=${3:-/dev/shm/stz-bench-sampling}
mkdir -p "$WORK"
. "$(dirname "$0")/bench_lib.sh"
cd "$WORK"
"$STZ" synth qwen2-0.5b --layers 2 -o q.safetensors -q -f
old=$(best_time 2 old.gguf "$OLD" imatrix q.safetensors -o old.gguf -T 2 -q)
new=$(best_time 2 new.gguf "$STZ" imatrix q.safetensors -o new.gguf -T 2 -q)
echo "imatrix, 16 x 128 sampled tokens: baseline $old s, this build $new s ($(awk "BEGIN { printf \"%.2f\", $new / $old }")x)"
check "the same importance matrix, byte for byte" "$(cmp -s old.gguf new.gguf && echo 1 || echo 0)"
check "no slower than the baseline" "$new <= 1.05 * $old"
exit "$fails"
