#!/bin/sh
# GGUF export benchmark: the generated Qwen2-0.5B-shaped BF16 model,
# quantized for GGUF (INT4 full, block 32, F16 scales: Q4_0 exactly; the
# embedding kept BF16) and compressed to a container; then, in the same
# run, `stz decompress` of that container against `stz export --gguf` of it
# (target: within 1.5x), best of 5 runs each, with peak memory; and the
# export of the BF16 model itself at F16 and Q8_0.
# Usage: bench/bench_export.sh [BUILD_DIR] [WORK_DIR]
set -eu
. "$(dirname "$0")/bench_lib.sh"
BUILD=${1:-build}
WORK=${2:-/dev/shm/stz-bench-export}
STZ=$(cd "$(dirname "$BUILD/stz")" && pwd)/stz
mkdir -p "$WORK"
cd "$WORK"
"$STZ" synth qwen2-0.5b -o q.safetensors -q -f
cat > config.json <<'J'
{"model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
 "num_attention_heads": 14, "num_key_value_heads": 2, "vocab_size": 151936, "tie_word_embeddings": true,
 "rope_theta": 1000000.0, "rms_norm_eps": 1e-06, "bos_token_id": 151643, "eos_token_id": 151643}
J
byte_tokenizer tokenizer.json # for the keys
"$STZ" compress q.safetensors --keep model.embed_tokens.weight \
    --set '*=int4:method=full:block_size=32:scale_dtype=F16:min_ndim=2' -o q4.stz -q -f
best() { # best wall time and its peak RSS of 5 runs of a command
    b=999999; m=0
    for i in 1 2 3 4 5; do
        /usr/bin/time -f "%e %M" -o t.txt "$@" >/dev/null
        read -r s k < t.txt
        if awk "BEGIN { exit !($s < $b) }"; then b=$s; m=$k; fi
    done
    echo "$b $m"
}
echo "## stz export --gguf benchmark (Qwen2-0.5B-shaped, $(nproc) cores)"
echo
echo "| run | best of 5 (s) | peak RSS (MiB) | output bytes |"
echo "|---|---|---|---|"
set -- $(best "$STZ" decompress q4.stz -o d.safetensors -q -f); dt=$1
echo "| stz decompress q4.stz (INT4 container, $(stat -c %s q4.stz) bytes) | $1 | $(($2 / 1024)) | $(stat -c %s d.safetensors) |"
set -- $(best "$STZ" export --gguf q4.stz -o q4.gguf -q -f); et=$1
echo "| stz export --gguf q4.stz (Q4_0 repacked) | $1 | $(($2 / 1024)) | $(stat -c %s q4.gguf) |"
for T in f16 q8_0; do
    set -- $(best "$STZ" export --gguf q.safetensors --type $T -o $T.gguf -q -f)
    echo "| stz export --gguf BF16 model --type $T | $1 | $(($2 / 1024)) | $(stat -c %s $T.gguf) |"
done
echo
echo "export / decompress: $(awk "BEGIN { printf \"%.2f\", $et / $dt }")x (target <= 1.5x)"
cd / && rm -rf "$WORK"
