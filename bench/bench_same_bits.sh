#!/bin/sh
# The cost of the same bits everywhere (issue 52): `stz eval --forward` and
# `stz tune` of the generated Qwen2-0.5B-shaped model on 2 threads, with this
# build and with a build of BASE (the last commit whose forward pass took its
# products from OpenBLAS), side by side in one run; target: new / old <= 1.15.
# Then kernel by kernel (bench/factor_bench.c): stz's products and Gram
# matrices against OpenBLAS sgemm/ssyrk, error feedback's factorisation
# against LAPACK's. Nothing else should run meanwhile.
# (tests/test_same_bits.sh checks the outputs under every kernel copy.)
# Usage: bench/bench_same_bits.sh [BUILD_DIR] [BASE_REV] [WORK_DIR]
set -eu
BUILD=${1:-build}
BASE=${2:-a4311e0}
WORK=${3:-/dev/shm/stz-bench-bits}
NEW=$(cd "$BUILD" && pwd)/stz
ROOT=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$WORK"
OLD_SRC=$WORK/base-src
if [ ! -x "$OLD_SRC/build/stz" ]; then
    rm -rf "$OLD_SRC"
    mkdir -p "$OLD_SRC"
    git -C "$ROOT" archive "$BASE" | tar -x -C "$OLD_SRC"
    cmake -S "$OLD_SRC" -B "$OLD_SRC/build" -DCMAKE_BUILD_TYPE=Release >/dev/null
    cmake --build "$OLD_SRC/build" -j 2 --target stz_cli >/dev/null
fi
OLD=$OLD_SRC/build/stz
cd "$WORK"
[ -f q.safetensors ] || "$NEW" synth qwen2-0.5b -o q.safetensors -q -f
[ -f q4.safetensors ] || "$NEW" quantize --int4 q.safetensors -o q4.safetensors -q -f
[ -f small.safetensors ] || "$NEW" synth small -o small.safetensors -q -f
secs() { # command...: wall seconds
    s=$(date +%s.%N)
    "$@" >/dev/null 2>&1
    awk "BEGIN { printf \"%.1f\", $(date +%s.%N) - $s }"
}
echo "## same bits everywhere: cost (Qwen2-0.5B shape, 2 threads; base $BASE)"
echo
echo "| command | base (s) | this build (s) | ratio | target |"
echo "|---|---|---|---|---|"
fails=0
row() { # label command-args...
    label=$1; shift
    o=$(secs "$OLD" "$@")
    n=$(secs "$NEW" "$@")
    r=$(awk "BEGIN { printf \"%.2f\", $n / $o }")
    v=$(awk "BEGIN { print ($r <= 1.15) ? \"PASS\" : \"FAIL\" }")
    [ "$v" = PASS ] || fails=$((fails + 1))
    echo "| $label | $o | $n | ${r}x | $v (<= 1.15x) |"
}
row "eval --forward (4 x 128 sampled, both models)" eval q.safetensors q4.safetensors --forward -T 2 -q
row "tune --bits-per-weight 4.5" tune q.safetensors --bits-per-weight 4.5 -o t.json -f -T 2 -q
row "tune --bits-per-weight 4.5, synth small" tune small.safetensors --bits-per-weight 4.5 -o s.json -f -T 2 -q
for T in 1 2; do
    echo
    "$(dirname "$NEW")/factor_bench" $T
done
exit $fails
