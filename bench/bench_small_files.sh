#!/bin/sh
# Never larger than zstd, on small files (issue 52): stories260K (shared
# data) and stz synth's tiny model, as they are and quantized by every stz
# method at 3, 4 and 8 bits, by --int4 / --int8 (llama.cpp's types), and
# exported to GGUF; `stz pack` (default) against `zstd -19 --long` of the
# same file, in the same run, every round trip checked byte for byte. A
# container with members (tensors of at most 16 KiB) is format 3.
# Usage: bench/bench_small_files.sh [BUILD_DIR] [WORK_DIR]
set -eu
BUILD=$(cd "${1:-build}" && pwd)
WORK=${2:-/dev/shm/stz-bench-small}
STZ=$BUILD/stz
DATA=$(cd "$(dirname "$0")/../../shared/data" 2>/dev/null && pwd || echo /nonexistent)
. "$(dirname "$0")/bench_lib.sh"
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
    pack_vs_zstd "$f"
    v=$("$STZ" inspect "$f.stz" | head -1 | sed 's/.*stz container \(v[0-9]\).*/\1/')
    r=$(awk "BEGIN { printf \"%.4f\", $zstd_bytes / $stz_bytes }")
    echo "| $f | $orig_bytes | $stz_bytes | $zstd_bytes | ${r}x | $v |"
    n=$((n + 1))
    if awk "BEGIN { exit !($stz_bytes > $zstd_bytes) }"; then fails=$((fails + 1)); fi
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
