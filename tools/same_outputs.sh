#!/bin/sh
# Before/after check for restructurings that must not change behaviour
# (issue 29): runs the same commands with two stz programs on the shared
# data (stories260K) and on generated models, and compares every output
# byte for byte (JSON documents without their "seconds").
# Usage: tools/same_outputs.sh OLD_STZ NEW_STZ [SHARED_DATA_DIR]
# Exit status 0 when every output is identical, 1 when one differs.
set -u
abs() { (cd "$(dirname "$1")" && echo "$(pwd)/$(basename "$1")"); }
OLD=$(abs "$1") NEW=$(abs "$2")
DATA=$(cd "${3:-$(dirname "$0")/../../shared/data}" 2>/dev/null && pwd)
S=$DATA/stories260K.f32.safetensors
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
[ -f "$S" ] || { echo "no $S: give SHARED_DATA_DIR"; exit 2; }
"$NEW" synth tiny -o "$W/tiny.safetensors" -q
"$NEW" synth qwen2-0.5b --layers 2 -o "$W/qwen.safetensors" -q
differ=0 n=0

# run NAME OUT ARGS...: each program writes OUT (or stdout when OUT is -) in its own directory
run() {
    name=$1 out=$2
    shift 2
    for side in old new; do
        mkdir -p "$W/$side"
        prog=$OLD
        [ $side = new ] && prog=$NEW
        (cd "$W/$side" && "$prog" "$@" >"$name.stdout" 2>"$name.stderr"; echo $? >"$name.rc")
        sed -i '/"seconds"/d; s/ in [0-9.]* s//; s/[0-9.]* [kMG]*B\/s//' "$W/$side/$name.stdout"
    done
    n=$((n + 1))
    if [ "$(cat "$W/old/$name.rc")" != 0 ]; then # a check that compared nothing fails
        echo "FAILED: $name: $(head -c 300 "$W/old/$name.stderr")"
        differ=1
    fi
    for f in "$name.rc" "$name.stdout" ${out:+"$out"}; do
        if ! { [ -d "$W/old/$f" ] && diff -rq "$W/old/$f" "$W/new/$f" >/dev/null || cmp -s "$W/old/$f" "$W/new/$f"; }; then
            echo "DIFFERS: $name: $f"
            differ=1
        fi
    done
}

run quantize q.safetensors quantize --int4 "$S" -o q.safetensors -T 2 --json
run quantize-mse qm.safetensors quantize --set '*.weight=int5:method=mse:block_size=32' "$S" -o qm.safetensors -T 2
run dequantize d.safetensors dequantize "$W/old/q.safetensors" -o d.safetensors --dtype f32 --json
run compress c.stz compress --int4 "$S" -o c.stz -T 2 --json
run compress-lossless l.stz compress --lossless "$S" -o l.stz -T 2 --json
run pack p.stz pack "$W/qwen.safetensors" -o p.stz -T 2 --json
run decompress dc.safetensors decompress "$W/old/c.stz" --dequantize -o dc.safetensors --json
run unpack u.safetensors unpack "$W/old/l.stz" -o u.safetensors --json
run eval "" eval "$S" "$W/old/c.stz" --json
run eval-forward "" eval --forward "$S" "$W/old/c.stz" --json
run tune t.json tune "$S" --size 230000 -o t.json --json -T 2
run tune-gguf-set tg.json tune "$S" --gguf --candidates gguf --max-kl 0.05 --tokenizer "$DATA/tok512.bin" --no-verify -o tg.json --json -T 2
run tune-compress tc.stz compress "$S" --tune --size 230000 -o tc.stz -T 2 -q
run svd s.safetensors quantize --set 'layers.*.weight=svd:rank=8' "$S" -o s.safetensors
run export-f32 e.gguf export --gguf "$S" --tokenizer "$DATA/tok512.bin" -o e.gguf --json
run export-q8 e8.gguf export --gguf "$W/old/q.safetensors" --tokenizer "$DATA/tok512.bin" --type q8_0 --requantize -o e8.gguf --json
run inspect "" inspect "$W/old/c.stz" --json
run plan "" plan --policy int4 "$W/tiny.safetensors" --json
run synth sy.safetensors synth llama-1b --layers 1 --sparsity 0.5 -T 3 -o sy.safetensors --json
run k-quants k.stz compress --set '*proj.weight=q4_k' --set '*down_proj.weight=q6_k' --set '*o_proj.weight=q5_k' "$W/old/sy.safetensors" -o k.stz -T 2 --json
run inspect-k "" inspect "$W/old/k.stz" --json
run synth-shards sh synth qwen2-0.5b --layers 2 --shards 3 -o sh -q
run compress-shards csh compress --int4 "$W/old/sh" -o csh -T 2 -q
run decompress-shards dsh decompress "$W/old/csh" --dequantize -o dsh -T 2 -q
run eval-forward-save st.txt eval --forward "$S" "$W/old/c.stz" --sequences 3 --seq-len 40 --save-tokens st.txt --json
run eval-forward-tokens "" eval --forward "$S" "$W/old/c.stz" --tokens "$W/old/st.txt" --json
run imatrix im.gguf imatrix "$S" --tokens "$W/old/st.txt" -o im.gguf -q
run imatrix-sampled ims.gguf imatrix "$W/old/sh" -o ims.gguf -q
run compress-feedback cf.stz compress --int4 --feedback --sequences 2 --seq-len 32 "$S" -o cf.stz -T 2 --json
run quantize-feedback qf.safetensors quantize --int4 --feedback --sequences 2 --seq-len 32 "$S" -o qf.safetensors -T 2
run compress-shards-json cshj compress --int8 "$W/old/sh" -o cshj -T 2 --json
run tune-feedback tf.json tune "$S" --size 230000 --feedback -o tf.json --json -T 2
echo "same_outputs: $n commands, $( [ $differ = 0 ] && echo "all identical" || echo "some differ")"
exit $differ
