#!/bin/sh
# Containers of every format version: the committed containers of format 1
# (tests/corpus/stz_v1, written by stz before small tensors shared chunks)
# unpack to their originals' bytes (sha256 in MANIFEST), from a file and from
# a pipe, and verify; format 2, where whole small tensors share a chunk:
# written only when a chunk is shared, smaller than format 1 on a model of
# small tensors, round trips byte for byte from a file and a pipe, and one
# tensor of a shared chunk unpacks alone to its own bytes.
# Usage: test_containers.sh STZ
. "$(dirname "$0")/cli_lib.sh"
V1=$(dirname "$0")/corpus/stz_v1
n=0
while read -r name sum size; do
    c=$V1/$name
    expect_rc 0 "unpack $name" "$STZ" unpack "$c" -o "$T/orig" -q -f
    if [ "$(sha256sum <"$T/orig" | cut -d' ' -f1)" = "$sum" ] && [ "$(stat -c %s "$T/orig")" = "$size" ]; then ok
    else bad "$name: not the original's bytes"; fi
    "$STZ" unpack - -c <"$c" >"$T/piped" 2>"$T/err"
    if [ "$(sha256sum <"$T/piped" | cut -d' ' -f1)" = "$sum" ]; then ok; else bad "$name from a pipe"; cat "$T/err"; fi
    expect_rc 0 "verify $name" "$STZ" verify "$c" -q
    "$STZ" inspect "$c" >"$T/insp" 2>&1
    has "$T/insp" "stz container v1" "inspect $name"
    n=$((n + 1))
done <"$V1/MANIFEST"
[ "$n" -ge 10 ] && ok || bad "only $n format-1 containers read"

# Format 2: a model of small tensors (the tiny model of the corpus in stz's
# own 4-bit format: norms, biases and scales of at most 1 KiB share chunks):
# smaller than the format-1 container stz made of it before.
"$STZ" unpack "$V1/tiny.nl.stz" -o "$T/tiny.safetensors" -q
expect_rc 0 "pack" "$STZ" pack "$T/tiny.safetensors" -o "$T/tiny.stz" -q
"$STZ" inspect "$T/tiny.stz" >"$T/insp" 2>&1
has "$T/insp" "stz container v2" "small tensors share chunks"
if [ "$(stat -c %s "$T/tiny.stz")" -lt "$(stat -c %s "$V1/tiny.nl.stz")" ]; then ok
else bad "format 2 not smaller: $(stat -c %s "$T/tiny.stz") vs format 1's $(stat -c %s "$V1/tiny.nl.stz")"; fi
expect_rc 0 "unpack format 2" "$STZ" unpack "$T/tiny.stz" -o "$T/back" -q
same "$T/tiny.safetensors" "$T/back" "format 2 round trip"
"$STZ" pack "$T/tiny.safetensors" -c | "$STZ" unpack - -c >"$T/piped"
same "$T/tiny.safetensors" "$T/piped" "format 2 through pipes"
expect_rc 0 "verify format 2" "$STZ" verify "$T/tiny.stz" -q
# every tensor alone: its own bytes, those of a shared chunk too
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
