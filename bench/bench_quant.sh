#!/bin/sh
# Quantization benchmark: the shipped policies (and the lower-error INT4
# variant) on the generated Qwen2-0.5B-shaped BF16 model: output size,
# time, throughput, peak RSS, minimum and parameter-weighted cosine over the
# quantized tensors. Checks the quantization issue's targets at the end.
#
# Usage: bench/bench_quant.sh [BUILD_DIR] [WORK_DIR] [RUNS]
set -eu
. "$(dirname "$0")/bench_lib.sh"
BUILD=${1:-build}
WORK=${2:-/dev/shm/stz-bench}
RUNS=${3:-3}
STZ=$BUILD/stz
mkdir -p "$WORK"
M=$WORK/qwen2-0.5b.bf16.safetensors
"$STZ" synth qwen2-0.5b -o "$M" -q -f
N=$(stat -c %s "$M")
sed 's/"action": "int4", "block_size": 128/"action": "int4", "block_size": 128, "method": "mse"/' \
    "$(dirname "$0")/../policies/int4.json" >"$WORK/int4-mse.json"

echo "## stz quantization benchmark"
echo
# best_of POLICY THREADS RUNS: sets best="seconds peak-RSS-KiB"
best_of() {
    best=""
    i=0
    while [ $i -lt $3 ]; do
        rm -f "$WORK/q.safetensors"
        /usr/bin/time -f "%e %M" -o "$WORK/time" "$STZ" quantize --policy "$1" "$M" -o "$WORK/q.safetensors" -q -T "$2"
        t=$(cat "$WORK/time")
        if [ -z "$best" ] || [ "$(echo "$t $best" | awk '{print ($1 < $3)}')" = 1 ]; then best=$t; fi
        i=$((i + 1))
    done
}

echo "$(date -u +%Y-%m-%d), qwen2-0.5b BF16 synthetic ($(awk -v n="$N" 'BEGIN { printf "%.1f MB", n / 1e6 }')), best of $RUNS runs (mse: 1 run); time and MB/s on one thread, then the time on two (-T 2) and the speed-up."
echo
echo "| policy | output bytes | ratio | time s | MB/s | peak RSS MiB | 2 threads s | speed-up | tensors quantized | min cosine | weighted cosine |"
echo "|---|---|---|---|---|---|---|---|---|---|---|"
for pol in int8 int4 int4-mse int4-small; do
    P=$pol
    [ "$pol" = int4-mse ] && P=$WORK/int4-mse.json
    runs=$RUNS
    [ "$pol" = int4-mse ] && runs=1
    best_of "$P" 2 "$runs"
    set -- $best
    T2=$1
    best_of "$P" 1 "$runs"
    set -- $best
    T=$1 RSS=$2
    Q=$(stat -c %s "$WORK/q.safetensors")
    "$STZ" eval "$M" "$WORK/q.safetensors" --json >"$WORK/eval.json"
    NQ=$(grep -c '"action":[[:space:]]*"int' "$WORK/eval.json" || true)
    # min and weighted cosine over the quantized tensors only
    set -- $(awk '/"action"/ { q = ($0 ~ /int[48]/) } /"params"/ { gsub(/[^0-9]/, ""); p = $0 }
                 /"cosine"/ && q { sub(/.*:/, ""); gsub(/[,[:space:]]/, ""); c = $0 + 0; if (min == "" || c < min) min = c; s += c * p; w += p }
                 END { printf "%.6f %.6f", min, s / w }' "$WORK/eval.json")
    MINQ=$1 WQ=$2
    printf "| %s | %s | %.3f | %.2f | %.0f | %.0f | %.2f | %.2fx | %s | %s | %s |\n" "$pol" "$Q" "$(awk -v a="$N" -v b="$Q" 'BEGIN{print a/b}')" \
        "$T" "$(awk -v n="$N" -v t="$T" 'BEGIN{print n/t/1e6}')" "$(awk -v k="$RSS" 'BEGIN{print k/1024}')" "$T2" \
        "$(awk -v a="$T" -v b="$T2" 'BEGIN{print a/b}')" "$NQ" "$MINQ" "$WQ"
    eval "MIN_$(echo $pol | tr '-' '_')=$MINQ; SIZE_$(echo $pol | tr '-' '_')=$Q; TIME_$(echo $pol | tr '-' '_')=$T"
done
rm -f "$WORK/q.safetensors" "$WORK/time" "$WORK/eval.json" "$WORK/int4-mse.json"
echo
echo "Targets:"
check "INT8 minimum cosine $MIN_int8 >= 0.9999" "$MIN_int8 >= 0.9999"
check "INT4 (absmax) minimum cosine $MIN_int4 >= 0.98" "$MIN_int4 >= 0.98"
check "INT4 mse minimum cosine $MIN_int4_mse >= 0.99" "$MIN_int4_mse >= 0.99"
check "INT4 mse at the same size ($SIZE_int4_mse vs $SIZE_int4 bytes)" "$SIZE_int4_mse <= $SIZE_int4"
check "INT8 throughput $(awk -v n="$N" -v t="$TIME_int8" 'BEGIN{printf "%.0f", n/t/1e6}') MB/s >= 300 per thread" "$N / $TIME_int8 / 1e6 >= 300"
check "INT4 throughput $(awk -v n="$N" -v t="$TIME_int4" 'BEGIN{printf "%.0f", n/t/1e6}') MB/s >= 300 per thread" "$N / $TIME_int4 / 1e6 >= 300"
echo
echo "$fails target(s) missed."
