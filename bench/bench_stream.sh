#!/bin/sh
# Streaming compress: `stz compress --int4` (quantized tensors go straight
# into the container's chunk encoder, no intermediate file) against the
# two-stage path it replaced (`stz quantize` to a file, then `stz pack` of
# that file), on the generated Qwen2-0.5B-shaped BF16 model, with -T 1 and
# -T 2, best of RUNS; the two containers must be byte-identical. Also
# --int8 and --lossless (which was already one pass) for reference.
# Usage: bench/bench_stream.sh [BUILD_DIR] [WORK_DIR] [RUNS]
set -eu
. "$(dirname "$0")/bench_lib.sh"
BUILD=${1:-build}
WORK=${2:-/dev/shm/stz-bench-stream}
RUNS=${3:-3}
STZ=$(cd "$(dirname "$BUILD/stz")" && pwd)/stz
mkdir -p "$WORK"
cd "$WORK"
"$STZ" synth qwen2-0.5b -o m.safetensors -q -f
N=$(stat -c %s m.safetensors)
best() { # "seconds peak_kb" of the fastest of RUNS runs of sh -c "$1"
    b=""
    for i in $(seq "$RUNS"); do
        rm -f q.safetensors two.stz one.stz
        /usr/bin/time -f "%e %M" -o time sh -c "$1"
        t=$(cat time)
        if [ -z "$b" ] || [ "$(echo "$t $b" | awk '{print ($1 < $3)}')" = 1 ]; then b=$t; fi
    done
    echo "$b"
}
echo "## Streaming compress"
echo
echo "$(date -u +%Y-%m-%d), qwen2-0.5b BF16 synthetic ($N bytes) in $WORK, best of $RUNS runs;"
echo "two-stage = \`stz quantize\` to a file, then \`stz pack\` of it (what \`stz compress\` did before)."
echo
echo "| mode | -T | two-stage s | one pass s | speed-up | one pass MB/s | one pass peak RSS MiB | identical |"
echo "|---|---|---|---|---|---|---|---|"
for mode in "--policy int4-nl" "--policy int8-b128"; do # --int4 / --int8 when the figures were recorded
    for T in 1 2; do
        two=$(best "'$STZ' quantize m.safetensors $mode -o q.safetensors -q -T $T && '$STZ' pack q.safetensors -o two.stz -q -T $T")
        one=$(best "'$STZ' compress m.safetensors $mode -o one.stz -q -T $T")
        "$STZ" quantize m.safetensors $mode -o q.safetensors -q -T $T -f
        "$STZ" pack q.safetensors -o two.stz -q -T $T -f
        same=no
        cmp -s two.stz one.stz && same=yes
        set -- $two
        ts=$1
        set -- $one
        os=$1 orss=$2
        up=$(awk "BEGIN { printf \"%.2f\", $ts / $os }")
        echo "| $mode | $T | $ts | $os | ${up}x | $(awk "BEGIN { printf \"%.0f\", $N / $os / 1e6 }") | $((orss / 1024)) | $same |"
        [ "$same" = yes ] || fails=$((fails + 1))
        [ "$mode" = "--policy int4-nl" ] && eval "up_$T=$up"
    done
done
one=$(best "'$STZ' compress m.safetensors --lossless -o one.stz -q -T 2")
set -- $one
echo "| --lossless | 2 | - | $1 | - | $(awk "BEGIN { printf \"%.0f\", $N / $1 / 1e6 }") | $(($2 / 1024)) | - |"
echo
check "compress --policy int4-nl one pass >= 1.3x the two-stage path, -T 1 (${up_1}x)" "$up_1 >= 1.3"
check "compress --policy int4-nl one pass >= 1.3x the two-stage path, -T 2 (${up_2}x)" "$up_2 >= 1.3"
rm -f q.safetensors two.stz one.stz time
exit $((fails > 0))
