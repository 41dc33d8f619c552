#!/bin/sh
# Unpack at I/O speed (issue 14's targets): the generated Qwen2-0.5B-shaped
# BF16 model packed once, then, best of RUNS, file to file on WORK_DIR
# (tmpfs): `cp` of the model, `stz unpack` with 1 and 2 threads (the output
# deleted before each run, as cp's), and `stz verify` (decoding and
# checksums without writing). Targets: unpack -T 1 >= 75% of cp's speed;
# -T 2 >= 1.8x that.
# Usage: bench/bench_unpack.sh [BUILD_DIR] [WORK_DIR] [RUNS]
set -eu
. "$(dirname "$0")/bench_lib.sh"
BUILD=${1:-build}
WORK=${2:-/dev/shm/stz-bench-unpack}
RUNS=${3:-5}
STZ=$(cd "$(dirname "$BUILD/stz")" && pwd)/stz
mkdir -p "$WORK"
cd "$WORK"
"$STZ" synth qwen2-0.5b -o m.safetensors -q -f
"$STZ" pack m.safetensors -o m.stz -q -f
N=$(stat -c %s m.safetensors)
best() { best_time "$RUNS" out.safetensors "$@"; } # CMD...: out.safetensors removed before each run
cp_s=$(best cp m.safetensors out.safetensors)
u1=$(best "$STZ" unpack -q -T 1 m.stz -o out.safetensors)
u2=$(best "$STZ" unpack -q -T 2 m.stz -o out.safetensors)
cmp m.safetensors out.safetensors
v1=$(best "$STZ" verify -q -T 1 m.stz)
v2=$(best "$STZ" verify -q -T 2 m.stz)
mbs() { awk -v n="$N" -v t="$1" 'BEGIN { printf "%.0f", n / t / 1e6 }'; }
echo "## Unpack against cp"
echo
echo "$(date -u +%Y-%m-%d), qwen2-0.5b-shaped BF16 synthetic ($N bytes) in $WORK, best of $RUNS runs."
echo
echo "| run | s | MB/s | share of cp's speed |"
echo "|---|---|---|---|"
for r in "cp:$cp_s" "stz unpack -T 1:$u1" "stz unpack -T 2:$u2" "stz verify -T 1 (no output):$v1" "stz verify -T 2 (no output):$v2"; do
    name=${r%:*} t=${r##*:}
    echo "| $name | $t | $(mbs "$t") | $(awk -v c="$cp_s" -v t="$t" 'BEGIN { printf "%.0f%%", 100 * c / t }') |"
done
echo
check "unpack -T 1 at $(awk -v c="$cp_s" -v t="$u1" 'BEGIN { printf "%.0f", 100 * c / t }')% of cp's speed (target >= 75%)" "$cp_s / $u1 >= 0.75"
check "unpack -T 2 at $(awk -v c="$cp_s" -v t="$u2" 'BEGIN { printf "%.2f", c / t / 0.75 }')x 75% of cp's speed (target >= 1.8x)" "$cp_s / $u2 >= 1.8 * 0.75"
rm -f m.safetensors m.stz out.safetensors
rmdir "$WORK" 2>/dev/null || true
