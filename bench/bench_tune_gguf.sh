#!/bin/sh
# stz tune --gguf against llama.cpp's mixes at their own GGUF sizes, on
# stories260K F32 (shared data), side by side in one run, every file made
# with the same importance matrix (stz imatrix, default sampling) and
# measured by stz eval --forward on the same 16 held-out sequences (seed 7).
#
# The mixes are llama.cpp's choice of type per tensor for this model
# (llama-quantize's rules; the 172-wide ffn_down matrices are F16 in all of
# them, the 64-wide rows take no super-block type, so q4_k/q6_k fall back
# to q5_0/q8_0): all-IQ4_NL; the IQ4_NL default mix (token embedding Q8_0,
# the tied head's type); the Q5_0 default mix (embedding Q8_0); Q4_K_M
# (embedding Q8_0, attn_v of layers 2 and 4 Q6_K -> Q8_0, the rest Q4_K ->
# Q5_0); Q8_0. Each mix is made twice: its blocks chosen by llama.cpp's
# own quantizer from the original weights with the importance matrix (what
# llama-quantize --imatrix writes: bench/ggml_requant.c against the ggml
# that bench/bench_ggml_types.sh builds in GGML_WORK; the column is "-"
# without it), and by stz's search for those types. The peer is the
# first; the second is stz's work, given as a stricter reference. tune
# --gguf runs twice: plain rounding, and with --feedback (error feedback's
# candidates). The issue's anchors (llama.cpp's own files in its harness)
# are printed beside them; each mix's size here is 224 bytes below the
# anchor's (stz's GGUF header holds fewer keys).
# Usage: bench/bench_tune_gguf.sh [BUILD_DIR] [WORK_DIR] [SHARED_DATA_DIR]
set -eu
. "$(dirname "$0")/bench_lib.sh"
BUILD=${1:-build}
WORK=${2:-/dev/shm/stz-bench-tune-gguf}
DATA=${3:-$(dirname "$0")/../../shared/data}
STZ=$BUILD/stz
M=$DATA/stories260K.f32.safetensors
TOK=$DATA/tok512.bin
[ -f "$M" ] && [ -f "$TOK" ] || { echo "skip: no stories260K in $DATA"; exit 0; }
mkdir -p "$WORK"
REQUANT=$(ggml_requant "$BUILD" "$WORK/ggml_requant")
[ -z "$REQUANT" ] || "$STZ" export --gguf "$M" --tokenizer "$TOK" -o "$WORK/f32.gguf" -f -q
IM=$WORK/stories.imatrix.gguf
"$STZ" imatrix "$M" -o "$IM" -f -q
kl() { "$STZ" eval --forward "$M" "$1" --sequences 16 --seed 7 --json -q | tr -d '\n\t' |
       sed -n 's/.*"kl":{"mean":\([-0-9.e+]*\).*/\1/p'; }
mix() { # name, then --set rules: the GGUF of that mix
    name=$1; shift
    "$STZ" quantize "$M" "$@" --imatrix "$IM" -o "$WORK/$name.safetensors" -f -q
    "$STZ" export --gguf "$WORK/$name.safetensors" --tokenizer "$TOK" -o "$WORK/$name.gguf" -f -q
    [ -z "$REQUANT" ] || "$REQUANT" "$WORK/$name.gguf" "$WORK/$name.ggml.gguf" "$WORK/f32.gguf" "$IM" >/dev/null
}
E='tok_embeddings.weight'
mix iq4_nl --set '*=iq4_nl'
mix iq4_nl-mix --set "$E=q8_0" --set '*=iq4_nl'
mix q5_0-mix --set "$E=q8_0" --set '*=q5_0'
mix q4_k_m --set "$E=q8_0" --set 'layers.[24].attention.wv.weight=q8_0' --set '*=q5_0'
mix q8_0 --set '*=q8_0'
echo "## stz tune --gguf against llama.cpp's mixes (stories260K F32, same imatrix, 16 x 128 held-out tokens)"
echo
echo "Ratios: tune's KL over the mix's with llama.cpp's blocks (the target's), then over the mix's with stz's blocks."
echo
echo "| llama.cpp mix | GGUF bytes | KL, llama.cpp's blocks | KL, stz's blocks | issue's anchor (bytes / KL) | tune --gguf bytes | KL | ratios | with --feedback: bytes | KL | ratios | target |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|"
for row in "iq4_nl 242432 0.0658 0.8" "iq4_nl-mix 258816 0.0422 0.5" "q5_0-mix 280256 0.0112 0.5" \
           "q4_k_m 281792 0.0105 0.5" "q8_0 344576 0.000301 0.5"; do
    set -- $row
    g=$WORK/$1.gguf
    pb=$(wc -c <"$g") pk=$(kl "$g") lk=-
    [ -z "$REQUANT" ] || lk=$(kl "$WORK/$1.ggml.gguf")
    "$STZ" compress "$M" --tune --gguf --size "$pb" --imatrix "$IM" --tokenizer "$TOK" -o "$WORK/tuned.gguf" -f -q
    tb=$(wc -c <"$WORK/tuned.gguf") tk=$(kl "$WORK/tuned.gguf")
    "$STZ" compress "$M" --tune --gguf --size "$pb" --imatrix "$IM" --feedback --tokenizer "$TOK" -o "$WORK/fed.gguf" -f -q
    fb=$(wc -c <"$WORK/fed.gguf") fk=$(kl "$WORK/fed.gguf")
    awk -v n="$1" -v pb="$pb" -v pk="$pk" -v lk="$lk" -v ab="$2" -v ak="$3" -v tb="$tb" -v tk="$tk" -v fb="$fb" -v fk="$fk" \
        -v t="$4" 'function r(k) { return (lk == "-" ? "-" : sprintf("%.2fx", k / lk)) sprintf(", %.2fx", k / pk) }
        BEGIN { printf "| %s | %d | %s | %.4g | %d / %s | %d | %.4g | %s | %d | %.4g | %s | <= %sx |\n", n, pb,
                lk == "-" ? "-" : sprintf("%.4g", lk), pk, ab, ak, tb, tk, r(tk), fb, fk, r(fk), t }'
done
"$STZ" compress "$M" --int4 -o "$WORK/int4.stz" -f -q
"$STZ" export --gguf "$WORK/int4.stz" --tokenizer "$TOK" -o "$WORK/int4.gguf" -f -q
ib=$(wc -c <"$WORK/int4.gguf") ik=$(kl "$WORK/int4.gguf")
echo
echo "The shipped default: stz compress --int4, then stz export --gguf (no --requantize), no importance matrix:"
awk -v b="$ib" -v k="$ik" 'BEGIN { printf "%d bytes (target <= 258816), mean KL %.4g = %.2fx the anchor IQ4_NL mix'"'"'s 0.0422 (target <= 0.8x): %s\n",
    b, k, k / 0.0422, b <= 258816 && k <= 0.8 * 0.0422 ? "PASS" : "FAIL" }'

rm -rf "$WORK"
