#!/bin/sh
# What the default calibration buys and costs: stz quantize with each
# shipped width (--int4, --int8, the int4-nl policy, an all-int3 rule)
# calibrated (the default) and with --fast, on stories260K F32 (shared data,
# when present) and a generated two-layer `small` model: bytes (equal: the
# format does not change), mean KL of the model's outputs (stz eval
# --forward, 16 held-out sequences, seed 7) and wall time, both run here
# one after the other, so the ratios hold on a shared machine.
# docs/BENCHMARKS.md records the figures and the decision.
# Usage: bench/bench_calibrated_default.sh [BUILD_DIR] [WORK_DIR] [SHARED_DATA_DIR]
set -eu
STZ=$(cd "${1:-build}" && pwd)/stz
WORK=${2:-/dev/shm/stz-bench-calibrated}
DATA=${3:-$(dirname "$0")/../../shared/data}
if [ -d "$DATA" ]; then DATA=$(cd "$DATA" && pwd); fi
mkdir -p "$WORK"
. "$(dirname "$0")/bench_lib.sh"
stories_and_small "$WORK" "$DATA"
cd "$WORK"

kl() {
    "$STZ" eval --forward --json --sequences 16 --seed 7 "$1" "$2" |
        python3 -c 'import json, sys; print("%.4g" % json.load(sys.stdin)["kl"]["mean"])'
}

printf '%-28s %-10s %10s %10s %10s %7s %8s %8s %7s\n' model policy bytes "KL fast" "KL calib" "KL x" \
    "s fast" "s calib" "time x"
for m in $MODELS; do
    for p in --int4 --int8 "--policy int4-nl" "--set *=int3:block_size=32:method=nl"; do
        # shellcheck disable=SC2086 # $p is two words on purpose
        tf=$(best_time 1 "$WORK/fast.safetensors" "$STZ" quantize -q $p --fast "$m" -o "$WORK/fast.safetensors")
        # shellcheck disable=SC2086
        tc=$(best_time 1 "$WORK/cal.safetensors" "$STZ" quantize -q $p "$m" -o "$WORK/cal.safetensors")
        bf=$(stat -c %s "$WORK/fast.safetensors") bc=$(stat -c %s "$WORK/cal.safetensors")
        [ "$bf" = "$bc" ] || { echo "bytes differ: $bf against $bc ($p)" >&2; exit 1; }
        kf=$(kl "$m" "$WORK/fast.safetensors") kc=$(kl "$m" "$WORK/cal.safetensors")
        printf '%-28s %-10s %10s %10s %10s %7.3f %8.2f %8.2f %7.0f\n' "$(basename "$m")" "${p##* }" "$bf" "$kf" \
            "$kc" "$(echo "$kc / $kf" | bc -l)" "$tf" "$tc" "$(echo "$tc / $tf" | bc -l)"
    done
done
