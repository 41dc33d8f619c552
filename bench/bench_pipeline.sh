#!/bin/sh
# One-shot pipeline benchmark: stz compress (lossless, INT8, INT4 policies)
# on the generated Qwen2-0.5B-shaped BF16 model, beside the project's origin
# report (real Qwen2-0.5B: lossless 1.49x, INT8 + zstd 1.78x, INT4 + zstd
# 2.69x) and whole-file zstd -3 -T2 measured in the same run. Checks the
# pipeline issue's targets. Best of RUNS runs.
# Usage: bench/bench_pipeline.sh [BUILD_DIR] [WORK_DIR] [RUNS]
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
best_of() { # OUT CMD...: "seconds peak_kb" of the fastest run; OUT deleted before each
    out=$1
    shift
    best=""
    i=0
    while [ $i -lt "$RUNS" ]; do
        rm -f "$out"
        /usr/bin/time -f "%e %M" -o "$WORK/time" "$@" >"$WORK/last.json"
        t=$(cat "$WORK/time")
        if [ -z "$best" ] || [ "$(echo "$t $best" | awk '{print ($1 < $3)}')" = 1 ]; then best=$t; fi
        i=$((i + 1))
    done
    echo "$best"
}
jnum() { grep "\"$1\"" "$WORK/last.json" | head -1 | sed 's/.*:[[:space:]]*//; s/,$//' | awk '{ printf "%.6f", $1 }'; }

echo "## stz compress benchmark"
echo
echo "$(date -u +%Y-%m-%d), qwen2-0.5b BF16 synthetic ($N bytes), default threads (2), best of $RUNS runs."
echo
set -- $(best_of "$WORK/z.zst" zstd -3 -T2 -q "$M" -o "$WORK/z.zst")
ZT=$1
ZR=$(awk -v a="$N" -v b="$(stat -c %s "$WORK/z.zst")" 'BEGIN{printf "%.3f", a/b}')
echo "| mode | stz ratio | origin report | time s | peak RSS MiB | min cosine | weighted cosine |"
echo "|---|---|---|---|---|---|---|"
echo "| whole-file zstd -3 -T2 | $ZR | | $ZT | | | |"
for mode in lossless int8 int4; do
    case $mode in lossless) flag=--lossless; ref=1.49 ;; int8) flag=--int8; ref=1.78 ;; int4) flag=--int4; ref=2.69 ;; esac
    set -- $(best_of "$WORK/c.stz" "$STZ" compress $flag "$M" -o "$WORK/c.stz" --json)
    T=$1 RSS=$2
    R=$(jnum ratio)
    MC=$(jnum min_cosine); WC=$(jnum weighted_cosine)
    printf "| %s | %.3f | %s | %s | %.0f | %s | %s |\n" "$mode" "$R" "$ref" "$T" "$(awk -v k="$RSS" 'BEGIN{print k/1024}')" \
        "${MC:--}" "${WC:--}"
    eval "R_$mode=$R; T_$mode=$T; RSS_$mode=$RSS; MC_$mode=\${MC:-1}"
done
# the round trip of the lossless container, checked
"$STZ" compress --lossless "$M" -o "$WORK/c.stz" -q -f
"$STZ" decompress "$WORK/c.stz" -o "$WORK/back.safetensors" -q -f
cmp -s "$M" "$WORK/back.safetensors" && echo && echo "Lossless round trip: identical bytes." || { echo "lossless round trip differs"; fails=$((fails + 1)); }
rm -f "$WORK/c.stz" "$WORK/back.safetensors" "$WORK/z.zst" "$WORK/time" "$WORK/last.json"
echo
echo "Targets:"
check "INT8 policy ratio $R_int8 >= 1.9" "$R_int8 >= 1.9"
check "INT8 minimum cosine $MC_int8 >= 0.9999" "$MC_int8 >= 0.9999"
check "INT4 policy ratio $R_int4 >= 2.9" "$R_int4 >= 2.9"
check "INT4 minimum cosine $MC_int4 >= 0.98" "$MC_int4 >= 0.98"
check "lossless ratio $R_lossless >= 1.48" "$R_lossless >= 1.48"
check "INT4 compress time $T_int4 s <= 2 x zstd -3 -T2 ($ZT s)" "$T_int4 <= 2 * $ZT"
MAXRSS=$(printf "%s\n%s\n%s\n" "$RSS_lossless" "$RSS_int8" "$RSS_int4" | sort -n | tail -1)
check "peak RSS $((MAXRSS / 1024)) MiB <= 512 MiB" "$MAXRSS <= 512 * 1024"
echo
echo "$fails target(s) missed."
