#!/bin/sh
# stz imatrix's cost against one forward pass over the same tokens (target:
# no more), on the generated Qwen2-0.5B-shaped BF16 model, 4 sequences x 128
# tokens, 2 threads, measured in the same run: `stz imatrix --tokens`
# against `stz eval --forward` of the model with itself on the same tokens
# (two forward passes with logits, then their comparison: half of it is
# taken as one pass). Then the sampled imatrix (sampling is the pass).
# Usage: bench/bench_imatrix.sh [BUILD_DIR] [WORK_DIR]
set -eu
BUILD=${1:-build}
WORK=${2:-/dev/shm/stz-bench}
STZ=$BUILD/stz
mkdir -p "$WORK"
Q=$WORK/qwen2-0.5b.safetensors
T=$WORK/imatrix-tokens.txt
"$STZ" synth qwen2-0.5b -o "$Q" -q -f
start=$(date +%s.%N)
"$STZ" eval "$Q" "$Q" --forward --sequences 4 --seq-len 128 --save-tokens "$T" -f -q -T 2 >/dev/null
e=$(awk "BEGIN { printf \"%.2f\", $(date +%s.%N) - $start }")
secs() { start=$(date +%s.%N); "$@" >/dev/null; awk "BEGIN { printf \"%.2f\", $(date +%s.%N) - $start }"; }
echo "## stz imatrix against one forward pass (4 x 128 tokens, 2 threads)"
echo
a=$(secs "$STZ" imatrix "$Q" --tokens "$T" -o "$WORK/im.gguf" -f -q -T 2)
b=$(secs "$STZ" eval "$Q" "$Q" --forward --tokens "$T" -q -T 2)
c=$(secs "$STZ" imatrix "$Q" --sequences 4 --seq-len 128 -o "$WORK/im.gguf" -f -q -T 2)
echo "| run | seconds |"
echo "|---|---|"
echo "| stz imatrix --tokens | $a |"
echo "| stz eval --forward, the model against itself (two passes) | $b |"
echo "| stz eval --forward, sampling 4 x 128, then two passes | $e |"
echo "| stz imatrix, sampling 4 x 128 (the sampling is the pass) | $c |"
echo
awk "BEGIN { printf \"imatrix --tokens / one forward pass: %.2fx (target <= 1)\\n\", $a / ($b / 2) }"
awk "BEGIN { printf \"sampled imatrix / (eval with sampling - two passes): %.2fx\\n\", $c / ($e - $b) }"
rm -f "$Q" "$T" "$WORK/im.gguf"
