#!/bin/sh
# Never larger than zstd, on small files (issue 52): stories260K (shared
# data) and stz synth's tiny model, as they are and quantized by every stz
# method at 3, 4 and 8 bits, by --int4 / --int8 (llama.cpp's types), and
# exported to GGUF; `stz pack` (default) against `zstd -19 --long` of the
# same file, in the same run, every round trip checked byte for byte. A
# container with a chunk that small tensors share is format 2.
# Usage: bench/bench_small_files.sh [BUILD_DIR] [WORK_DIR]
set -eu
BUILD=$(cd "${1:-build}" && pwd)
WORK=${2:-/dev/shm/stz-bench-small}
STZ=$BUILD/stz
DATA=$(cd "$(dirname "$0")/../../shared/data" 2>/dev/null && pwd || echo /nonexistent)
mkdir -p "$WORK"
cd "$WORK"
command -v zstd >/dev/null || { echo "skip: no zstd"; exit 0; }
models=""
if [ -f "$DATA/stories260K.f32.safetensors" ]; then
    cp "$DATA/stories260K.f32.safetensors" stories.safetensors
    models="stories"
fi
"$STZ" synth tiny -o tiny.safetensors --dtype bf16 -q -f
models="$models tiny"
fails=0 n=0
echo "| file | bytes | stz pack | zstd -19 --long | stz / zstd | format |"
echo "|---|---|---|---|---|---|"
row() { # file
    f=$1
    "$STZ" pack "$f" -o "$f.stz" -q -f
    "$STZ" unpack "$f.stz" -o "$f.back" -q -f
    cmp -s "$f" "$f.back" || { echo "round trip failed: $f"; exit 1; }
    zstd -19 --long -q -f "$f" -o "$f.zst"
    a=$(stat -c %s "$f") s=$(stat -c %s "$f.stz") z=$(stat -c %s "$f.zst")
    v=$("$STZ" inspect "$f.stz" | head -1 | sed 's/.*stz container \(v[0-9]\).*/\1/')
    r=$(awk "BEGIN { printf \"%.4f\", $z / $s }")
    echo "| $f | $a | $s | $z | ${r}x | $v |"
    n=$((n + 1))
    awk "BEGIN { exit !($s > $z) }" && fails=$((fails + 1))
    rm -f "$f.back" "$f.zst"
}
for m in $models; do
    row $m.safetensors
    for spec in "int8:absmax" "int4:absmax" "int4:mse" "int4:nl" "int4:asym" "int3:mse" "int3:nl"; do
        w=${spec%%:*} meth=${spec#*:}
        "$STZ" quantize --set "*=$w:method=$meth" $m.safetensors -o $m.$w-$meth.safetensors -q -f
        row $m.$w-$meth.safetensors
    done
    for p in int4 int8; do
        "$STZ" quantize --$p $m.safetensors -o $m.$p.safetensors -q -f
        row $m.$p.safetensors
    done
done
if [ -f "$DATA/tok512.bin" ]; then
    "$STZ" export --gguf stories.safetensors --tokenizer "$DATA/tok512.bin" -o stories.gguf -q -f
    "$STZ" export --gguf stories.int4.safetensors --tokenizer "$DATA/tok512.bin" -o stories.int4.gguf -q -f
    row stories.gguf
    row stories.int4.gguf
fi
echo
echo "$((n - fails)) of $n files no larger than zstd -19 --long"
[ "$fails" -eq 0 ]
