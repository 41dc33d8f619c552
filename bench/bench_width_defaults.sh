#!/bin/sh
# Which method a policy's "int4" / "int8" takes when it names none: every
# method at the same layout (blocks of 128, F16 scales: the same bytes), the
# model's outputs measured by stz eval --forward (mean KL over its default
# held-out sequences) on stories260K F32 (shared data, when present) and a
# generated two-layer `small` model. docs/BENCHMARKS.md records the figures
# and the choice (nl for int4, mse for int8; docs/POLICY.md).
# Usage: bench/bench_width_defaults.sh [BUILD_DIR] [WORK_DIR] [SHARED_DATA_DIR]
set -eu
STZ=$(cd "${1:-build}" && pwd)/stz
WORK=${2:-/dev/shm/stz-bench-width}
DATA=${3:-$(dirname "$0")/../../shared/data}
mkdir -p "$WORK"
. "$(dirname "$0")/bench_lib.sh"
stories_and_small "$WORK" "$DATA"
printf '%-28s %-6s %-7s %12s %10s\n' model width method bytes "mean KL"
for m in $MODELS; do
    for wm in 4:absmax 4:mse 4:full 4:nl 4:asym 8:absmax 8:mse 8:full; do
        w=${wm%%:*} meth=${wm#*:}
        "$STZ" quantize -q -f --set "*=int$w:method=$meth:block_size=128:scale_dtype=F16:min_ndim=2" "$m" \
            -o "$WORK/q.safetensors"
        kl=$("$STZ" eval --forward --json "$m" "$WORK/q.safetensors" |
            python3 -c 'import json, sys; print("%.4g" % json.load(sys.stdin)["kl"]["mean"])')
        printf '%-28s int%-3s %-7s %12s %10s\n' "$(basename "$m")" "$w" "$meth" "$(stat -c %s "$WORK/q.safetensors")" "$kl"
    done
done
