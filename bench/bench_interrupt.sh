#!/bin/sh
# How soon stz tune stops on SIGTERM (issue 56, item 4: within a second at
# every stage): the Llama-3.2-1B shape at 2 layers (BF16, 769 MB), `stz
# tune --ratio 4` on 2 threads, signalled DELAYS seconds after its start
# (one run each); prints the stage the progress line showed and the seconds
# from the signal to the exit. FAST=1 adds --fast (no calibration: the
# measuring and probing stages come sooner). STAGE=TEXT signals DELAYS
# seconds after the progress line first shows TEXT instead (e.g.
# STAGE=feedback DELAYS="1 5": inside error feedback's first layers).
# Never part of the build or the tests.
# Usage: bench/bench_interrupt.sh [BUILD_DIR] [WORK_DIR] [DELAYS...]
set -eu
BUILD=${1:-build}
WORK=${2:-/dev/shm/stz-bench-interrupt}
shift 2 2>/dev/null || shift $#
DELAYS=${*:-20 120 230 270 320}
STZ=$BUILD/stz
mkdir -p "$WORK"
M=$WORK/l1b.safetensors
[ -f "$M" ] || "$STZ" synth llama-1b --layers 2 -o "$M" -q
echo "| signal after | stage | exit status | seconds to exit |"
echo "|---|---|---|---|"
for d in $DELAYS; do
    "$STZ" tune "$M" --ratio 4 -o "$WORK/p.json" -T 2 --progress -f ${FAST:+--fast} >/dev/null 2>"$WORK/err.txt" &
    p=$!
    if [ -n "${STAGE:-}" ]; then
        until tr '\r' '\n' 2>/dev/null <"$WORK/err.txt" | grep -q "$STAGE" || ! kill -0 $p 2>/dev/null; do
            sleep 0.2
        done
    fi
    sleep "$d"
    kill -TERM $p 2>/dev/null || true
    t0=$(date +%s.%N)
    rc=0
    wait $p || rc=$?
    t1=$(date +%s.%N)
    stage=$(tr '\r' '\n' <"$WORK/err.txt" | grep -v '^$' | grep -v '^stz: error' | tail -1 | cut -c1-40)
    echo "| $d s${STAGE:+ into $STAGE} | $stage | $rc | $(awk "BEGIN { printf \"%.2f\", $t1 - $t0 }") |"
done
rm -f "$WORK/p.json" "$WORK/err.txt"
