#!/bin/sh
# Error feedback (--feedback) against plain rounding at the same stored
# bytes: stories260K F32 (shared data), every matrix in one format, the
# container's bytes (stz compress) and mean KL on 16 held-out sampled
# sequences (seed 7; feedback calibrates on its own, seed 1); `stz tune
# --size` at the feedback file's bytes beside it. Then stz tune with and
# without --feedback from 2.5 to 4.5 bits/weight, and at 2.5 the text each
# model writes greedily beside the original's. Then the cost on the
# generated Qwen2-0.5B-shaped model (2 threads, q4_k): seconds and peak
# memory of quantize with and without feedback, and of `stz tune` at
# the q4_k size. Figures in docs/BENCHMARKS.md, "Error feedback".
# Usage: bench/bench_feedback.sh [BUILD_DIR] [WORK_DIR] [DATA_DIR]
# (COST=0 in the environment: the stories260K tables only; COST=only: the
# cost part only)
set -eu
BUILD=${1:-build}
WORK=${2:-/dev/shm/stz-bench}
DATA=${3:-$(dirname "$0")/../../shared/data}
STZ=$BUILD/stz
M=$DATA/stories260K.f32.safetensors
mkdir -p "$WORK"
[ -f "$M" ] || { echo "skip: no $M"; exit 0; }
kl() { "$STZ" eval --forward "$M" "$1" --sequences 16 --seed 7 --json | awk -F'[:,]' '/"mean"/ { gsub(/[ \t]/, "", $2); print $2; exit }'; }
bytes() { wc -c < "$1" | tr -d ' '; }
stories() {
echo "## Error feedback on stories260K (F32, 260,032 parameters), every matrix in one format"
echo
echo "| format | bytes (plain) | KL plain | bytes (feedback) | bits/weight | KL feedback | ratio | tune --size, KL |"
echo "|---|---|---|---|---|---|---|---|"
for f in int2:block_size=32:method=nl int3:block_size=32:method=nl int3:block_size=32:method=asym q4_0 iq4_nl \
         int4:block_size=32:method=nl q5_0; do
    "$STZ" compress "$M" --set "*=$f" -o "$WORK/fb-plain.stz" -f -q
    "$STZ" compress "$M" --set "*=$f" --feedback -o "$WORK/fb-fed.stz" -f -q
    bp=$(bytes "$WORK/fb-plain.stz") bf=$(bytes "$WORK/fb-fed.stz")
    kp=$(kl "$WORK/fb-plain.stz") kf=$(kl "$WORK/fb-fed.stz")
    "$STZ" tune "$M" --size "$bf" -o "$WORK/fb-tune.json" -f -q
    "$STZ" compress "$M" --policy "$WORK/fb-tune.json" -o "$WORK/fb-tune.stz" -f -q
    kt=$(kl "$WORK/fb-tune.stz")
    awk -v f="$f" -v bp="$bp" -v kp="$kp" -v bf="$bf" -v kf="$kf" -v bt="$(bytes "$WORK/fb-tune.stz")" -v kt="$kt" \
        'BEGIN { printf "| %s | %d | %.4f | %d | %.2f | %.4f | %.2fx | %d, %.4f |\n", f, bp, kp, bf, bf * 8 / 260032, kf, kf / kp, bt, kt }'
done
echo
echo "## The frontier: stz tune with and without --feedback (stories260K, container bytes)"
echo
echo "| bits/weight | tune bytes | tune KL | tune --feedback bytes | tune --feedback KL | ratio | target |"
echo "|---|---|---|---|---|---|---|"
for row in "2.5 -" "3.0 <=0.30" "3.5 <=0.112" "4.0 <=0.7x" "4.5 <=0.7x"; do
    set -- $row
    "$STZ" compress "$M" --tune --bits-per-weight "$1" -o "$WORK/fb-t.stz" -f -q
    "$STZ" compress "$M" --tune --bits-per-weight "$1" --feedback -o "$WORK/fb-tf.stz" -f -q
    awk -v b="$1" -v tb="$(bytes "$WORK/fb-t.stz")" -v tk="$(kl "$WORK/fb-t.stz")" -v fb="$(bytes "$WORK/fb-tf.stz")" \
        -v fk="$(kl "$WORK/fb-tf.stz")" -v t="$2" \
        'BEGIN { printf "| %s | %d | %.4f | %d | %.4f | %.2fx | %s |\n", b, tb, tk, fb, fk, fk / tk, t }'
    [ "$1" = 2.5 ] && cp "$WORK/fb-t.stz" "$WORK/fb-t25.stz" && cp "$WORK/fb-tf.stz" "$WORK/fb-tf25.stz"
done
# the text each model writes greedily (64 tokens): the first model of stz
# eval --forward samples the sequence; llama2.c's tokenizer decodes it
text() {
    "$STZ" eval --forward "$1" "$M" --temperature 0 --sequences 1 --seq-len 64 --save-tokens "$WORK/fb-tok.txt" -f -q \
        >/dev/null
    /usr/bin/python3 -c '
import re, struct, sys
b = open(sys.argv[1], "rb").read()
pos, vocab = 4, []
while pos < len(b):
    n = struct.unpack_from("<fi", b, pos)[1]
    vocab.append(b[pos + 8:pos + 8 + n].decode("utf-8", "replace")); pos += 8 + n
ids = [int(t) for t in open(sys.argv[2]).read().split()]
s = re.sub("<0x([0-9A-F]{2})>", lambda m: chr(int(m.group(1), 16)), "".join(vocab[i] for i in ids[1:]))
print(s.replace("\n", " ").strip())' "$DATA/tok512.bin" "$WORK/fb-tok.txt"
}
echo
echo "At 2.5 bits/weight, the text each writes greedily (64 tokens from BOS):"
echo
echo "- original: $(text "$M")"
echo "- tune: $(text "$WORK/fb-t25.stz")"
echo "- tune --feedback: $(text "$WORK/fb-tf25.stz")"
}
# The method "trellis" against "nl" on the layer matrices (the embedding kept:
# its nl codes pack below 3 bits, a trellis stream's do not), same bytes.
trellis() {
echo
echo "## The trellis method against nl, every layer matrix (stories260K, container bytes)"
echo
echo "| format | nl bytes | nl KL | nl KL feedback | trellis bytes | trellis KL | trellis KL feedback | ratio (feedback) |"
echo "|---|---|---|---|---|---|---|---|"
for f in int2:block_size=32 int3:block_size=32 int3:block_size=32:scale_dtype=U8 int4:block_size=32; do
    for m in nl trellis; do
        "$STZ" compress "$M" --set "layers.*=$f:method=$m" -o "$WORK/fb-$m.stz" -f -q
        "$STZ" compress "$M" --set "layers.*=$f:method=$m" --feedback -o "$WORK/fb-$m-fed.stz" -f -q
    done
    awk -v f="$f" -v nb="$(bytes "$WORK/fb-nl.stz")" -v np="$(kl "$WORK/fb-nl.stz")" -v nf="$(kl "$WORK/fb-nl-fed.stz")" \
        -v tb="$(bytes "$WORK/fb-trellis.stz")" -v tp="$(kl "$WORK/fb-trellis.stz")" \
        -v tf="$(kl "$WORK/fb-trellis-fed.stz")" \
        'BEGIN { printf "| %s | %d | %.4f | %.4f | %d | %.4f | %.4f | %.2fx |\n", f, nb, np, nf, tb, tp, tf, tf / nf }'
done
echo
echo "## stz tune --feedback with the trellis candidates added (--candidates default,trellis; stories260K, container bytes)"
echo
echo "| bits/weight | tune --feedback bytes | KL | with trellis candidates: bytes | KL | ratio | target |"
echo "|---|---|---|---|---|---|---|"
for row in "3.0 <=0.30" "3.5 <=0.112"; do
    set -- $row
    "$STZ" compress "$M" --tune --bits-per-weight "$1" --feedback -o "$WORK/fb-tf.stz" -f -q
    "$STZ" compress "$M" --tune --bits-per-weight "$1" --feedback --candidates default,trellis -o "$WORK/fb-tt.stz" -f -q
    awk -v b="$1" -v fb="$(bytes "$WORK/fb-tf.stz")" -v fk="$(kl "$WORK/fb-tf.stz")" -v tb="$(bytes "$WORK/fb-tt.stz")" \
        -v tk="$(kl "$WORK/fb-tt.stz")" -v t="$2" \
        'BEGIN { printf "| %s | %d | %.4f | %d | %.4f | %.2fx | %s |\n", b, fb, fk, tb, tk, tk / fk, t }'
done
}
[ "${COST:-1}" = only ] || [ "${TRELLIS:-1}" = only ] || stories
[ "${COST:-1}" = only ] || trellis
[ "${TRELLIS:-1}" = only ] && exit 0
[ "${COST:-1}" = 0 ] && exit 0
Q=$WORK/qwen2-0.5b.safetensors
"$STZ" synth qwen2-0.5b -o "$Q" -q -f
run() { /usr/bin/time -f "%e %M" -o "$WORK/fb-time" "$@" >/dev/null; cat "$WORK/fb-time"; }
echo
echo "## Cost on the generated Qwen2-0.5B-shaped model (BF16, q4_k, 2 threads)"
echo
echo "| run | seconds | peak MiB |"
echo "|---|---|---|"
for fb in "" --feedback; do
    set -- $(run "$STZ" quantize "$Q" --set '*=q4_k' $fb -T 2 -o "$WORK/fb-q.safetensors" -f -q)
    echo "| quantize --set '*=q4_k' $fb | $1 | $(($2 / 1024)) |"
done
set -- $(run "$STZ" tune "$Q" --size "$(bytes "$WORK/fb-q.safetensors")" -T 2 -o "$WORK/fb-q.json" -f -q)
echo "| tune --size (the q4_k file's bytes) | $1 | $(($2 / 1024)) |"
# a 3-bit trellis on every layer matrix, as tune --candidates default,trellis chooses it
tr='model.layers.*=int3:block_size=64:method=trellis:scale_dtype=U8'
set -- $(run "$STZ" quantize "$Q" --set "$tr" --feedback -T 2 -o "$WORK/fb-q.safetensors" -f -q)
echo "| quantize --set '$tr' --feedback | $1 | $(($2 / 1024)) |"
