#!/bin/sh
# End-to-end checks of the stz program: exit statuses, messages, refusal to
# overwrite, clean interruption. Usage: test_cli.sh STZ [SHARED_DATA_DIR]
set -u
. "$(dirname "$0")/cli_lib.sh"

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
expect_rc 0 "synth --layers" "$STZ" synth tiny --layers 5 -o "$T/deep.safetensors" -q
expect_rc 0 "inspect the deeper model" "$STZ" inspect "$T/deep.safetensors"
has "$T/out" "model.layers.4.mlp.down_proj.weight" "five layers written"
hasnt "$T/out" "model.layers.5." "no sixth layer"
expect_rc 2 "synth --layers 0" "$STZ" synth tiny --layers 0 -o "$T/x.safetensors"
expect_rc 0 "synth --shards" "$STZ" synth tiny --shards 3 -o "$T/shards" -q
[ -f "$T/shards/model-00003-of-00003.safetensors" ] && [ -f "$T/shards/config.json" ] &&
    [ -f "$T/shards/model.safetensors.index.json" ] && ok || bad "synth --shards layout"
"$STZ" synth tiny -o "$T/one.safetensors" -q
expect_rc 0 "the shards hold the single file's values" "$STZ" eval "$T/one.safetensors" "$T/shards" -q --threshold 0.999999
has "$T/out" "27 tensors compared" "every tensor of the sharded model"
expect_rc 1 "synth --shards over a directory" "$STZ" synth tiny --shards 2 -o "$T/shards" -f
ls -A "$T" | grep -q "shards.tmp" && bad "synth --shards left a temporary directory" || ok
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

# Lossless container.
M="$T/tiny.safetensors"
expect_rc 0 "pack" "$STZ" pack "$M"
has "$T/out" "tiny.safetensors.stz" "pack default output name"
has "$T/out" "x) in" "pack summary"
expect_rc 0 "pack -T1" "$STZ" pack "$M" -o "$T/t1.stz" -T 1 -q
expect_rc 0 "pack -T3" "$STZ" pack "$M" -o "$T/t3.stz" -T 3 -q
cmp -s "$T/t1.stz" "$T/t3.stz" && ok || bad "containers differ between -T1 and -T3"
cmp -s "$T/t1.stz" "$M.stz" && ok || bad "container differs from default run"
expect_rc 0 "pack --best" "$STZ" pack "$M" -o "$T/best.stz" --best --json
has "$T/out" '"ratio"' "pack --json"
expect_rc 1 "pack over existing" "$STZ" pack "$M" -o "$T/t1.stz"
expect_rc 1 "pack onto its input" "$STZ" pack "$M" -o "$M" -f
cmp -s "$M" "$T/tiny.safetensors" && ok || bad "input changed"
expect_rc 1 "pack a non-model" "$STZ" pack "$T/err" -o "$T/junk.stz"
[ -e "$T/junk.stz" ] && bad "junk container written" || ok
expect_rc 0 "verify" "$STZ" verify "$T/t1.stz" "$T/best.stz"
has "$T/out" "t1.stz: OK" "verify line"
expect_rc 0 "unpack" "$STZ" unpack "$T/t1.stz" -o "$T/back.safetensors"
cmp -s "$M" "$T/back.safetensors" && ok || bad "unpacked file differs"
cp "$M.stz" "$T/copy.safetensors.stz"
expect_rc 0 "unpack default name" "$STZ" unpack "$T/copy.safetensors.stz" -q
cmp -s "$M" "$T/copy.safetensors" && ok || bad "default-name unpack differs"
expect_rc 0 "unpack --best container" "$STZ" unpack "$T/best.stz" -o "$T/back2.safetensors"
cmp -s "$M" "$T/back2.safetensors" && ok || bad "--best round trip differs"
expect_rc 0 "unpack --tensor" "$STZ" unpack "$T/t1.stz" --tensor model.norm.weight -o "$T/norm.bin"
[ "$(wc -c <"$T/norm.bin")" -eq 128 ] && ok || bad "tensor extract size"
expect_rc 1 "unpack missing tensor" "$STZ" unpack "$T/t1.stz" --tensor nope -o "$T/nope.bin"
has "$T/err" "no tensor named 'nope'" "missing tensor message"
expect_rc 0 "inspect container" "$STZ" inspect "$T/t1.stz"
has "$T/out" "stz container v3, 27 tensors" "container inspect header"
has "$T/out" "exponent" "container inspect planes"
expect_rc 0 "inspect container --json" "$STZ" inspect --json "$T/t1.stz"
has "$T/out" '"format":[[:space:]]*"stz"' "container json"
CC=$(dirname "$0")/corpus/stz
expect_rc 1 "verify corrupt" "$STZ" verify "$CC/payload_flip.stz"
has "$T/err" "checksum mismatch" "corrupt message"
expect_rc 1 "unpack corrupt" "$STZ" unpack "$CC/payload_flip.stz" -o "$T/corrupt.safetensors"
[ -e "$T/corrupt.safetensors" ] && bad "corrupt container produced output" || ok
expect_rc 1 "unpack a SafeTensors file" "$STZ" unpack "$M" -o "$T/x.safetensors"
has "$T/err" "not an stz container" "wrong input message"
# standard output: in order, the same bytes; one tensor; a damaged chunk stops the stream with an error
expect_rc 0 "unpack -c" "$STZ" unpack "$T/t1.stz" -c -T 2
same "$T/out" "$M" "unpack -c gives the original bytes"
expect_rc 0 "unpack -o - --tensor" "$STZ" unpack "$T/t1.stz" -o - --tensor model.norm.weight
[ "$(wc -c <"$T/out")" -eq 128 ] && ok || bad "tensor to standard output size"
expect_rc 1 "unpack -c corrupt" "$STZ" unpack "$CC/payload_flip.stz" -c
has "$T/err" "checksum mismatch" "corrupt stream message"
expect_rc 0 "pack -c" "$STZ" pack "$M" -c -T 2
same "$T/out" "$T/t1.stz" "pack -c writes the same container as to a file"
has "$T/err" "standard output" "pack -c's summary goes to standard error"
expect_rc 2 "pack -c --json" "$STZ" pack "$M" -c --json
# a SafeTensors file piped in: the same container; truncated, trailing or no input fails and leaves nothing
expect_rc 0 "pack - -o" sh -c "\"$STZ\" pack - -o \"$T/piped.stz\" -T 2 <\"$M\""
same "$T/piped.stz" "$T/t1.stz" "pack - gives the container pack FILE gives"
has "$T/out" "standard input ->" "the summary names standard input"
expect_rc 0 "pack - -c" sh -c "\"$STZ\" pack - -c -q <\"$M\""
same "$T/out" "$T/t1.stz" "pack - -c"
expect_rc 0 "compress --lossless - -o" sh -c "\"$STZ\" compress --lossless - -o \"$T/piped2.stz\" <\"$M\""
same "$T/piped2.stz" "$T/t1.stz" "compress --lossless - gives pack's container"
expect_rc 1 "pack - truncated" sh -c "head -c 20000 \"$M\" | \"$STZ\" pack - -o \"$T/x.stz\""
has "$T/err" "ended after .* data bytes its header declares" "a truncated input says so"
expect_rc 1 "pack - with bytes after the data" sh -c "(cat \"$M\"; echo x) | \"$STZ\" pack - -o \"$T/x.stz\""
has "$T/err" "bytes after the last tensor" "trailing bytes named"
expect_rc 1 "pack - of nothing" "$STZ" pack - -o "$T/x.stz"
has "$T/err" "before the header's length" "empty input named"
[ -e "$T/x.stz" ] && bad "a failed pack - left its output" || ok
expect_rc 2 "pack - without an output" sh -c "\"$STZ\" pack - <\"$M\""
[ -e "./-" ] && bad "a file named - was written" || ok
# compress, decompress, quantize, dequantize to standard output: the bytes they write to files
"$STZ" compress --int4 "$M" -o "$T/so4.stz" -q
"$STZ" quantize --int4 "$M" -o "$T/so4.safetensors" -q
"$STZ" dequantize "$T/so4.safetensors" -o "$T/sod4.safetensors" -q
expect_rc 0 "compress -c" "$STZ" compress --int4 "$M" -c
same "$T/out" "$T/so4.stz" "compress -c"
expect_rc 0 "compress --lossless -o -" "$STZ" compress --lossless "$M" -o -
same "$T/out" "$T/t1.stz" "compress --lossless -o -"
expect_rc 0 "decompress -c" "$STZ" decompress "$T/so4.stz" -c
same "$T/out" "$T/so4.safetensors" "decompress -c"
expect_rc 0 "decompress --dequantize -c" "$STZ" decompress "$T/so4.stz" --dequantize -c
same "$T/out" "$T/sod4.safetensors" "decompress --dequantize -c"
expect_rc 0 "quantize -o -" "$STZ" quantize --int4 "$M" -o -
same "$T/out" "$T/so4.safetensors" "quantize -o -"
expect_rc 0 "dequantize -o -" "$STZ" dequantize "$T/so4.safetensors" -o -
same "$T/out" "$T/sod4.safetensors" "dequantize -o -"
expect_rc 2 "compress -c --json" "$STZ" compress --int4 "$M" -c --json
# compress is one pass: no intermediate file anywhere (none in $TMPDIR, none beside the output), and its
# container is the one pack makes of quantize's file (calibration's results wait in an unlinked file in
# $TMPDIR: --fast has none)
"$STZ" pack "$T/so4.safetensors" -o "$T/so4p.stz" -q && same "$T/so4p.stz" "$T/so4.stz" "compress = pack(quantize)"
"$STZ" compress --int4 --fast "$M" -o "$T/so4f.stz" -q
expect_rc 0 "compress --fast -c with no usable TMPDIR" env TMPDIR=/nonexistent "$STZ" compress --int4 --fast "$M" -c -T 2
same "$T/out" "$T/so4f.stz" "compress -c in one pass"
mkdir "$T/tmpdir"
expect_rc 0 "compress -c, calibrated" env TMPDIR="$T/tmpdir" "$STZ" compress --int4 "$M" -c -T 2
same "$T/out" "$T/so4.stz" "compress -c, calibrated"
[ -z "$(ls -A "$T/tmpdir")" ] && ok || bad "calibration left $(ls -A "$T/tmpdir") in TMPDIR"
expect_rc 1 "quantize, calibrated, with no usable TMPDIR" env TMPDIR=/nonexistent "$STZ" quantize --int4 "$M" -o "$T/notmp.safetensors"
has "$T/err" "temporary file for the feedback results in /nonexistent (set TMPDIR" "the error names TMPDIR"
[ ! -e "$T/notmp.safetensors" ] && ok || bad "quantize left its output after failing"
# containers piped in: unpack, decompress and verify read standard input in order
"$STZ" pack "$M" -c -q | "$STZ" unpack - -o "$T/piped.safetensors" && same "$T/piped.safetensors" "$M" "pack -c | unpack -"
"$STZ" compress --int4 "$M" -c | "$STZ" decompress - --dequantize -c >"$T/piped.deq" && same "$T/piped.deq" "$T/sod4.safetensors" "compress -c | decompress - --dequantize -c"
expect_rc 0 "verify -" sh -c "\"$STZ\" verify - <\"$T/t1.stz\""
expect_rc 1 "unpack - truncated" sh -c "head -c 3000 \"$T/t1.stz\" | \"$STZ\" unpack - -o \"$T/trunc.safetensors\""
has "$T/err" "ended early" "a truncated stream says so"
[ -e "$T/trunc.safetensors" ] && bad "a truncated stream left an output file" || ok
expect_rc 1 "unpack - with bytes after the end" sh -c "(cat \"$T/t1.stz\"; echo x) | \"$STZ\" unpack - -c >/dev/null"
has "$T/err" "after the container's end" "trailing bytes named"
expect_rc 1 "unpack - corrupt" sh -c "\"$STZ\" unpack - -c <\"$CC/payload_flip.stz\" >/dev/null"
has "$T/err" "checksum mismatch" "a damaged record in a stream"
expect_rc 2 "unpack - --tensor" sh -c "\"$STZ\" unpack - --tensor model.norm.weight -c <\"$T/t1.stz\""
expect_rc 2 "unpack - without an output" sh -c "\"$STZ\" unpack - <\"$T/t1.stz\""
expect_rc 2 "compress --int4 from standard input" sh -c "\"$STZ\" compress --int4 - -o \"$T/x.stz\" <\"$M\""
has "$T/err" "lossless packs standard input" "compress says why quantizing needs a file"

# Policies, quantization, evaluation.
expect_rc 0 "plan --int4" "$STZ" plan --int4 "$M"
has "$T/out" "iq4_nl" "plan action column: --int4 is llama.cpp's types"
has "$T/out" "model.embed_tokens.weight  *BF16  *0  *q5_1 " "--int4 quantizes the embeddings (llama.cpp's fallback for 64-wide rows)"
expect_rc 0 "plan --policy int4-nl" "$STZ" plan --policy int4-nl "$M"
has "$T/out" "int4/32/nl/u8" "the old int4 as int4-nl"
expect_rc 0 "plan --policy gguf-mix4" "$STZ" plan --policy gguf-mix4 "$M"
has "$T/out" "iq4_nl" "gguf-mix4 is the new int4"
has "$T/out" "predicted ratio" "plan totals"
printf '{"default": "int8", "rules": [{"match": "nothing*", "action": "keep"}]}' >"$T/pol.json"
expect_rc 0 "plan custom policy" "$STZ" plan --policy "$T/pol.json" "$M"
has "$T/out" "fewer than 2 dimensions" "plan says why 1-D tensors are kept"
has "$T/err" "rule 0 ('nothing\*') matched no tensor" "plan warns about unused rules"
expect_rc 0 "plan --json" "$STZ" plan --policy int8 --json "$M"
has "$T/out" '"predicted_ratio"' "plan json"
expect_rc 0 "plan --policy int4-nl --json" "$STZ" plan --policy int4-nl --json "$M"
has "$T/out" '"method":[[:space:]]*"nl"' "plan json names the rule's method"
expect_rc 1 "--int4 --method: no int rule to change" "$STZ" plan --int4 --method mse "$M"
has "$T/err" "int4 has no int2..int8 rule to change" "--method on llama.cpp's types says so"
expect_rc 0 "--int4 --set int8 --method" "$STZ" plan --int4 --set 'lm_head.weight=int8' --method mse "$M"
printf '{"rules": [{"match": "x", "action": "int7"}]}' >"$T/bad.json"
expect_rc 1 "plan with a bad policy" "$STZ" plan --policy "$T/bad.json" "$M"
has "$T/err" "rule 0 ('x'): unknown action 'int7'" "policy error names the rule"
expect_rc 2 "plan without policy" "$STZ" plan "$M"
expect_rc 0 "quantize --policy int4-nl" "$STZ" quantize --policy int4-nl "$M" -o "$T/q4.safetensors"
has "$T/out" "tensors quantized" "quantize summary"
expect_rc 0 "inspect quantized" "$STZ" inspect "$T/q4.safetensors"
has "$T/out" "stz.quant.model.layers.0.mlp.up_proj.weight" "quantization metadata"
has "$T/out" "model.layers.0.mlp.up_proj.weight.scales" "companion scales tensor"
expect_rc 1 "quantize onto input" "$STZ" quantize --int8 "$M" -o "$M" -f
expect_rc 0 "dequantize" "$STZ" dequantize "$T/q4.safetensors" -o "$T/d4.safetensors"
expect_rc 0 "dequantize --dtype f32" "$STZ" dequantize "$T/q4.safetensors" -o "$T/d32.safetensors" --dtype f32
expect_rc 0 "inspect dequantized" "$STZ" inspect "$T/d32.safetensors"
has "$T/out" "model.layers.0.mlp.up_proj.weight  *F32 " "dequantized dtype"
has "$T/out" "model.norm.weight  *BF16 " "kept tensor keeps its dtype"
expect_rc 0 "eval quantized" "$STZ" eval "$M" "$T/q4.safetensors"
has "$T/out" "weighted mean cosine" "eval summary"
expect_rc 0 "eval dequantized --csv" "$STZ" eval "$M" "$T/d4.safetensors" --csv
has "$T/out" "^name,action,params,cosine" "eval csv header"
expect_rc 3 "eval --threshold" "$STZ" eval "$M" "$T/q4.safetensors" --threshold 0.99999 -q
has "$T/out" "BELOW THRESHOLD" "threshold listing"
expect_rc 0 "eval --json" "$STZ" eval "$M" "$T/q4.safetensors" --json
has "$T/out" '"min_cosine"' "eval json"
expect_rc 1 "eval a missing file" "$STZ" eval "$M" "$T/none.safetensors"
"$STZ" synth gpt-neo-tiny -o "$T/neo.safetensors" -q
expect_rc 0 "plan gpt-neo-surgical" "$STZ" plan --policy gpt-neo-surgical "$T/neo.safetensors"
has "$T/out" "svd/r128" "plan shows the svd rank"
has "$T/out" "would not be smaller: int8/128 instead" "plan shows the svd fallback"
printf '{"rules": [{"match": "*.mlp.c_fc.weight", "action": "svd", "rank": 16, "method": "randomized", "power_iters": 2}]}' >"$T/svd.json"
expect_rc 0 "quantize with svd" "$STZ" quantize --policy "$T/svd.json" "$T/neo.safetensors" -o "$T/neo.svd.safetensors"
expect_rc 0 "inspect svd factors" "$STZ" inspect "$T/neo.svd.safetensors"
has "$T/out" "transformer.h.0.mlp.c_fc.weight.Vh " "svd factor Vh"
has "$T/out" '"method":"svd"' "svd metadata"
has "$T/out" '"svd_method":"randomized","power_iters":2,"oversample":10' "svd metadata records the randomized settings"
expect_rc 0 "eval svd" "$STZ" eval "$T/neo.safetensors" "$T/neo.svd.safetensors" -q
has "$T/out" "256 tensors compared\|30 tensors compared" "eval of svd model"
expect_rc 0 "eval svd --csv" "$STZ" eval "$T/neo.safetensors" "$T/neo.svd.safetensors" --csv
has "$T/out" '"transformer.h.0.mlp.c_fc.weight",svd,' "eval labels svd tensors"
has "$T/out" '"transformer.h.0.attn.attention.k_proj.weight",kept,' "eval labels kept tensors"
expect_rc 0 "dequantize svd" "$STZ" dequantize "$T/neo.svd.safetensors" -o "$T/neo.back.safetensors"
expect_rc 0 "inspect dequantized svd" "$STZ" inspect "$T/neo.back.safetensors"
has "$T/out" "transformer.h.0.mlp.c_fc.weight  *BF16  *\[256, 64\]" "svd tensor restored with its shape"
expect_rc 3 "eval mismatched models" "$STZ" eval "$M" "$T/neo.safetensors" -q
has "$T/err" "is missing from" "eval reports unmatched tensors"

# One-shot pipeline.
expect_rc 0 "compress --lossless" "$STZ" compress --lossless "$M" -o "$T/l.stz"
has "$T/out" "lossless, bit-exact" "lossless summary"
expect_rc 0 "decompress lossless" "$STZ" decompress "$T/l.stz" -o "$T/l.safetensors"
cmp -s "$M" "$T/l.safetensors" && ok || bad "lossless pipeline is not bit-exact"
expect_rc 0 "compress --int4" "$STZ" compress --int4 "$M" -o "$T/c4.stz"
has "$T/out" "cosine vs original: weighted mean" "compress reports quality"
expect_rc 1 "compress over existing" "$STZ" compress --int4 "$M" -o "$T/c4.stz"
expect_rc 2 "compress without mode" "$STZ" compress "$M" -o "$T/x.stz"
expect_rc 0 "decompress quantized" "$STZ" decompress "$T/c4.stz" -o "$T/c4.safetensors"
"$STZ" quantize --int4 "$M" -o "$T/q4g.safetensors" -q
cmp -s "$T/c4.safetensors" "$T/q4g.safetensors" && ok || bad "decompress does not give back the packed quantized file"
expect_rc 0 "decompress --dequantize" "$STZ" decompress "$T/c4.stz" --dequantize --dtype f32 -o "$T/c4p.safetensors"
expect_rc 0 "inspect dequantized pipeline" "$STZ" inspect "$T/c4p.safetensors"
has "$T/out" "model.layers.0.mlp.up_proj.weight  *F32 " "decompressed plain model"
expect_rc 0 "eval .stz candidate" "$STZ" eval "$M" "$T/c4.stz" -q --threshold 0.97
has "$T/out" "0 tensor(s) below" "eval of a container"
expect_rc 0 "compress --json" "$STZ" compress --policy int8 "$M" -o "$T/c8.stz" --json
has "$T/out" '"min_cosine"' "compress json"
# A folder holding one model.safetensors (as Hugging Face ships small models): its file.
mkdir "$T/repo"; cp "$M" "$T/repo/model.safetensors"
expect_rc 0 "compress a model folder" "$STZ" compress --int4 "$T/repo" -o "$T/repo4.stz"
same "$T/c4.stz" "$T/repo4.stz" "compress of the folder is the file's"
expect_rc 0 "quantize a model folder" "$STZ" quantize --int4 "$T/repo" -o "$T/repoq.safetensors"
same "$T/q4g.safetensors" "$T/repoq.safetensors" "quantize of the folder is the file's"
expect_rc 0 "pack a model folder" "$STZ" pack "$T/repo" -o "$T/repop.stz"
expect_rc 0 "its unpack" "$STZ" unpack "$T/repop.stz" -o "$T/repou.safetensors"
same "$M" "$T/repou.safetensors" "pack of the folder is its file, bit-exact"
# -o *.gguf where the command writes no GGUF: refused, naming the commands that do.
for c in "compress --int4" "quantize --int4" "pack" "tune --size 200000" "compress --tune --size 200000"; do
    expect_rc 2 "$c -o x.gguf" "$STZ" $c "$M" -o "$T/x.gguf"
    has "$T/err" "not a GGUF file llama.cpp runs: give --gguf" "$c -o x.gguf says what to do"
done
[ -e "$T/x.gguf" ] && bad "a refused -o x.gguf was written" || ok
mkdir "$T/norepo"
expect_rc 1 "pack a folder without a model" "$STZ" pack "$T/norepo" -o "$T/x.stz"
has "$T/err" "norepo: a directory without model.safetensors.index.json or model.safetensors" "says what the folder lacks"
ls -A "$T" | grep -q "\.quant-\|\.unpacked-\|tmp-" && bad "temporary files left: $(ls -A "$T" | grep -e '-[A-Za-z0-9]\{6\}$')" || ok

# Sharded model: a directory with model.safetensors.index.json.
mkdir "$T/sh"
cp "$M" "$T/sh/model-00001-of-00002.safetensors"
cp "$T/neo.safetensors" "$T/sh/model-00002-of-00002.safetensors"
printf '{"model_type": "test"}\n' >"$T/sh/config.json"
{
    printf '{\n  "metadata": {"total_size": 0},\n  "weight_map": {\n'
    for k in 1 2; do
        "$STZ" inspect --json "$T/sh/model-0000$k-of-00002.safetensors" | grep '"name":' |
            sed "s/.*\"name\":[[:space:]]*\"\([^\"]*\)\".*/    \"\1\": \"model-0000$k-of-00002.safetensors\",/"
    done | sed '$ s/,$//'
    printf '  }\n}\n'
} >"$T/sh/model.safetensors.index.json"
expect_rc 2 "quantize a sharded directory" "$STZ" quantize --int4 "$T/sh" -o "$T/shq.safetensors"
has "$T/err" "a sharded model directory; quantize works on one file: stz compress --int4" "names compress"
expect_rc 2 "pack a sharded directory" "$STZ" pack "$T/sh" -o "$T/shp.stz"
has "$T/err" "stz compress --lossless" "names compress --lossless"
expect_rc 0 "compress sharded lossless" "$STZ" compress --lossless "$T/sh" -o "$T/shl.stz"
has "$T/out" "sharded" "sharded summary"
[ -f "$T/shl.stz/model-00002-of-00002.safetensors.stz" ] && [ -f "$T/shl.stz/config.json" ] && ok || bad "sharded output layout"
expect_rc 0 "decompress sharded lossless" "$STZ" decompress "$T/shl.stz" -o "$T/shl"
diff -r "$T/sh" "$T/shl" >/dev/null && ok || bad "sharded lossless round trip differs"
expect_rc 1 "sharded output exists" "$STZ" decompress "$T/shl.stz" -o "$T/shl" -f
expect_rc 0 "compress sharded int4-nl" "$STZ" compress --policy int4-nl "$T/sh" -o "$T/sh4.stz"
has "$T/sh4.stz/model.safetensors.index.json" '"model.layers.0.mlp.up_proj.weight.scales":[[:space:]]*"model-00001-of-00002.safetensors"' "index lists new names"
expect_rc 0 "decompress sharded --dequantize" "$STZ" decompress "$T/sh4.stz" --dequantize -o "$T/sh4p"
has "$T/sh4p/model.safetensors.index.json" '"model.layers.0.mlp.up_proj.weight":[[:space:]]*"model-00001-of-00002.safetensors"' "index back to original names"
grep -q "scales" "$T/sh4p/model.safetensors.index.json" && bad "dequantized index still lists scales" || ok
expect_rc 0 "eval a dequantized shard" "$STZ" eval "$T/sh/model-00001-of-00002.safetensors" "$T/sh4p/model-00001-of-00002.safetensors" -q
# shards in parallel: the same directory for any -T (shards at once, threads inside them)
expect_rc 0 "compress sharded int4-nl, -T 1" "$STZ" compress --policy int4-nl "$T/sh" -o "$T/sh4t1.stz" -T 1 -q
expect_rc 0 "compress sharded int4-nl, -T 3" "$STZ" compress --policy int4-nl "$T/sh" -o "$T/sh4t3.stz" -T 3 -q
diff -r "$T/sh4t1.stz" "$T/sh4.stz" >/dev/null && diff -r "$T/sh4t3.stz" "$T/sh4.stz" >/dev/null && ok ||
    bad "sharded output depends on -T"
expect_rc 0 "compress sharded int4, -T 1" "$STZ" compress --int4 "$T/sh" -o "$T/shg1.stz" -T 1 -q
expect_rc 0 "compress sharded int4, -T 3" "$STZ" compress --int4 "$T/sh" -o "$T/shg3.stz" -T 3 -q
diff -r "$T/shg1.stz" "$T/shg3.stz" >/dev/null && ok || bad "sharded --int4 (llama.cpp's types) depends on -T"
expect_rc 0 "decompress sharded, -T 1" "$STZ" decompress "$T/sh4t3.stz" -o "$T/sh4t1d" -T 1 -q
expect_rc 0 "decompress sharded, -T 2" "$STZ" decompress "$T/sh4t3.stz" -o "$T/sh4t2d" -T 2 -q
diff -r "$T/sh4t1d" "$T/sh4t2d" >/dev/null && ok || bad "sharded decompress depends on -T"
# one bad shard among shards converted at once: an error naming it, no directory, nothing left behind
cp -r "$T/sh" "$T/shbad"
head -c 1000 "$T/sh/model-00002-of-00002.safetensors" >"$T/shbad/model-00002-of-00002.safetensors"
expect_rc 1 "a truncated shard, -T 2" "$STZ" compress --int4 "$T/shbad" -o "$T/shbad.stz" -T 2
has "$T/err" "model-00002-of-00002.safetensors" "the bad shard is named"
[ -e "$T/shbad.stz" ] && bad "a failed sharded compress left its output" || ok
ls -A "$T" | grep -q "tmp-" && bad "temporary directory left: $(ls -A "$T" | grep tmp-)" || ok

# Interrupted compress: whether SIGINT lands before it finishes or not,
# there is never a partial output nor a temporary file.
"$STZ" synth small -o "$T/small.safetensors" -q
"$STZ" compress --int4 "$T/small.safetensors" -o "$T/small.stz" -q -T 1 &
pid=$!
sleep 0.3
kill -INT $pid 2>/dev/null
wait $pid; rc=$?
# an output, if any, was renamed into place complete (the signal may land after that)
if [ -e "$T/small.stz" ]; then
    "$STZ" verify -q "$T/small.stz" && ok || bad "compress left an output that does not verify (rc $rc)"
else
    [ "$rc" -ne 0 ] && ok || bad "compress exited 0 without an output"
fi
ls -A "$T" | grep -q "small.stz\.\|\.small\.stz" && bad "interrupted compress left $(ls -A "$T" | grep small)" || ok

# eval --forward: model outputs compared; plain, quantized, .stz and directory
# inputs; tokens given or sampled (and saved, then reused); gates; bad input.
"$STZ" synth tiny -o "$T/fw.safetensors" -q
"$STZ" quantize --int4 "$T/fw.safetensors" -o "$T/fw4.safetensors" -q
"$STZ" compress --int4 "$T/fw.safetensors" -o "$T/fw4.stz" -q
"$STZ" quantize --set '*.mlp.up_proj.weight=int3:method=nl' "$T/fw.safetensors" -o "$T/fw3.safetensors" -q
expect_rc 0 "inspect a 3-bit tensor" "$STZ" inspect --json "$T/fw3.safetensors"
has "$T/out" '"action":[[:space:]]*"int3"' "inspect --json names the width"
expect_rc 0 "eval a 3-bit tensor" "$STZ" eval "$T/fw.safetensors" "$T/fw3.safetensors"
has "$T/out" "up_proj.weight  *int3 " "eval names the width"
expect_rc 0 "forward: itself" "$STZ" eval "$T/fw.safetensors" "$T/fw.safetensors" --forward --json
has "$T/out" '"mean":	0,' "KL 0 on itself"
has "$T/out" '"top1_agreement":	1,' "top-1 100% on itself"
expect_rc 0 "forward: int4, tokens saved" "$STZ" eval "$T/fw.safetensors" "$T/fw4.safetensors" --forward --sequences 3 --seq-len 20 --save-tokens "$T/tok.txt"
has "$T/out" "3 sequences (20 tokens sampled from the original, seed 1), 57 positions scored" "says what was scored"
[ "$(wc -l <"$T/tok.txt")" = 3 ] && ok || bad "3 sequences saved"
cp "$T/out" "$T/sampled.out"
expect_rc 0 "forward: the saved tokens give the same figures" "$STZ" eval "$T/fw.safetensors" "$T/fw4.stz" --forward --tokens "$T/tok.txt"
tail -3 "$T/out" >"$T/a"; tail -3 "$T/sampled.out" >"$T/b"
same "$T/a" "$T/b" "same KL, top-1 and perplexity from the .stz and the saved tokens"
expect_rc 1 "forward: --save-tokens never replaces without -f" "$STZ" eval "$T/fw.safetensors" "$T/fw4.safetensors" --forward --save-tokens "$T/tok.txt"
has "$T/err" "tok.txt: output exists" "names the file"
expect_rc 3 "forward: --max-kl exceeded" "$STZ" eval "$T/fw.safetensors" "$T/fw4.safetensors" --forward --tokens "$T/tok.txt" --max-kl 0.000001
has "$T/err" "check failed: mean KL" "says the gate failed"
expect_rc 0 "forward: --max-kl met" "$STZ" eval "$T/fw.safetensors" "$T/fw4.safetensors" --forward --tokens "$T/tok.txt" --max-kl 10
mkdir "$T/fwdir"; cp "$T/fw.safetensors" "$T/fwdir/model.safetensors"
expect_rc 0 "forward: a model directory" "$STZ" eval "$T/fwdir" "$T/fw4.safetensors" --forward --tokens "$T/tok.txt" -q
printf '1 2 3\n7\n' >"$T/short.txt"
expect_rc 1 "forward: a one-token sequence" "$STZ" eval "$T/fw.safetensors" "$T/fw4.safetensors" --forward --tokens "$T/short.txt"
has "$T/err" "short.txt: line 2: a sequence needs at least 2 tokens" "names file and line"
printf '[[1, 2, 300]]' >"$T/vocab.json"
expect_rc 1 "forward: a token outside the vocabulary" "$STZ" eval "$T/fw.safetensors" "$T/fw4.safetensors" --forward --tokens "$T/vocab.json"
has "$T/err" "vocab.json: sequence 1, token 3: id 300 is outside the vocabulary" "names file, sequence and token"
printf '[[1, 2.5]]' >"$T/frac.json"
expect_rc 1 "forward: not a token id" "$STZ" eval "$T/fw.safetensors" "$T/fw4.safetensors" --forward --tokens "$T/frac.json"
"$STZ" synth gpt2-tiny -o "$T/gpt2.safetensors" -q
python3 "$(dirname "$0")/edit_meta.py" "$T/gpt2.safetensors" "$T/bloom.safetensors" config model_type=bloom
expect_rc 1 "forward: another architecture" "$STZ" eval "$T/bloom.safetensors" "$T/bloom.safetensors" --forward
has "$T/err" "model_type 'bloom' is not supported (stz runs llama, mistral, qwen2, qwen3, phi3, gpt_neo, gemma2, gemma3_text, gpt2)" \
    "names what is unsupported and what runs"
printf '{"hidden_size": 64, "intermediate_size": 172, "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256}' >"$T/cfg3.json"
expect_rc 1 "forward: config disagrees with the tensors" "$STZ" eval "$T/fw.safetensors" "$T/fw4.safetensors" --forward --config "$T/cfg3.json"
has "$T/err" "tensor 'model.layers.2.input_layernorm.weight' is missing (the config has 3 layers" "names the tensor"
python3 - "$T/fw.safetensors" "$T/nocfg.safetensors" <<'PY'
import json, struct, sys
b = open(sys.argv[1], "rb").read(); n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n])
del h["__metadata__"]["config"]
t = json.dumps(h).encode(); t += b" " * (-len(t) % 8)
open(sys.argv[2], "wb").write(struct.pack("<Q", len(t)) + t + b[8 + n:])
PY
expect_rc 1 "forward: no configuration" "$STZ" eval "$T/nocfg.safetensors" "$T/fw4.safetensors" --forward
has "$T/err" "no model configuration" "says what is missing"
has "$T/err" "--config FILE" "says what to do"
expect_rc 2 "forward: --tokens with --seed" "$STZ" eval "$T/fw.safetensors" "$T/fw4.safetensors" --forward --tokens "$T/tok.txt" --seed 3
if [ -n "$DATA" ] && [ -f "$DATA/stories260K.f32.safetensors" ]; then
    expect_rc 0 "forward: stories260K BF16" "$STZ" eval "$DATA/stories260K.f32.safetensors" "$DATA/stories260K.bf16.safetensors" --forward --json
    has "$T/out" '"positions":	508' "4 x 128 tokens by default"
fi

# Interrupted: SIGINT mid-write leaves neither the output nor a temporary file.
"$STZ" synth llama-1b -o "$T/big.safetensors" -q -T 1 &
pid=$!
sleep 1
kill -INT $pid
wait $pid; rc=$?
[ "$rc" -ne 0 ] && ok || bad "interrupted synth exited 0"
ls -A "$T" | grep -q "big" && bad "interrupted synth left $(ls -A "$T" | grep big)" || ok

finish cli
