#!/bin/sh
# Containers of every format version: the committed containers of format 1
# (tests/corpus/stz_v1, written by stz before small tensors shared chunks)
# and of format 2 (tests/corpus/stz_v2, whole small tensors sharing a chunk
# as bytes, written before format 3) unpack to their originals' bytes
# (sha256 in MANIFEST), from a file and from a pipe, and verify; format 3,
# where whole small tensors are members of a chunk, each coded alone:
# written when a tensor of at most 16 KiB is there, smaller than format 2 on
# a model of small tensors, round trips byte for byte from a file and a
# pipe, and one tensor of a members chunk unpacks alone to its own bytes.
# Usage: test_containers.sh STZ
. "$(dirname "$0")/cli_lib.sh"
for v in 1 2; do
    dir=$(dirname "$0")/corpus/stz_v$v
    n=0
    while read -r name sum size; do
        c=$dir/$name
        expect_rc 0 "unpack $name" "$STZ" unpack "$c" -o "$T/orig" -q -f
        if [ "$(sha256sum <"$T/orig" | cut -d' ' -f1)" = "$sum" ] && [ "$(stat -c %s "$T/orig")" = "$size" ]; then ok
        else bad "$name: not the original's bytes"; fi
        "$STZ" unpack - -c <"$c" >"$T/piped" 2>"$T/err"
        if [ "$(sha256sum <"$T/piped" | cut -d' ' -f1)" = "$sum" ]; then ok; else bad "$name from a pipe"; cat "$T/err"; fi
        expect_rc 0 "verify $name" "$STZ" verify "$c" -q
        "$STZ" inspect "$c" >"$T/insp" 2>&1
        has "$T/insp" "stz container v$v" "inspect $name"
        n=$((n + 1))
    done <"$dir/MANIFEST"
    [ "$n" -ge $((v == 1 ? 10 : 3)) ] && ok || bad "only $n format-$v containers read"
done

# Format 3: a model of small tensors (the tiny model of the corpus in stz's
# own 4-bit format: every tensor up to 16 KiB a member of a chunk): smaller
# than the format-2 container stz made of it before.
V1=$(dirname "$0")/corpus/stz_v1 V2=$(dirname "$0")/corpus/stz_v2
"$STZ" unpack "$V1/tiny.nl.stz" -o "$T/tiny.safetensors" -q
expect_rc 0 "pack" "$STZ" pack "$T/tiny.safetensors" -o "$T/tiny.stz" -q
"$STZ" inspect "$T/tiny.stz" >"$T/insp" 2>&1
has "$T/insp" "stz container v3" "small tensors are members of chunks"
if [ "$(stat -c %s "$T/tiny.stz")" -lt "$(stat -c %s "$V2/tiny.nl.stz")" ]; then ok
else bad "format 3 not smaller: $(stat -c %s "$T/tiny.stz") vs format 2's $(stat -c %s "$V2/tiny.nl.stz")"; fi
expect_rc 0 "unpack format 3" "$STZ" unpack "$T/tiny.stz" -o "$T/back" -q
same "$T/tiny.safetensors" "$T/back" "format 3 round trip"
"$STZ" pack "$T/tiny.safetensors" -c | "$STZ" unpack - -c >"$T/piped"
same "$T/tiny.safetensors" "$T/piped" "format 3 through pipes"
expect_rc 0 "verify format 3" "$STZ" verify "$T/tiny.stz" -q
# every tensor alone: its own bytes, those of a members chunk too
/usr/bin/python3 - "$T/tiny.safetensors" >"$T/names" <<'EOF'
import json, struct, sys
b = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", b[:8])[0]
for k, v in json.loads(b[8:8 + n]).items():
    if k != "__metadata__":
        print(k, 8 + n + v["data_offsets"][0], v["data_offsets"][1] - v["data_offsets"][0])
EOF
checked=0
while read -r name off len; do
    "$STZ" unpack "$T/tiny.stz" --tensor "$name" -o "$T/t.bin" -q -f
    tail -c +$((off + 1)) "$T/tiny.safetensors" | head -c "$len" >"$T/t.want"
    if cmp -s "$T/t.bin" "$T/t.want"; then ok; else bad "--tensor $name: not its bytes"; fi
    checked=$((checked + 1))
done <"$T/names"
[ "$checked" -ge 20 ] && ok || bad "only $checked tensors extracted"
finish containers
