#!/bin/sh
# Never lose or corrupt a user's data; never pass a gate that checked
# nothing; refuse hostile input clearly. Usage: test_safety.sh STZ [DATA]
set -u
. "$(dirname "$0")/cli_lib.sh"
CORPUS=$(dirname "$0")/corpus
# A 400 MB address-space cap proves nothing huge is allocated; ASan reserves
# terabytes of shadow memory, so under it the cap is left off (ASan itself
# aborts on an absurd allocation).
MEMCAP="ulimit -v 400000;"
[ -n "${STZ_SANITIZED:-}" ] && MEMCAP=""

"$STZ" synth tiny -o "$T/m.safetensors" -q
M=$T/m.safetensors
# the nl file with .scales companions that the hostile-metadata checks edit
"$STZ" quantize --policy int4-nl "$M" -o "$T/q.safetensors" -q
"$STZ" compress --policy int4-nl "$M" -o "$T/q.stz" -q

# 1. An output that is the input, by name, symlink or hard link: refused on
# every path, the input unchanged.
cp "$T/q.stz" "$T/q.orig"
ln -s q.stz "$T/q.link"
ln "$T/q.stz" "$T/q.hard"
for out in q.stz q.link q.hard; do
    expect_rc 1 "decompress --dequantize onto its input ($out)" "$STZ" decompress "$T/q.stz" --dequantize -o "$T/$out" -f
    has "$T/err" "output is the input" "names the problem ($out)"
    expect_rc 1 "decompress onto its input ($out)" "$STZ" decompress "$T/q.stz" -o "$T/$out" -f
    expect_rc 1 "unpack onto its input ($out)" "$STZ" unpack "$T/q.stz" -o "$T/$out" -f
done
same "$T/q.stz" "$T/q.orig" "container unchanged"
cp "$M" "$T/m.orig"
ln "$M" "$T/m.hard"
for cmd in "quantize --int8" "compress --int8" "compress --lossless" "pack" "dequantize"; do
    # shellcheck disable=SC2086
    expect_rc 1 "$cmd onto a hard link of its input" "$STZ" $cmd "$M" -o "$T/m.hard" -f
done
same "$M" "$T/m.orig" "model unchanged"

# 2. Quantizing a quantized file is refused, with the way out.
expect_rc 1 "quantize a quantized file" "$STZ" quantize --int8 "$T/q.safetensors" -o "$T/qq.safetensors"
has "$T/err" "already quantized" "says why"
has "$T/err" "stz dequantize" "says what to do"
[ -e "$T/qq.safetensors" ] && bad "requantized output written" || ok
expect_rc 1 "compress a quantized file" "$STZ" compress --int4 "$T/q.safetensors" -o "$T/qq.stz"

# 3. An output that appears while a command runs is never replaced without
# --force: the last rename fails instead.
"$STZ" synth small -o "$T/s.safetensors" -q
"$STZ" pack "$T/s.safetensors" -o "$T/race.stz" -q -T 1 2>"$T/race.err" &
pid=$!
i=0
while [ ! -e "$T/race.stz" ] && [ $i -lt 200 ] && ! ls -A "$T" | grep -q "race.stz.tmp-"; do i=$((i + 1)); sleep 0.01; done
echo "someone else's file" >"$T/race.stz.new"
ln "$T/race.stz.new" "$T/race.stz" 2>/dev/null; won=$? # ln never replaces: 0 if ours came first
wait $pid; rc=$?
if [ $won -eq 0 ]; then
    [ "$(cat "$T/race.stz")" = "someone else's file" ] && ok || bad "pack replaced a file that appeared meanwhile"
    [ "$rc" -ne 0 ] && ok || bad "pack exited 0 although its output was not written"
    ls -A "$T" | grep -q "race.stz.tmp-" && bad "temporary file left" || ok
fi
rm -f "$T/race.stz" "$T/race.stz.new"

# 4. Directories: hidden files, subdirectories and links inside come back;
# links out of the directory are refused by name; umask modes.
D=$T/hf
mkdir -p "$D/original" "$D/.cache/huggingface"
cp "$M" "$D/model-00001-of-00002.safetensors"
"$STZ" synth gpt-neo-tiny -o "$D/model-00002-of-00002.safetensors" -q
printf '{"model_type": "test"}\n' >"$D/config.json"
printf '*.safetensors filter=lfs\n' >"$D/.gitattributes"
printf '{"dim": 64}\n' >"$D/original/params.json"
printf 'etag\n' >"$D/.cache/huggingface/download.lock"
ln -s config.json "$D/config.link.json"
make_index() { # dir
    {
        printf '{\n  "metadata": {"total_size": 0},\n  "weight_map": {\n'
        for k in 1 2; do
            "$STZ" inspect --json "$1/model-0000$k-of-00002.safetensors" | grep '"name":' |
                sed "s/.*\"name\":[[:space:]]*\"\([^\"]*\)\".*/    \"\1\": \"model-0000$k-of-00002.safetensors\",/"
        done | sed '$ s/,$//'
        printf '  }\n}\n'
    } >"$1/model.safetensors.index.json"
}
make_index "$D"
umask 022
expect_rc 0 "compress a directory losslessly" "$STZ" compress --lossless "$D" -o "$T/hf.stz"
[ "$(stat -c %a "$T/hf.stz")" = 755 ] && ok || bad "output directory mode $(stat -c %a "$T/hf.stz"), wanted 755"
[ "$(stat -c %a "$T/hf.stz/original")" = 755 ] && ok || bad "subdirectory mode"
expect_rc 0 "decompress it" "$STZ" decompress "$T/hf.stz" -o "$T/hf.back"
diff -r "$D" "$T/hf.back" >"$T/diff" 2>&1 && ok || { bad "directory round trip differs"; cat "$T/diff"; }
[ -L "$T/hf.back/config.link.json" ] && ok || bad "link inside the directory not kept as a link"
for f in .gitattributes original/params.json .cache/huggingface/download.lock; do
    same "$D/$f" "$T/hf.back/$f" "$f comes back"
done
expect_rc 0 "compress a directory to int4" "$STZ" compress --int4 "$D" -o "$T/hf4.stz"
[ -f "$T/hf4.stz/original/params.json" ] && [ -f "$T/hf4.stz/.gitattributes" ] && ok || bad "int4 directory drops files"
echo secret >"$T/secret.txt"
ln -s "$T/secret.txt" "$D/notes.txt"
expect_rc 1 "a link out of the directory" "$STZ" compress --lossless "$D" -o "$T/hf2.stz"
has "$T/err" "notes.txt: link to something outside" "names the link"
[ -e "$T/hf2.stz" ] && bad "output directory left" || ok
rm "$D/notes.txt"
mkfifo "$D/pipe"
expect_rc 1 "a FIFO in the directory" "$STZ" compress --lossless "$D" -o "$T/hf2.stz"
has "$T/err" "pipe: not a regular file" "names the FIFO"
rm "$D/pipe"
ls -A "$T" | grep -q "tmp-" && bad "temporary directory left: $(ls -A "$T" | grep tmp-)" || ok

# 5. The index against the shards.
cp -r "$D" "$T/bad"
sed 's/"model.norm.weight": "model-00001-of-00002.safetensors"/"model.norm.weight": "model-00002-of-00002.safetensors"/' \
    "$D/model.safetensors.index.json" >"$T/bad/model.safetensors.index.json"
expect_rc 1 "tensor mapped to the wrong shard" "$STZ" compress --int4 "$T/bad" -o "$T/bad.stz"
has "$T/err" "maps tensor 'model.norm.weight' to model-00002-of-00002.safetensors, but it is in model-00001" "wrong shard"
grep -v '"model.norm.weight"' "$D/model.safetensors.index.json" >"$T/bad/model.safetensors.index.json"
expect_rc 1 "tensor missing from the index" "$STZ" compress --lossless "$T/bad" -o "$T/bad.stz"
has "$T/err" "tensor 'model.norm.weight' of model-00001-of-00002.safetensors is missing from the index" "missing"
sed 's/"weight_map": {/"weight_map": {\n    "ghost.weight": "model-00001-of-00002.safetensors",/' \
    "$D/model.safetensors.index.json" >"$T/bad/model.safetensors.index.json"
expect_rc 1 "index names a tensor no shard holds" "$STZ" compress --lossless "$T/bad" -o "$T/bad.stz"
has "$T/err" "maps tensor 'ghost.weight' to model-00001-of-00002.safetensors, which does not hold it" "ghost"
cp "$M" "$T/bad/model-00002-of-00002.safetensors"
cp "$D/model.safetensors.index.json" "$T/bad/"
expect_rc 1 "tensor in two shards" "$STZ" compress --int4 "$T/bad" -o "$T/bad.stz"
has "$T/err" "is in two shards" "two shards"
cp "$D/model-00002-of-00002.safetensors" "$T/bad/"
sed 's/"weight_map": {/"weight_map": {\n    "model.norm.weight": "model-00001-of-00002.safetensors",/' \
    "$D/model.safetensors.index.json" >"$T/bad/model.safetensors.index.json"
expect_rc 1 "duplicate key in the index" "$STZ" compress --int4 "$T/bad" -o "$T/bad.stz"
has "$T/err" "key 'model.norm.weight' appears twice" "duplicate key"
[ -e "$T/bad.stz" ] && bad "output written for a bad directory" || ok

# 6. Quantized metadata that this stz does not understand is refused.
reshape() { # in out tensor shape-json: a copy with one tensor's shape replaced
    python3 - "$@" <<'PY'
import json, struct, sys
src, dst, name, shape = sys.argv[1:5]
b = open(src, "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
h[name]["shape"] = json.loads(shape)
t = json.dumps(h, separators=(",", ":")).encode()
t += b" " * (-len(t) % 8)
open(dst, "wb").write(struct.pack("<Q", len(t)) + t + b[8 + n:])
PY
}
python3 "$(dirname "$0")/edit_meta.py" "$T/q.safetensors" "$T/v2.safetensors" stz.quant.version 2
expect_rc 1 "unknown quant version" "$STZ" dequantize "$T/v2.safetensors" -o "$T/x.safetensors"
has "$T/err" "format version '2'" "version named"
python3 "$(dirname "$0")/edit_meta.py" "$T/q.safetensors" "$T/v0.safetensors" stz.quant.version -
expect_rc 1 "no quant version" "$STZ" dequantize "$T/v0.safetensors" -o "$T/x.safetensors"
has "$T/err" "without 'stz.quant.version'" "missing version"
W=model.layers.0.mlp.up_proj.weight
python3 "$(dirname "$0")/edit_meta.py" "$T/q.safetensors" "$T/pk.safetensors" "stz.quant.$W" packing=int4-pairs-low-nibble-first
expect_rc 1 "unknown packing" "$STZ" dequantize "$T/pk.safetensors" -o "$T/x.safetensors"
has "$T/err" "unknown packing 'int4-pairs-low-nibble-first'" "packing named"
python3 "$(dirname "$0")/edit_meta.py" "$T/q.safetensors" "$T/me.safetensors" "stz.quant.$W" method=nf4
expect_rc 1 "unknown method" "$STZ" eval "$M" "$T/me.safetensors"
has "$T/err" "unknown quantization method 'nf4'" "method named"
python3 "$(dirname "$0")/edit_meta.py" "$T/q.safetensors" "$T/uk.safetensors" "stz.quant.$W" zero_point=3
expect_rc 1 "unknown key" "$STZ" dequantize "$T/uk.safetensors" -o "$T/x.safetensors"
has "$T/err" "unknown key 'zero_point'" "key named"
# an original dtype stz does not quantize: refused by name when opened (was
# "cannot convert F32 to I8", naming neither file nor tensor, at the write)
python3 "$(dirname "$0")/edit_meta.py" "$T/q.safetensors" "$T/dt.safetensors" "stz.quant.$W" dtype=I8
expect_rc 1 "integer original dtype" "$STZ" dequantize "$T/dt.safetensors" -o "$T/x.safetensors"
has "$T/err" "dt.safetensors: tensor '$W': invalid" "file and tensor named"
hasnt "$T/err" "cannot convert" "not the conversion's bare message"
# found by fuzz_quant_meta: an SVD entry under the name of a stored tensor
python3 "$(dirname "$0")/edit_meta.py" "$T/q.safetensors" "$T/sn.safetensors" "stz.quant.model.norm.weight" '{"method":"svd"}'
expect_rc 1 "SVD entry named like a stored tensor" "$STZ" dequantize "$T/sn.safetensors" -o "$T/x.safetensors"
has "$T/err" "SVD entry 'model.norm.weight' has the name of a stored tensor" "names the entry"
"$STZ" synth gpt-neo-tiny -o "$T/neo.safetensors" -q
"$STZ" quantize --set '*.mlp.c_fc.weight=svd:rank=8' "$T/neo.safetensors" -o "$T/svd.safetensors" -q
python3 "$(dirname "$0")/edit_meta.py" "$T/svd.safetensors" "$T/svd4.safetensors" \
    stz.quant.transformer.h.0.mlp.c_fc.weight bits=4
expect_rc 1 "svd entry with bits 4" "$STZ" dequantize "$T/svd4.safetensors" -o "$T/x.safetensors"
has "$T/err" "svd factors with 'bits' other than 8" "svd bits"
python3 "$(dirname "$0")/edit_meta.py" "$T/svd.safetensors" "$T/svdm.safetensors" \
    stz.quant.transformer.h.0.mlp.c_fc.weight svd_method=lanczos
expect_rc 1 "unknown svd_method" "$STZ" dequantize "$T/svdm.safetensors" -o "$T/x.safetensors"
has "$T/err" "unknown svd_method" "svd method named"
VH=transformer.h.0.mlp.c_fc.weight.Vh
VHS=$(python3 -c 'import json,struct,sys; b=open(sys.argv[1],"rb").read(); n=struct.unpack("<Q",b[:8])[0]; s=json.loads(b[8:8+n])[sys.argv[2]]["shape"]; print(json.dumps(s[::-1]))' "$T/svd.safetensors" "$VH")
reshape "$T/svd.safetensors" "$T/svdt.safetensors" "$VH" "$VHS"
expect_rc 1 "transposed Vh" "$STZ" dequantize "$T/svdt.safetensors" -o "$T/x.safetensors"
has "$T/err" "svd factors do not match rank" "svd shapes"
[ -e "$T/x.safetensors" ] && bad "output written for refused metadata" || ok
# Values, scales and SVD factors must have the writer's shapes, not only its
# element counts; one place for the scales; svd_method and scale_base known.
"$STZ" quantize --policy int8-b128 "$M" -o "$T/q8.safetensors" -q
reshape "$T/q8.safetensors" "$T/tr.safetensors" "$W" '[64, 172]'
expect_rc 1 "transposed codes" "$STZ" dequantize "$T/tr.safetensors" -o "$T/x.safetensors"
has "$T/err" "values do not match the recorded shape" "names the shape"
"$STZ" quantize --int8 "$M" -o "$T/g8.safetensors" -q # Q8_0 blocks: [172, 68] bytes
reshape "$T/g8.safetensors" "$T/tr.safetensors" "$W" '[68, 172]'
expect_rc 1 "transposed Q8_0 blocks" "$STZ" dequantize "$T/tr.safetensors" -o "$T/x.safetensors"
has "$T/err" "$W" "names the tensor of the transposed blocks"
reshape "$T/q8.safetensors" "$T/tr.safetensors" "$W.scales" '[172]'
expect_rc 1 "flattened scales" "$STZ" dequantize "$T/tr.safetensors" -o "$T/x.safetensors"
has "$T/err" "scales tensor '$W.scales' is missing or has the wrong dtype or size" "names the scales"
python3 "$(dirname "$0")/edit_meta.py" "$T/q.safetensors" "$T/sb.safetensors" "stz.quant.$W" scale=3
expect_rc 1 "both scale and scales" "$STZ" dequantize "$T/sb.safetensors" -o "$T/x.safetensors"
has "$T/err" "invalid stz.quant.$W entry" "names the entry"
python3 "$(dirname "$0")/edit_meta.py" "$T/q.safetensors" "$T/sb.safetensors" "stz.quant.$W" \
    "$(python3 "$(dirname "$0")/edit_meta.py" --get "$T/q.safetensors" "stz.quant.$W" | sed 's/"scale_base":[0-9.e+-]*/"scale_base":1e308/')"
expect_rc 1 "scale_base past float" "$STZ" dequantize "$T/sb.safetensors" -o "$T/x.safetensors"
has "$T/err" "invalid stz.quant.$W entry" "names the entry"
# An entry that is valid JSON but not an object (array, string, number):
# refused by name on every command that reads quantized files, no
# temporary file left (a JSON array once reached strcmp with a NULL key).
for v in '[1,2]' '"int4"' '7' '{"method":"absmax","bits":[4]}'; do
    python3 "$(dirname "$0")/edit_meta.py" "$T/q.safetensors" "$T/arr.safetensors" "stz.quant.$W" "$v"
    "$STZ" compress --lossless "$T/arr.safetensors" -o "$T/arr.stz" -q -f
    mkdir -p "$T/arrout"
    for cmd in "inspect" "dequantize -o $T/arrout/x.safetensors" "eval $M" "export --gguf -o $T/arrout/x.gguf"; do
        # shellcheck disable=SC2086
        set -- $cmd
        c=$1; shift
        if [ "$c" = eval ]; then
            expect_rc 1 "$c on entry $v" "$STZ" eval "$M" "$T/arr.safetensors"
        else
            expect_rc 1 "$c on entry $v" "$STZ" "$c" "$T/arr.safetensors" "$@"
        fi
        has "$T/err" "tensor '$W'" "$c names the tensor ($v)"
    done
    expect_rc 1 "decompress --dequantize on entry $v" "$STZ" decompress "$T/arr.stz" --dequantize -o "$T/arrout/y.safetensors"
    [ -z "$(ls -A "$T/arrout")" ] && ok || { bad "output or temporary file left for entry $v"; ls -A "$T/arrout"; }
done

# 7. Gates that compared nothing, or not everything, fail.
"$STZ" synth gpt-neo-tiny -o "$T/other.safetensors" -q --seed 3
expect_rc 3 "eval with no tensor in common" "$STZ" eval "$M" "$T/neo.safetensors" --threshold 0.99 -q
has "$T/err" "no tensor of" "says nothing was compared"
python3 - "$M" "$T/part.safetensors" <<'PY'
import json, struct, sys
src, dst = sys.argv[1:3]
with open(src, "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]; h = json.loads(f.read(n)); data = f.read()
names = sorted(k for k in h if k != "__metadata__")[:3]
out, blobs, off = {}, [], 0
for k in names:
    b, e = h[k]["data_offsets"]; out[k] = dict(h[k], data_offsets=[off, off + e - b]); blobs.append(data[b:e]); off += e - b
t = json.dumps(out).encode(); t += b" " * (-len(t) % 8)
open(dst, "wb").write(struct.pack("<Q", len(t)) + t + b"".join(blobs))
PY
expect_rc 3 "eval of a candidate holding 3 of 27 tensors" "$STZ" eval "$M" "$T/part.safetensors" --threshold 0.99 -q
has "$T/err" "check failed: tensor '.*' is missing from" "names the missing tensors"
has "$T/out" "24 tensor(s) missing from the candidate" "counts them"
expect_rc 0 "--allow-missing" "$STZ" eval "$M" "$T/part.safetensors" --threshold 0.99 -q --allow-missing
expect_rc 3 "eval --json of a partial candidate" "$STZ" eval "$M" "$T/part.safetensors" --json
has "$T/out" '"passed":[[:space:]]*false' "json says it failed"
has "$T/out" '"missing_from_candidate"' "json lists the missing tensors"
expect_rc 3 "eval --json with a threshold" "$STZ" eval "$M" "$T/q.safetensors" --json --threshold 0.99999
has "$T/out" '"below_threshold":[[:space:]]*\[' "json lists tensors below the threshold"
has "$T/out" '"model.layers.0.mlp.up_proj.weight"' "by name"

# 8. Read-only commands take model directories.
expect_rc 0 "eval two directories" "$STZ" eval "$D" "$T/hf4.stz" --threshold 0.9 -q
has "$T/out" "0 tensor(s) below" "directory eval"
expect_rc 0 "eval a directory against its lossless copy" "$STZ" eval "$D" "$T/hf.stz" --threshold 0.999999 -q
expect_rc 0 "inspect a directory" "$STZ" inspect "$D"
has "$T/out" "model-00002-of-00002.safetensors" "lists the shards"
expect_rc 0 "inspect a compressed directory" "$STZ" inspect "$T/hf4.stz"
expect_rc 0 "verify a compressed directory" "$STZ" verify "$T/hf.stz"
has "$T/out" "model-00001-of-00002.safetensors.stz: OK" "verifies every shard"
expect_rc 0 "plan a directory" "$STZ" plan --int4 "$D"
has "$T/out" "transformer.h.0.mlp.c_fc.weight" "plans every shard"
mkdir "$T/single"
cp "$M" "$T/single/model.safetensors"
expect_rc 0 "inspect a single-file repository" "$STZ" inspect "$T/single"
expect_rc 0 "eval a single-file repository" "$STZ" eval "$T/single" "$M" --threshold 0.999999 -q
expect_rc 1 "a directory that is no model" "$STZ" inspect "$T/hf.back/original"
has "$T/err" "not a model directory" "says so"

# 9. A FIFO (or device) as input is refused at once, never waited on.
mkfifo "$T/fifo.safetensors"
for cmd in inspect pack "compress --int4" "quantize --int4 -o $T/f.out" verify "policy show"; do
    # shellcheck disable=SC2086
    expect_rc 1 "$cmd on a FIFO" timeout 10 "$STZ" $cmd "$T/fifo.safetensors"
    has "$T/err" "a FIFO" "$cmd names the FIFO"
done
expect_rc 1 "a FIFO as policy" timeout 10 "$STZ" plan --policy "$T/fifo.safetensors" "$M"
expect_rc 1 "a device as input" timeout 10 "$STZ" inspect /dev/zero
has "$T/err" "a device" "names the device"

# 9b. -o with -f replaces only a regular file: a device, FIFO, socket or
# directory at the output path is refused by name and left as it is.
mkdir -p "$T/sp"
mkfifo "$T/sp/fifo"
python3 -c 'import socket,sys; socket.socket(socket.AF_UNIX).bind(sys.argv[1])' "$T/sp/sock"
mkdir "$T/sp/dir"
special_out() { # name description
    before=$(ls -ld "$T/sp/$1" | cut -c1)
    for cmd in "pack $M" "unpack $T/sp.stz" "compress --int4 $M" "compress --lossless $M" "decompress $T/sp.stz" \
        "quantize --int8 $M" "dequantize $T/q.safetensors" "synth tiny"; do
        # shellcheck disable=SC2086
        expect_rc 1 "$cmd -o $1 -f" timeout 20 "$STZ" $cmd -o "$T/sp/$1" -f
        has "$T/err" "output is $2" "$cmd names $2"
    done
    [ "$(ls -ld "$T/sp/$1" | cut -c1)" = "$before" ] && ok || bad "$1 replaced"
}
"$STZ" pack "$M" -o "$T/sp.stz" -q
special_out fifo "a FIFO"
special_out sock "a socket"
special_out dir "a directory"
if mknod "$T/sp/cdev" c 1 3 2>/dev/null; then special_out cdev "a device"; else echo "skip: mknod not permitted: no device case"; fi
ls -A "$T/sp" | grep -q "tmp-" && bad "temporary file left beside special files" || ok

# 10. Millions of empty tensors are refused before they are parsed.
python3 - "$T/many.safetensors" <<'PY'
import struct, sys
body = ",".join('"t%d":{"dtype":"F32","shape":[0],"data_offsets":[0,0]}' % i for i in range(300000))
t = ("{" + body + "}").encode(); t += b" " * (-len(t) % 8)
open(sys.argv[1], "wb").write(struct.pack("<Q", len(t)) + t)
PY
expect_rc 1 "300,000 tensors" sh -c "$MEMCAP exec \"$STZ\" inspect \"$T/many.safetensors\""
has "$T/err" "more than 262144 tensors per file are refused" "says why"

# 11. A container that decodes to more than the disk holds fails before
# writing, naming both (on a 1 MiB tmpfs when this user may mount one).
python3 -c "import struct,sys; t=b'{\"z\":{\"dtype\":\"F32\",\"shape\":[1048576],\"data_offsets\":[0,4194304]}}'; sys.stdout.buffer.write(struct.pack('<Q',len(t))+t+bytes(4194304))" >"$T/zeros.safetensors"
"$STZ" pack -q "$T/zeros.safetensors" -o "$T/zeros.stz"
mkdir "$T/small"
if mount -t tmpfs -o size=1m tmpfs "$T/small" 2>/dev/null; then
    expect_rc 1 "4 MiB into 1 MiB" "$STZ" unpack "$T/zeros.stz" -o "$T/small/z.safetensors"
    has "$T/err" "not enough free space: unpacking .*zeros.stz needs 41943[0-9]* bytes" "names both and the need"
    [ -z "$(ls -A "$T/small")" ] && ok || bad "nothing left on the small disk"
    # streaming compress runs out of space part way (the container's size is not known ahead): an error, nothing left
    python3 -c "import struct,sys,random; random.seed(1); t=b'{\"w\":{\"dtype\":\"F32\",\"shape\":[2048,1024],\"data_offsets\":[0,8388608]}}'; sys.stdout.buffer.write(struct.pack('<Q',len(t))+t+struct.pack('<2097152f',*[random.gauss(0,1) for _ in range(2097152)]))" >"$T/noise.safetensors"
    for t in 1 2; do
        expect_rc 1 "compress into a full disk, -T $t" "$STZ" compress --int8 "$T/noise.safetensors" -o "$T/small/n.stz" -T $t
        has "$T/err" "No space left" "says the disk is full"
        [ -z "$(ls -A "$T/small")" ] && ok || bad "compress left something on the full disk"
    done
    umount "$T/small"
else
    echo "skip: cannot mount a small tmpfs (not root); tests/test_safetensors covers stz_check_space"
fi

# 12. Control characters in names are refused, like the reference parser;
# zero-element tensors with huge other dimensions allocate nothing.
python3 - "$T" <<'PY'
import json, struct, sys
T = sys.argv[1]
def write(path, text, data=b""):
    t = text.encode(); t += b" " * (-len(t) % 8)
    open(path, "wb").write(struct.pack("<Q", len(t)) + t + data)
write(T + "/nul.safetensors", '{"a\x00b":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}', b"\0" * 4)
write(T + "/ctl.safetensors", '{"a\\u0001b":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}', b"\0" * 4)
write(T + "/zero.safetensors", json.dumps({"z": {"dtype": "F32", "shape": [0, 1 << 40], "data_offsets": [0, 0]},
                                          "w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}}), b"\0" * 16)
PY
expect_rc 1 "raw NUL in a name" "$STZ" inspect "$T/nul.safetensors"
has "$T/err" "raw control character" "raw control character"
expect_rc 1 "escaped control character in a name" "$STZ" inspect "$T/ctl.safetensors"
has "$T/err" "control character 0x01" "escaped control character"
expect_rc 0 "eval a zero-element tensor of huge shape" sh -c "$MEMCAP exec \"$STZ\" eval \"$T/zero.safetensors\" \"$T/zero.safetensors\" -q"
expect_rc 0 "quantize it" sh -c "$MEMCAP exec \"$STZ\" quantize --set 'z=int4' --set 'w=int8' \"$T/zero.safetensors\" -o \"$T/zq.safetensors\" -q"
expect_rc 0 "dequantize it" "$STZ" dequantize "$T/zq.safetensors" -o "$T/zd.safetensors" -q
python3 "$(dirname "$0")/edit_meta.py" "$T/q.safetensors" "$T/qbad.safetensors" "stz.quant.$W" method=nf4
"$STZ" pack -q "$T/qbad.safetensors" -o "$T/qbad.stz"
expect_rc 1 "errors name the input, not a temporary file" "$STZ" decompress --dequantize "$T/qbad.stz" -o "$T/qbad.out"
has "$T/err" "qbad.stz" "names the container"
hasnt "$T/err" "unpacked-" "no temporary name"
expect_rc 1 "eval of a bad container names it" "$STZ" eval "$M" "$T/qbad.stz"
hasnt "$T/err" "unpacked-" "eval: no temporary name"

# 13. Duplicate keys in policies are refused; reserved container bytes must be zero.
printf '{"default": "int8", "default": "keep"}' >"$T/dup.json"
expect_rc 1 "duplicate top-level key" "$STZ" plan --policy "$T/dup.json" "$M"
has "$T/err" "'default' appears twice" "names the key"
printf '{"rules": [{"match": "*", "action": "int8", "action": "keep"}]}' >"$T/dup2.json"
expect_rc 1 "duplicate key in a rule" "$STZ" quantize --policy "$T/dup2.json" "$M" -o "$T/dup.out"
has "$T/err" "rule 0 ('\*'): key 'action' appears twice" "names rule and key"
# A regular expression whose compiled form is exponential (found by fuzzing:
# "o" then 140 "+" took gigabytes in regcomp) is refused, not compiled.
printf '{"rules": [{"match": "re:((((((((((((((a)+)+)+)+)+)+)+)+)+)+)+)+)+)+", "action": "int8"}]}' >"$T/re.json"
expect_rc 1 "exponential regular expression" sh -c "$MEMCAP exec \"$STZ\" policy show \"$T/re.json\""
has "$T/err" "regular expression too costly to compile" "says why"
expect_rc 1 "stacked quantifiers" "$STZ" policy show "$(dirname "$0")/corpus/policy/regex-exponential.json"
# Counted repetition multiplies: "(.*){1,640}z" once passed the check and
# took glibc's regcomp 29 s and 1.4 GB (cubic in the empty-matching copies).
printf '{"rules": [{"match": "*.norm.weight", "action": "keep"}, {"match": "re:(.*){1,640}z", "action": "int8"}]}' >"$T/re2.json"
expect_rc 1 "counted repetition of .*" timeout 5 "$STZ" policy show "$T/re2.json"
has "$T/err" "rule 1 ('re:(.\*){1,640}z')" "names the rule"
has "$T/err" "regular expression too costly to compile" "says why"
# found by fuzz_policy: an unbounded repetition of what can match nothing,
# nested: regcomp ran for minutes on "((.*){0,}){1,40}"
# found by fuzz_policy: an unmatched ')' closed stz's anchoring "^(...)$" early,
# so the repetition after it copied the whole pattern 6440 times (2.3 GB)
expect_rc 1 "an unmatched ')'" timeout 5 "$STZ" policy show "$(dirname "$0")/corpus/policy/regex-unmatched-paren.json"
has "$T/err" "unmatched ')' in the regular expression" "says why"
for re in '((.*){0,}){1,40}' '(.*)*' '(a|)+'; do
    printf '{"rules": [{"match": "re:%s", "action": "keep"}]}' "$re" >"$T/re4.json"
    expect_rc 1 "unbounded repetition of a nullable $re" timeout 5 "$STZ" policy show "$T/re4.json"
    has "$T/err" "regular expression too costly to compile" "says why"
done
printf '{"rules": [{"match": "re:(.*){1,90}z|model\\\\.layers\\\\.(1[0-9]|2[0-3])\\\\..*", "action": "int8"}]}' >"$T/re3.json"
expect_rc 0 "a regular expression within the bounds" timeout 5 "$STZ" policy show "$T/re3.json"
"$STZ" pack -q "$M" -o "$T/r.stz"
python3 - "$T/r.stz" <<'PY'
import struct, sys
b = bytearray(open(sys.argv[1], "rb").read())
rec = 64 + struct.unpack_from("<Q", b, 32)[0]  # first chunk record follows the header section
assert b[rec:rec + 4] == b"STZC"
b[rec + 12] = 1  # a reserved byte
open(sys.argv[1], "wb").write(b)
PY
expect_rc 1 "reserved record byte set" "$STZ" verify "$T/r.stz"
has "$T/err" "chunk 0" "names the chunk"

# 14. The wrong kind of file: say what it is and what fits.
expect_rc 1 "pack a container" "$STZ" pack "$T/r.stz" -o "$T/rr.stz"
has "$T/err" "an stz container, not a SafeTensors file: use 'stz unpack'" "container recognised"
expect_rc 1 "dequantize a container" "$STZ" dequantize "$T/q.stz" -o "$T/x.safetensors"
has "$T/err" "stz decompress" "points to decompress"
expect_rc 1 "compress a policy" "$STZ" compress --int4 "$T/dup.json" -o "$T/x.stz"
has "$T/err" "a JSON text" "JSON recognised"
printf 'GGUF\003\000\000\000\000\000\000\000\000\000\000\000' >"$T/m.gguf"
expect_rc 1 "inspect a truncated GGUF" "$STZ" inspect "$T/m.gguf"
has "$T/err" "m.gguf: the file ends inside its GGUF header" "truncated GGUF named"
expect_rc 1 "quantize GGUF" "$STZ" quantize --int4 "$T/m.gguf" -o "$T/x.safetensors"
has "$T/err" "a GGUF file" "GGUF recognised"
printf 'PK\003\004\024\000\000\000\010\000\000\000' >"$T/m.pt"
expect_rc 1 "a PyTorch zip" "$STZ" quantize --int4 "$T/m.pt" -o "$T/x.safetensors"
has "$T/err" "PyTorch" "zip recognised"
printf '\200\002}q\000(X\001\000\000\000aq' >"$T/m.bin"
expect_rc 1 "a pickle" "$STZ" inspect "$T/m.bin"
has "$T/err" "pickle" "pickle recognised"
printf '# notes\nA model card, not a model.\n' >"$T/card.md"
for cmd in inspect "quantize --int4 -o $T/x.safetensors" "eval $M"; do
    expect_rc 1 "$cmd a text file" "$STZ" $cmd "$T/card.md"
    has "$T/err" "card.md: a text file" "$cmd: text recognised"
    hasnt "$T/err" "header length" "$cmd: no made-up header length"
done
for cmd in "unpack -o $T/x.safetensors" verify "decompress -o $T/x.safetensors"; do
    expect_rc 1 "$cmd a SafeTensors file" "$STZ" $cmd "$M"
    has "$T/err" "a SafeTensors file, not an stz container" "$cmd: SafeTensors recognised"
done
expect_rc 1 "unpack - of a SafeTensors stream" sh -c "'$STZ' unpack - -o '$T/x.safetensors' <'$M'"
has "$T/err" "a SafeTensors file, not an stz container" "unpack -: SafeTensors recognised"
# "-" where a command needs offsets: one clear refusal, not "-: cannot open"
for cmd in inspect "plan --int4" "quantize --int4 -o $T/x.out" "dequantize -o $T/x.out" "eval $M" \
    "export --gguf -o $T/x.out" "tune --size 9999"; do
    expect_rc 1 "$cmd -" "$STZ" $cmd -
    has "$T/err" "standard input ('-'): this needs a seekable file" "$cmd - says why"
done
# a model of another family without a configuration: --config cannot help, say what runs
"$STZ" synth gpt2-tiny -o "$T/gpt2.safetensors" -q
python3 "$(dirname "$0")/edit_meta.py" "$T/gpt2.safetensors" "$T/gpt2a.safetensors" config -
python3 "$(dirname "$0")/edit_meta.py" --rename "$T/gpt2a.safetensors" "$T/gpt2b.safetensors" transformer. encoder.
for cmd in "eval --forward $T/gpt2b.safetensors" "export --gguf -o $T/gpt2.gguf" "tune --size 9999"; do
    expect_rc 1 "$cmd on another family" "$STZ" $cmd "$T/gpt2b.safetensors"
    has "$T/err" "not a model of a family stz runs" "$cmd: says which models run"
    hasnt "$T/err" "give one with --config" "$cmd: does not ask for a configuration"
done
# GPT-Neo without one is (it names its embedding as GPT-2 does, and its attention as its own)
python3 "$(dirname "$0")/edit_meta.py" "$T/neo.safetensors" "$T/neo2.safetensors" config -
expect_rc 1 "GPT-Neo without a configuration" "$STZ" eval --forward "$T/neo2.safetensors" "$T/neo2.safetensors"
has "$T/err" "give one with --config FILE" "a GPT-Neo model is asked for its configuration"
python3 "$(dirname "$0")/edit_meta.py" "$M" "$T/noconf.safetensors" config -
expect_rc 1 "a Llama model without configuration" "$STZ" eval --forward "$T/noconf.safetensors" "$M"
has "$T/err" "give one with --config FILE" "a Llama-family model is asked for its configuration"

# 15. inspect on quantized files and containers: original names, dtypes,
# shapes, methods; the true parameter count; lossless or lossy.
expect_rc 0 "inspect a quantized file" "$STZ" inspect "$T/q.safetensors"
has "$T/out" "quantized by stz: 27 tensors, 123,968 parameters" "true parameter count"
has "$T/out" "model.layers.0.mlp.up_proj.weight  *BF16  *\[172, 64\]  *int4 nl b32" "original dtype, shape, method"
expect_rc 0 "inspect an int4 container" "$STZ" inspect "$T/q.stz"
has "$T/out" "lossy: holds a model quantized by stz" "lossy container"
expect_rc 0 "inspect a lossless container" "$STZ" inspect "$T/hf.stz/model-00001-of-00002.safetensors.stz"
has "$T/out" "lossless: unpacks to the original file byte for byte" "lossless container"
expect_rc 0 "inspect --json of a quantized container" "$STZ" inspect --json "$T/q.stz"
has "$T/out" '"lossless":[[:space:]]*false' "json lossless flag"
has "$T/out" '"method":[[:space:]]*"nl"' "json method"
has "$T/out" '"params":[[:space:]]*123968' "json true parameter count"
expect_rc 0 "inspect svd" "$STZ" inspect "$T/svd.safetensors"
has "$T/out" "svd rank 8" "svd rank shown"

# 16. Rules that match nothing are reported by quantize and compress, with
# the name a typo probably meant.
expect_rc 0 "a typo in a --keep" "$STZ" quantize --int4 --keep lm-head.weight "$M" -o "$T/typo.safetensors"
has "$T/err" "rule 0 ('lm-head.weight') matched no tensor; did you mean 'lm_head.weight'?" "suggests the name"
expect_rc 0 "compress warns too" "$STZ" compress --int4 --keep lm-head.weight "$M" -o "$T/typo.stz"
has "$T/err" "did you mean 'lm_head.weight'" "compress suggests"
# a rule for a tensor that is there, after one that takes it first (first match wins)
expect_rc 0 "a shadowed --set" "$STZ" plan --set '*=int4:min_ndim=2' --set 'lm_head.weight=int8' "$M"
has "$T/err" "rule 1 ('lm_head.weight') matched no tensor: rule 0 ('\*') comes first and takes it" "names the rule"
# a model with tied embeddings (no lm_head): the shipped policies' head rules
# are optional, so no warning; a user's rule that matches nothing still warns
python3 -c '
import json, struct, sys
b = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h, data, out, off = json.loads(b[8:8 + n]), b[8 + n:], b"", 0
del h["lm_head.weight"]
for k, v in h.items():
    if k != "__metadata__":
        x, y = v["data_offsets"]
        v["data_offsets"], out, off = [off, off + y - x], out + data[x:y], off + y - x
t = json.dumps(h).encode()
t += b" " * (-len(t) % 8)
open(sys.argv[2], "wb").write(struct.pack("<Q", len(t)) + t + out)' "$M" "$T/tied.safetensors"
for pol in int8 int5 int4 int4-small gguf-q4_0; do
    expect_rc 0 "$pol on a tied model" "$STZ" plan --policy $pol "$T/tied.safetensors"
    hasnt "$T/err" "warning" "$pol: no warning for the head a tied model lacks"
done
printf '{"rules":[{"match":"lm_head.weight","action":"int8"}]}' >"$T/head.json"
expect_rc 0 "a user's head rule on a tied model" "$STZ" plan --policy "$T/head.json" "$T/tied.safetensors"
has "$T/err" "rule 0 ('lm_head.weight') matched no tensor" "a user's rule still warns"

# an svd rule's fallback is quantized with the rule's own parameters, shown by plan
printf '{"rules":[{"match":"*.weight","action":"svd","rank":60,"fallback":"int4","block_size":32,"method":"mse","min_ndim":2}]}' >"$T/svdf.json"
expect_rc 0 "plan an svd rule's fallback" "$STZ" plan --policy "$T/svdf.json" "$M"
has "$T/out" "rank-60 factors would not be smaller: int4/32/mse instead" "the fallback's parameters shown"

# 17. Command-line rules; shipped policies shown; conflicting flags refused.
expect_rc 0 "--set and --keep" "$STZ" plan --policy int4-nl --keep 'model.layers.0.*' --set '*.down_proj.weight=int8:block_size=32' --json "$M"
python3 - "$T/out" <<'PY' && ok || bad "--set/--keep decisions"
import json, sys
d = {t["name"]: t for t in json.load(open(sys.argv[1]))["tensors"]}
assert d["model.layers.0.mlp.up_proj.weight"]["action"] == "keep"
assert d["model.layers.1.mlp.down_proj.weight"]["action"] == "int8" and d["model.layers.1.mlp.down_proj.weight"]["block_size"] == 32
assert d["model.layers.1.mlp.up_proj.weight"]["action"] == "int4"
PY
expect_rc 0 "--method --block-size" "$STZ" plan --policy int4-nl --method mse --block-size 32 --json "$M"
has "$T/out" '"method":[[:space:]]*"mse"' "method applied"
has "$T/out" '"block_size":[[:space:]]*32' "block size applied"
expect_rc 2 "--int4 --int8" "$STZ" quantize --int4 --int8 "$M" -o "$T/x.safetensors"
has "$T/err" "conflict" "says they conflict"
expect_rc 2 "--policy and --int4" "$STZ" compress --policy int8 --int4 "$M"
expect_rc 2 "--lossless with a policy" "$STZ" compress --lossless --int4 "$M"
expect_rc 1 "a bad --set" "$STZ" plan --set 'x=int7' "$M"
has "$T/err" "unknown action 'int7'" "names the problem"
expect_rc 0 "stz policy show" "$STZ" policy show int4
has "$T/out" '"rules"' "prints the policy"
expect_rc 0 "stz policy list" "$STZ" policy list
has "$T/out" "int4-small" "lists the shipped policies"

# 18. --json prints a document wherever it is offered, with the same keys.
expect_rc 0 "decompress --json" "$STZ" decompress "$T/q.stz" -o "$T/dj.safetensors" --json
has "$T/out" '"out_bytes"' "decompress json"
has "$T/out" '"ratio"' "decompress json ratio"
expect_rc 0 "dequantize --json" "$STZ" dequantize "$T/q.safetensors" -o "$T/dq.safetensors" --json
has "$T/out" '"in_bytes"' "dequantize json"

# a sharded directory's totals count its model files alike both ways
"$STZ" synth tiny --shards 2 -o "$T/sd" -q
"$STZ" compress --int4 "$T/sd" -o "$T/sd.c" --json >"$T/sd.cj"
"$STZ" decompress "$T/sd.c" -o "$T/sd.d" --json >"$T/sd.dj"
python3 - "$T" <<'PY' && ok || bad "a directory's byte totals differ between compress and decompress"
import glob, json, os, sys
c, d = (json.load(open("%s/sd.%s" % (sys.argv[1], k))) for k in ("cj", "dj"))
shards = sum(os.path.getsize(f) for f in glob.glob(sys.argv[1] + "/sd/*.safetensors"))
assert c["in_bytes"] == shards and c["out_bytes"] == d["in_bytes"] and d["out_bytes"] > d["in_bytes"], (c, d, shards)
PY

# 19. Lossy and lossless outputs do not collide; decompress says what it did.
cp "$M" "$T/n.safetensors"
expect_rc 0 "compress --int4, default name" "$STZ" compress --int4 "$T/n.safetensors" -q
[ -f "$T/n.int4.safetensors.stz" ] && ok || bad "lossy default name"
expect_rc 0 "compress --lossless, default name" "$STZ" compress --lossless "$T/n.safetensors" -q
[ -f "$T/n.safetensors.stz" ] && ok || bad "lossless default name"
expect_rc 0 "decompress, default name" "$STZ" decompress "$T/n.int4.safetensors.stz"
[ -f "$T/n.int4.safetensors" ] && ok || bad "decompressed default name"
has "$T/out" "n.int4.safetensors.stz -> .*n.int4.safetensors: .* bytes in" "one-line summary"

# 19b. Text from a file reaches the terminal escaped: metadata keys and
# values in inspect, and error messages that quote a file's text.
python3 "$(dirname "$0")/edit_meta.py" "$M" "$T/esc.safetensors" "$(printf 'k\033]0;x\007')" "$(printf 'v\033[31mred\tz\302\233')"
expect_rc 0 "inspect with escapes in metadata" "$STZ" inspect "$T/esc.safetensors"
if od -An -tx1 -v "$T/out" | tr -s ' \n' ' ' | grep -q ' 1b \| 07 \| c2 9b '; then bad "inspect printed a control character raw"; else ok; fi
has "$T/out" 'k\\x1b]0;x\\a = v\\x1b\[31mred\\tz\\x9b' "escaped as \\xNN"
printf '{"rules": [{"match": "*", "action": "int8", "x\033[2J": 1}]}' >"$T/escp.json"
expect_rc 1 "policy with an escape in a key" "$STZ" policy show "$T/escp.json"
if od -An -tx1 -v "$T/err" | tr -s ' \n' ' ' | grep -q ' 1b '; then bad "error message printed a control character raw"; else ok; fi
has "$T/err" 'x\\x1b\[2J' "error escaped"

# 19c. --json wherever a command prints results, with the summary's keys.
expect_rc 0 "policy list --json" "$STZ" policy list --json
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert "int4" in [p["name"] for p in d] and all(p["description"] for p in d)' "$T/out" && ok || bad "policy list --json"
expect_rc 0 "policy show --json" "$STZ" policy show int4 --json
has "$T/out" '"rules"' "policy show --json prints the policy"
expect_rc 0 "unpack --json" "$STZ" unpack "$T/sp.stz" -o "$T/uj.safetensors" --json
for k in input output in_bytes out_bytes ratio seconds; do has "$T/out" "\"$k\"" "unpack --json has $k"; done
expect_rc 2 "unpack --json to standard output" "$STZ" unpack "$T/sp.stz" -c --json
expect_rc 0 "pack --json" "$STZ" pack "$M" -o "$T/pj \"q\".stz" --json
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["output"].endswith("pj \"q\".stz"), d' "$T/out" && ok || bad "pack --json is not JSON for a name with a quote"
# one key per figure (docs/CLI.md): the cosine, counts and shares under the
# same names in quantize, compress, plan, inspect and eval
"$STZ" quantize --int4 "$M" -o "$T/kq.safetensors" --json >"$T/k.quantize"
"$STZ" compress --int4 "$M" -o "$T/kq.stz" --json >"$T/k.compress"
"$STZ" plan --int4 "$M" --json >"$T/k.plan"
"$STZ" inspect "$T/kq.safetensors" --json >"$T/k.inspect"
"$STZ" eval "$M" "$T/kq.stz" --json >"$T/k.eval"
python3 - "$T" <<'PY' && ok || bad "JSON keys differ for one figure across commands"
import json, sys
d = {c: json.load(open("%s/k.%s" % (sys.argv[1], c))) for c in ("quantize", "compress", "plan", "inspect", "eval")}
d["inspect"] = d["inspect"]["model"]
want = {"quantize": "tensor_count tensors_quantized params_quantized_share weighted_cosine min_cosine worst_tensor",
        "compress": "tensors_quantized params_quantized_share weighted_cosine min_cosine worst_tensor",
        "plan": "tensor_count tensors_quantized params_quantized_share", "inspect": "tensor_count tensors_quantized",
        "eval": "params_quantized_share weighted_cosine min_cosine"}
old = {"weighted_mean_cosine", "quantized", "worst", "tensors_compared_count"}
for c, keys in want.items():
    assert set(keys.split()) <= set(d[c]), (c, sorted(d[c]))
    assert not old & set(d[c]), (c, old & set(d[c]))
assert d["quantize"]["tensors_quantized"] == d["compress"]["tensors_quantized"] == d["plan"]["tensors_quantized"]
assert abs(d["quantize"]["weighted_cosine"] - d["compress"]["weighted_cosine"]) < 1e-6  # compress sums in fixed point
PY

# 20. Signals act within a second even while stz waits on an empty pipe
# (the reads poll the interruption flag); no output is left.
wait_gone() { # pid: 0 if it ends within 1 s
    i=0
    while kill -0 "$1" 2>/dev/null && [ $i -lt 10 ]; do i=$((i + 1)); sleep 0.1; done
    ! kill -0 "$1" 2>/dev/null
}
for sig in INT TERM; do
    for cmd in "pack - -c" "unpack - -c" "pack - -o $T/blk.stz" "decompress - -o $T/blk.safetensors"; do
        # shellcheck disable=SC2086
        sh -c 'echo $$ >"$1"; exec sleep 30' sh "$T/blk.writer" | "$STZ" $cmd >/dev/null 2>"$T/blk.err" &
        pid=$!
        sleep 0.3
        kill -$sig $pid
        if wait_gone $pid; then ok; else bad "$cmd blocked on a pipe ignored SIG$sig for 1 s"; kill -9 $pid; fi
        kill "$(cat "$T/blk.writer")" 2>/dev/null # wait waits for the whole pipeline
        wait $pid; rc=$?
        [ "$rc" -ne 0 ] && ok || bad "$cmd exited 0 after SIG$sig"
        has "$T/blk.err" "interrupted" "$cmd says it was interrupted"
    done
done
ls -A "$T" | grep "blk" | grep -qv "^blk.err$\|^blk.writer$" && bad "output left by an interrupted pipe: $(ls -A "$T" | grep blk)" || ok

# 21. Two signals in a row during a sharded compress: the temporary
# directory goes too, finished shards and copied files with it.
"$STZ" synth small -o "$T/sig2" --shards 4 -q
mkdir "$T/sig2out"
for delay in 0.02 0.05 0.1 0.15 0.2; do
    "$STZ" compress --int4 "$T/sig2" -o "$T/sig2out/c" -q -T 2 2>/dev/null &
    pid=$!
    sleep $delay
    # stopped, two different signals are both pending, so the second is
    # handled at once after the first, before any cleanup of the first's
    kill -STOP $pid 2>/dev/null
    kill -INT $pid 2>/dev/null
    kill -TERM $pid 2>/dev/null
    kill -CONT $pid 2>/dev/null
    wait $pid
    left=$(ls -A "$T/sig2out" | grep -v '^c$')
    [ -z "$left" ] && ok || bad "two SIGINTs after ${delay} s left $left"
    rm -rf "$T/sig2out/c"
done

# 22. A model directory whose second shard is broken: every command that
# opens a set of shards fails with status 1 and frees what it opened (under
# make asan a leak would end with LeakSanitizer's status 23 instead).
"$STZ" synth tiny -o "$T/lk" --shards 2 -q
: >"$T/lk/model-00002-of-00002.safetensors"
expect_rc 1 "eval, candidate shard broken" "$STZ" eval "$M" "$T/lk" -q
expect_rc 1 "eval, original shard broken" "$STZ" eval "$T/lk" "$M" -q
expect_rc 1 "eval --forward, shard broken" "$STZ" eval --forward "$M" "$T/lk" --sequences 1 --seq-len 4 -q
expect_rc 1 "export, shard broken" "$STZ" export --gguf "$T/lk" -o "$T/lk.gguf" -q
expect_rc 1 "tune, shard broken" "$STZ" tune "$T/lk" --size 10000 -o "$T/lk.json" -q
[ ! -e "$T/lk.gguf" ] && [ ! -e "$T/lk.json" ] && ok || bad "output left by a failed shard set"

# 23. What a container declares cannot make decoding's memory grow: 512 MiB
# of zeros in 64 MiB chunks packs to a few kB; verify -T 64 once held two
# 64 MiB buffers per chunk at once (1 GiB here, 8.4 GB for 4 GiB), now its
# buffers stay under 512 MiB in all (a measure of resident memory, not time).
if [ -x /usr/bin/time ]; then
    printf '{"z":{"dtype":"U8","shape":[536870912],"data_offsets":[0,536870912]}}' >"$T/zh"
    python3 -c 'import struct,sys; sys.stdout.buffer.write(struct.pack("<Q", 80))' >"$T/zeros.safetensors"
    printf '%-80s' "$(cat "$T/zh")" >>"$T/zeros.safetensors"
    truncate -s $((8 + 80 + 536870912)) "$T/zeros.safetensors"
    "$STZ" pack "$T/zeros.safetensors" -o "$T/zeros.stz" --chunk-size 67108864 -q -T 2
    rm -f "$T/zeros.safetensors"
    [ "$(stat -c %s "$T/zeros.stz")" -lt 100000 ] && ok || bad "512 MiB of zeros packed to $(stat -c %s "$T/zeros.stz") bytes"
    /usr/bin/time -f %M -o "$T/rss" "$STZ" verify "$T/zeros.stz" -T 64 -q && ok || bad "verify of the zeros container"
    rss=$(tail -1 "$T/rss")
    [ "$rss" -lt 700000 ] && ok || bad "verify -T 64 of 64 MiB chunks peaked at $rss kB"
    rm -f "$T/zeros.stz"
else
    echo "skip: no /usr/bin/time (apt-get install time): decoding memory bound not measured"
fi

# 24. A container read from a file and from a pipe is judged alike: verify
# FILE and verify - agree on every file of the container corpus.
for f in "$CORPUS"/stz/*.stz; do
    "$STZ" verify "$f" -q >/dev/null 2>&1; a=$?
    "$STZ" verify - -q <"$f" >/dev/null 2>&1; b=$?
    [ "$(test $a -eq 0; echo $?)" = "$(test $b -eq 0; echo $?)" ] && ok ||
        bad "verify $(basename "$f"): exit $a from the file, $b from a pipe"
done

finish safety
