#!/bin/sh
# Allocation failures, as SQLite tests them: each main command runs on a
# small model once per allocation it makes, that allocation failing
# (tests/failmalloc.c; a build with -DSTZ_FAILMALLOC=ON, under ASan in
# `make asan`). Every run must end with status 0 and the very output of a
# normal run (the allocation was optional), or with status 1, an
# "stz: error:" line, no output and no temporary file left; never a crash,
# a sanitizer report or a leak (LeakSanitizer would change the status).
# Usage: test_oom.sh STZ  (STZ_OOM_STEP=K tries every Kth allocation only,
# default 2; make oom sets 1)
set -u
. "$(dirname "$0")/cli_lib.sh" "$1"
STEP=${STZ_OOM_STEP:-2}
if ! STZ_FAIL_COUNT=1 "$STZ" --version 2>&1 | grep -q "^allocations:"; then
    echo "skip: $STZ is not an allocation-failure build (-DSTZ_FAILMALLOC=ON)"
    exit 77
fi
cd "$T" || exit 1
"$STZ" synth tiny -o m.safetensors -q
"$STZ" quantize --int4 --fast m.safetensors -o q.safetensors -q
"$STZ" pack m.safetensors -o p.stz -q
"$STZ" compress --int4 --fast m.safetensors -o c.stz -q
runs=0 oom=0

# oom_check NAME OUTPUT COMMAND...: OUTPUT is the file the command writes ("" if none)
oom_check() {
    name=$1 out=$2
    shift 2
    rm -rf ref.out "$out"
    "$STZ" "$@" >ref.stdout 2>/dev/null || { bad "$name: fails without a failure"; return; }
    [ -z "$out" ] || mv "$out" ref.out
    count=$(STZ_FAIL_COUNT=1 "$STZ" "$@" 2>&1 >/dev/null | sed -n 's/^allocations: //p')
    [ -n "$out" ] && rm -rf "$out"
    n=1
    while [ "$n" -le "$count" ]; do
        STZ_FAIL_AT=$n "$STZ" "$@" >got.stdout 2>got.err
        rc=$?
        runs=$((runs + 1))
        if grep -q "Sanitizer\|runtime error" got.err; then
            bad "$name: allocation $n of $count: $(grep -m1 "Sanitizer\|runtime error" got.err)"
        elif [ "$rc" -eq 0 ]; then
            { [ -z "$out" ] && cmp -s got.stdout ref.stdout; } || { [ -n "$out" ] && cmp -s "$out" ref.out; } && ok ||
                bad "$name: allocation $n of $count failed, status 0, but the output differs"
        elif [ "$rc" -eq 1 ]; then
            oom=$((oom + 1))
            grep -q "^stz: error: " got.err && ok || bad "$name: allocation $n: status 1 without an error line"
            [ -z "$out" ] || [ ! -e "$out" ] && ok || bad "$name: allocation $n: output left after the error"
        else
            bad "$name: allocation $n of $count: status $rc"
            sed -n 1,3p got.err
        fi
        ls -A | grep -q "\.tmp-" && { bad "$name: allocation $n: temporary file left"; rm -rf ./*.tmp-*; }
        [ -n "$out" ] && rm -rf "$out"
        n=$((n + STEP))
    done
    echo "$name: $count allocations"
}

oom_check inspect "" inspect c.stz
oom_check plan "" plan --int4 m.safetensors
oom_check pack o.stz pack m.safetensors -o o.stz -T 1 -q
oom_check unpack o.safetensors unpack p.stz -o o.safetensors -T 1 -q
oom_check verify "" verify p.stz -T 1 -q
oom_check quantize o.safetensors quantize --int4 --fast m.safetensors -o o.safetensors -T 1 -q
# calibrated (the default): sampling and error feedback, on one short sequence, every 8th allocation of ~2,300
every=$STEP
STEP=$((every * 8))
oom_check "quantize, calibrated" o.safetensors quantize --int4 m.safetensors --sequences 1 --seq-len 8 -o o.safetensors \
    -T 1 -q
STEP=$every
oom_check dequantize o.safetensors dequantize q.safetensors -o o.safetensors -T 1 -q
oom_check compress o.stz compress --int4 --fast m.safetensors -o o.stz -T 1 -q
oom_check decompress o.safetensors decompress c.stz --dequantize -o o.safetensors -T 1 -q
oom_check eval "" eval m.safetensors q.safetensors -q
echo "oom: $runs runs, $oom ended in a clean error"
finish oom
