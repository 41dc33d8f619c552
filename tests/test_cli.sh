#!/bin/sh
# End-to-end checks of the stz program: exit statuses, messages, refusal to
# overwrite, clean interruption. Usage: test_cli.sh STZ [SHARED_DATA_DIR]
set -u
STZ=$1
DATA=${2:-}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
pass=0 fail=0
ok() { pass=$((pass + 1)); }
bad() { echo "FAIL: $*"; fail=$((fail + 1)); }
expect_rc() { # expected-rc description command...
    want=$1 what=$2; shift 2
    "$@" >"$T/out" 2>"$T/err"; rc=$?
    if [ "$rc" = "$want" ]; then ok; else bad "$what: exit $rc, wanted $want"; cat "$T/err"; fi
}
has() { # file pattern description
    if grep -q -- "$2" "$1"; then ok; else bad "$3: '$2' not in output"; cat "$1"; fi
}

expect_rc 0 "help" "$STZ" --help
has "$T/out" "inspect" "help lists commands"
expect_rc 2 "unknown command" "$STZ" frobnicate
expect_rc 2 "inspect without file" "$STZ" inspect
expect_rc 0 "inspect --help" "$STZ" inspect --help

expect_rc 0 "synth tiny" "$STZ" synth tiny -o "$T/tiny.safetensors" --stats
has "$T/out" "27 tensors" "synth summary"
has "$T/out" "entropy" "synth --stats"
[ -s "$T/err" ] && bad "progress printed while stderr is not a terminal" || ok
sum1=$(cksum <"$T/tiny.safetensors")
expect_rc 1 "synth over existing file" "$STZ" synth tiny -o "$T/tiny.safetensors" --seed 9
has "$T/err" "exists" "overwrite message"
[ "$(cksum <"$T/tiny.safetensors")" = "$sum1" ] && ok || bad "existing file was changed"
expect_rc 0 "synth --force" "$STZ" synth tiny -o "$T/tiny.safetensors" --seed 9 -f -q
[ "$(cksum <"$T/tiny.safetensors")" != "$sum1" ] && ok || bad "--force did not replace"
expect_rc 2 "synth bad dtype" "$STZ" synth tiny -o "$T/x.safetensors" --dtype i8
expect_rc 1 "synth unknown arch" "$STZ" synth nope -o "$T/x.safetensors"
has "$T/err" "nope" "unknown arch message"
expect_rc 0 "synth --list" "$STZ" synth --list
has "$T/out" "qwen2-0.5b" "arch list"

expect_rc 0 "inspect" "$STZ" inspect "$T/tiny.safetensors"
has "$T/out" "27 tensors, 123,968 parameters" "inspect header line"
has "$T/out" "model.layers.1.mlp.down_proj.weight" "inspect rows"
has "$T/out" "stz.synthetic = true" "inspect metadata"
expect_rc 0 "inspect --json" "$STZ" inspect --json "$T/tiny.safetensors"
has "$T/out" '"tensor_count":[[:space:]]*27' "json tensor count"
has "$T/out" '"params":[[:space:]]*123968' "json params"

CORPUS=$(dirname "$0")/corpus/safetensors
expect_rc 1 "inspect corrupt" "$STZ" inspect "$CORPUS/offsets_gap.safetensors"
has "$T/err" "offsets_gap.safetensors: tensor 'b'" "error names file and tensor"
has "$T/err" "STZ_E_OFFSETS" "error code"
expect_rc 1 "inspect missing" "$STZ" inspect "$T/none.safetensors"

if [ -n "$DATA" ] && [ -f "$DATA/stories260K.f32.safetensors" ]; then
    expect_rc 0 "inspect shared f32" "$STZ" inspect "$DATA/stories260K.f32.safetensors"
    has "$T/out" "47 tensors, 260,032 parameters" "shared f32"
    expect_rc 0 "inspect shared bf16" "$STZ" inspect "$DATA/stories260K.bf16.safetensors"
    has "$T/out" "47 tensors, 260,032 parameters" "shared bf16"
fi

# Interrupted: SIGINT mid-write leaves neither the output nor a temporary file.
"$STZ" synth llama-1b -o "$T/big.safetensors" -q -T 1 &
pid=$!
sleep 1
kill -INT $pid
wait $pid; rc=$?
[ "$rc" -ne 0 ] && ok || bad "interrupted synth exited 0"
ls -A "$T" | grep -q "big" && bad "interrupted synth left $(ls -A "$T" | grep big)" || ok

echo "cli: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
