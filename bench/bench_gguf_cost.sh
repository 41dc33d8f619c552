#!/bin/sh
# Issue 54's cost target: the default calibrated `stz gguf` on the
# Qwen2-0.5B shape (stz synth qwen2-0.5b as a Hugging Face folder, BF16)
# against llama.cpp's calibrated pipeline on the same model and threads,
# side by side in one run: llama-imatrix over about 20k tokens (the F16
# GGUF, its default context of 512, 40 chunks: 20,480 tokens, --no-ppl) then
# llama-quantize --imatrix Q4_K_M, against stz gguf --like q4_k_m. Wall time
# and peak resident memory of each (/usr/bin/time), the stages of stz's run
# (its --progress lines, kept in WORK/stz-progress.txt), both files' bytes
# and their mean KL on the same 8 held-out sequences (seed 7). llama.cpp is
# built from a snapshot as bench_imatrix_peer.sh builds it; skips without.
# Usage: bench/bench_gguf_cost.sh [BUILD_DIR] [WORK_DIR]
set -eu
STZ=$(cd "${1:-build}" && pwd)/stz
WORK=${2:-/dev/shm/stz-bench-gguf-cost}
SRC=${LLAMA_SRC:-/work/.mirror/ggerganov+llama.cpp/repo}
mkdir -p "$WORK"
. "$(dirname "$0")/bench_lib.sh"
llama_tools "$WORK" llama-imatrix llama-quantize || exit 0
BIN=$LLAMA_BIN
cd "$WORK"

[ -d qwen ] || "$STZ" synth qwen2-0.5b --shards 1 -o qwen -q
"$STZ" export --gguf qwen --type f16 --pad-vocab -o qwen.f16.gguf -f -q
# text of more than 40 x 512 tokens; llama-imatrix reads 40 chunks of 512
python3 -c 'import random; r = random.Random(5)
w = ["".join(r.choice("etaoinshrdlu") for _ in range(r.randint(2, 9))) for _ in range(3000)]
print(" ".join(r.choice(w) for _ in range(40000)))' >calib.txt

# measure NAME CMD...: wall seconds and peak RSS (MiB) of CMD into NAME.time
measure() {
    name=$1
    shift
    /usr/bin/time -f "%e %M" -o "$name.time" "$@" >"$name.log" 2>&1
    awk '{ printf "%s: %.1f s, %.0f MiB\n", name, $1, $2 / 1024 }' name="$name" "$name.time"
}
measure imatrix "$BIN/llama-imatrix" -m qwen.f16.gguf -f calib.txt -o imatrix.dat -t 2 --no-ppl --chunks 40
grep -o "computing over.*" imatrix.log || true
measure quantize "$BIN/llama-quantize" --imatrix imatrix.dat qwen.f16.gguf llama.gguf Q4_K_M 2
measure stz "$STZ" gguf qwen --like q4_k_m --pad-vocab -T 2 --progress -o stz.gguf -f
grep -v "%  .*left$" stz.log >stz-progress.txt || true

kl() { "$STZ" eval --forward --json -q --sequences 8 --seed 7 qwen "$1" | python3 -c \
    'import json, sys; print("%.4g" % json.load(sys.stdin)["kl"]["mean"])'; }
read -r ti mi <imatrix.time
read -r tq mq <quantize.time
read -r ts ms <stz.time
echo
echo "| side | bytes | KL | seconds | peak MiB |"
echo "|---|---|---|---|---|"
echo "| llama-imatrix + llama-quantize Q4_K_M | $(stat -c %s llama.gguf) | $(kl llama.gguf) | $(echo "$ti + $tq" | bc) |" \
    "$(echo "if ($mi > $mq) $mi / 1024 else $mq / 1024" | bc) |"
echo "| stz gguf --like q4_k_m | $(stat -c %s stz.gguf) | $(kl stz.gguf) | $ts | $((ms / 1024)) |"
check "stz's time within llama.cpp's ($ts s against $(echo "$ti + $tq" | bc) s)" "$ts <= $ti + $tq"
check "stz's peak under 1.5 GiB ($((ms / 1024)) MiB)" "$ms < 1536 * 1024"
exit "$fails"
