#!/bin/sh
# Never lose or corrupt a user's data; never pass a gate that checked
# nothing; refuse hostile input clearly. Usage: test_safety.sh STZ [DATA]
set -u
. "$(dirname "$0")/cli_lib.sh"
CORPUS=$(dirname "$0")/corpus

"$STZ" synth tiny -o "$T/m.safetensors" -q
M=$T/m.safetensors
"$STZ" quantize --int4 "$M" -o "$T/q.safetensors" -q
"$STZ" compress --int4 "$M" -o "$T/q.stz" -q

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
"$STZ" synth gpt-neo-tiny -o "$T/neo.safetensors" -q
"$STZ" quantize --set '*.mlp.c_fc.weight=svd:rank=8' "$T/neo.safetensors" -o "$T/svd.safetensors" -q
python3 "$(dirname "$0")/edit_meta.py" "$T/svd.safetensors" "$T/svd4.safetensors" \
    stz.quant.transformer.h.0.mlp.c_fc.weight bits=4
expect_rc 1 "svd entry with bits 4" "$STZ" dequantize "$T/svd4.safetensors" -o "$T/x.safetensors"
has "$T/err" "svd factors with 'bits' other than 8" "svd bits"
[ -e "$T/x.safetensors" ] && bad "output written for refused metadata" || ok

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

finish safety
