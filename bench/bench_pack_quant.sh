#!/bin/sh
# Lossless packing of quantized models: stz's default container against
# zstd -19 (and -19 --long for GGUF files) of the same file, measured in the
# same run. Files: the generated Qwen2-0.5B-shaped BF16 model and the real
# stories260K (shared data) quantized by every stz method at 4 and 8 bits,
# by the default --int4 / --int8 (llama.cpp's types in SafeTensors), and
# exported to GGUF (the --int4 mix, and a Q4_K_M-like mix: Q4_K, Q6_K for
# the value and down projections and the embedding, llama.cpp's fallbacks
# where rows are not whole 256-blocks), the Q4_K_M-like file again with its
# blocks chosen by llama.cpp's own quantizer (bench/ggml_requant.c, built
# against the ggml that bench/bench_ggml_types.sh builds; skipped without
# it), and a Llama-3.2-1B-shaped model (3 layers), whose rows are all whole
# 256-blocks, in the same mix. Speeds are the coder's on one
# thread (best of RUNS, output to /dev/null: writing a file to tmpfs costs
# the kernel as much again, for stz and zstd alike). Prints a Markdown table
# and checks the targets of the lossless-for-quantized-models issue.
#
# Usage: bench/bench_pack_quant.sh [BUILD_DIR] [WORK_DIR] [RUNS]
# Needs: zstd, /usr/bin/time; about 6 GB in WORK_DIR (default /dev/shm/stz-bench-q).
set -eu
. "$(dirname "$0")/bench_lib.sh"
BUILD=$(cd "${1:-build}" && pwd)
WORK=${2:-/dev/shm/stz-bench-q}
RUNS=${3:-3}
STZ=$BUILD/stz
HERE=$(cd "$(dirname "$0")" && pwd)
DATA=$(cd "$HERE/../../shared/data" 2>/dev/null && pwd || echo /nonexistent)
mkdir -p "$WORK"
REQUANT=$(ggml_requant "$BUILD" "$WORK/ggml_requant")
cd "$WORK"
size() { stat -c %s "$1"; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", a / b }'; }
byte_tokenizer tokenizer.json # for export (the generated model has none)

worst_q=99 worst_g=99 worst_gl=99 slow_p=0 slow_u=0
row() { # file label kind(st|gguf)
    f=$1 n=$(size "$1")
    tp=$(best_time "$RUNS" o.none sh -c "'$STZ' pack '$f' -o - -q -T 1 > /dev/null")
    "$STZ" pack "$f" -o o.stz -q -f -T 2
    tu=$(best_time "$RUNS" o.none sh -c "'$STZ' unpack o.stz -o - -q -T 1 > /dev/null")
    "$STZ" unpack o.stz -o o.back -q -f
    cmp -s "$f" o.back || { echo "round trip differs: $f"; exit 1; }
    s=$(size o.stz)
    z=$(zstd -19 -T2 -q -c "$f" | wc -c)
    if [ "$3" = gguf ]; then zl=$(zstd -19 --long -T2 -q -c "$f" | wc -c); else zl=$z; fi
    mp=$(awk -v n="$n" -v t="$tp" 'BEGIN { printf "%.0f", n / t / 1e6 }')
    mu=$(awk -v n="$n" -v t="$tu" 'BEGIN { printf "%.0f", n / t / 1e6 }')
    [ "$n" -gt 67108864 ] || { mu=0; mp=0; } # speeds of small files measure the start-up
    echo "| $2 | $(awk -v n="$n" 'BEGIN { printf "%.1f", n / 1e6 }') | $(ratio "$n" "$s") | $(ratio "$n" "$z") | $(ratio "$z" "$s") | $(ratio "$zl" "$s") | ${mp#0} | ${mu#0} |"
    r=$(ratio "$z" "$s")
    if [ "$3" = gguf ]; then
        worst_g=$(awk -v a="$worst_g" -v b="$(ratio "$n" "$s")" 'BEGIN { print (b < a ? b : a) }')
        worst_gl=$(awk -v a="$worst_gl" -v b="$(ratio "$zl" "$s")" 'BEGIN { print (b < a ? b : a) }')
        slow_u=$(awk -v a="$slow_u" -v b="$mu" 'BEGIN { print (b == 0 ? a : a == 0 || b < a ? b : a) }')
    else
        worst_q=$(awk -v a="$worst_q" -v b="$r" 'BEGIN { print (b < a ? b : a) }')
    fi
    slow_p=$(awk -v a="$slow_p" -v b="$mp" 'BEGIN { print (b == 0 ? a : a == 0 || b < a ? b : a) }')
    rm -f o.stz o.back
}

q4km() { # source label tokenizer: the Q4_K_M-like GGUF rows
    "$STZ" quantize "$1" -o q.safetensors -q -f --policy int4 --set 're:.*\.(v_proj|down_proj|wv|w2)\.weight=q6_k' \
        --set 're:.*(embed_tokens|tok_embeddings)\.weight=q6_k' --set '*=q4_k'
    "$STZ" export --gguf q.safetensors --tokenizer "$3" -o q.gguf -q -f
    row q.gguf "$2 Q4_K_M-like GGUF" gguf
    if [ -n "$REQUANT" ]; then
        "$REQUANT" q.gguf q.llama.gguf >/dev/null
        row q.llama.gguf "$2 Q4_K_M-like GGUF, llama.cpp's blocks" gguf
    fi
    rm -f q.safetensors q.gguf q.llama.gguf
}

model() { # source label
    src=$1 label=$2
    for m in absmax full mse asym nl; do
        for b in 4 8; do
            [ "$m" = nl ] && [ "$b" = 8 ] && continue # nl is 2-6 bits
            "$STZ" quantize "$src" -o q.safetensors -q -f --set "*=int$b:method=$m:min_ndim=2"
            row q.safetensors "$label int$b $m" st
        done
    done
    for p in int4 int8; do
        "$STZ" quantize "$src" -o q.safetensors -q -f --$p
        row q.safetensors "$label --$p (llama.cpp types)" st
    done
    "$STZ" quantize "$src" -o q.safetensors -q -f --int4
    "$STZ" export --gguf q.safetensors --tokenizer "$3" -o q.gguf -q -f
    row q.gguf "$label --int4 as GGUF" gguf
    q4km "$src" "$label" "$3"
}

echo "## Lossless packing of quantized models"
echo
echo "$(date -u +%Y-%m-%d), $(nproc) cores; zstd $(zstd -V | grep -o 'v[0-9.]*'), stz $("$STZ" --version | cut -d' ' -f2); speeds best of $RUNS, one thread."
echo
echo "| file | MB | stz | zstd -19 | stz / zstd -19 | stz / zstd -19 --long | pack MB/s | unpack MB/s |"
echo "|---|---|---|---|---|---|---|---|"
"$STZ" synth qwen2-0.5b -o qwen.safetensors -q -f
model qwen.safetensors "Qwen2-0.5B synthetic" tokenizer.json
rm -f qwen.safetensors
"$STZ" synth llama-1b --layers 3 -o llama.safetensors -q -f
python3 - <<'P' # its tokenizer: the byte-level one, padded to Llama-3's 128,256 entries
import json
t = json.load(open("tokenizer.json"))
v = t["model"]["vocab"]
for i in range(len(v), 128256):
    v["t%d" % i] = i
t["added_tokens"] = []
json.dump(t, open("tokenizer-llama.json", "w"))
P
q4km llama.safetensors "Llama-3.2-1B synthetic, 3 layers," tokenizer-llama.json
rm -f llama.safetensors
if [ -f "$DATA/stories260K.f32.safetensors" ]; then
    model "$DATA/stories260K.f32.safetensors" "stories260K" "$DATA/tok512.bin"
fi
[ -n "$REQUANT" ] || echo "(no ggml build in ${GGML_WORK:-/dev/shm/stz-bench-ggml}: the rows with llama.cpp's blocks were skipped; run bench/bench_ggml_types.sh)"
echo
echo "Targets:"
check "quantized SafeTensors: every file >= 1.03x zstd -19 (worst $worst_q)" "$worst_q >= 1.03"
check "GGUF: every file >= 1.05x (worst $worst_g)" "$worst_g >= 1.05"
check "GGUF: every file >= 1.03x zstd -19 --long (worst $worst_gl)" "$worst_gl >= 1.03"
check "pack >= 300 MB/s per thread, files over 64 MiB (slowest $slow_p)" "$slow_p >= 300"
check "GGUF unpack >= 600 MB/s per thread, files over 64 MiB (slowest $slow_u)" "$slow_u >= 600"
echo
echo "$fails target(s) missed."
