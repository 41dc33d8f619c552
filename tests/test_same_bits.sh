#!/bin/sh
# Same input, same bytes and figures, whatever the kernels: the commands whose
# files or figures the docs record (quantize with error feedback, tune, tune
# --gguf, imatrix, eval --forward, export, pack) run with stz's products forced
# to each instruction set this CPU has (STZ_KERNELS: generic, avx2, avx512),
# OpenBLAS on other kernels (OPENBLAS_CORETYPE) and -T 1 / -T 2; every output
# must equal the first run's byte for byte.
# Usage: test_same_bits.sh STZ [SHARED_DATA_DIR]
. "$(dirname "$0")/cli_lib.sh"
STZ=$(cd "$(dirname "$STZ")" && pwd)/${STZ##*/}
DATA=$(cd "${DATA:-.}" 2>/dev/null && pwd || echo "")

if [ -f "$DATA/stories260K.f32.safetensors" ]; then
    M=$DATA/stories260K.f32.safetensors TOK="--tokenizer $DATA/tok512.bin"
else
    echo "skip: no stories260K in '$DATA': a generated model instead"
    M=$T/tiny.safetensors TOK="--tokenizer $T/tokenizer.json"
    "$STZ" synth tiny -o "$M" --dtype f32 -q || exit 1
    # a tokenizer of its 256 ids, for the GGUF steps
    awk 'BEGIN { printf "{\"model\": {\"type\": \"BPE\", \"vocab\": {"
                 for (i = 0; i < 256; i++) printf "%s\"t%d\": %d", i ? ", " : "", i, i
                 printf "}, \"merges\": []}, \"added_tokens\": []}\n" }' >"$T/tokenizer.json"
fi
flags=$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null)
has_flag() { case " $flags " in *" $1 "*) return 0 ;; esac; return 1; }

# The outputs of one configuration into directory $1 (the environment set by the caller).
run_all() { # (relative names: the policies record the importance matrix's)
    mkdir -p "$1" && (cd "$1" && th=$2 &&
    "$STZ" quantize "$M" --set '*=q4_0' --feedback -T "$th" -o fed.safetensors -q &&
    "$STZ" imatrix "$M" -o im.gguf -T "$th" -q &&
    "$STZ" compress "$M" --tune --bits-per-weight 4.5 -T "$th" -o tuned.stz --save-policy tuned.json -q &&
    "$STZ" compress "$M" --tune --gguf --bits-per-weight 7 --imatrix im.gguf $TOK -T "$th" -o tuned.gguf \
        --save-policy gguf.json -q &&
    "$STZ" export --gguf fed.safetensors $TOK -o fed.gguf -q &&
    "$STZ" pack fed.safetensors -o fed.stz -T "$th" -q &&
    "$STZ" eval "$M" fed.gguf --forward --sequences 8 -T "$th" >eval.txt &&
    "$STZ" eval "$M" tuned.stz --forward --sequences 8 --json -T "$th" >eval.json)
}

compare() { # reference-dir other-dir what: every output (a run that wrote none fails)
    n=0
    for f in "$1"/*; do
        [ -f "$f" ] || continue
        same "$f" "$2/${f##*/}" "$3: ${f##*/}"
        n=$((n + 1))
    done
    [ "$n" -ge 10 ] || bad "$3: $n outputs compared, 10 expected"
}

if run_all "$T/ref" 2; then ok; else bad "the reference run failed"; fi
configs="generic:Nehalem:1"
has_flag avx2 && configs="$configs avx2:Haswell:2"
has_flag avx512f && configs="$configs avx512:SkylakeX:1"
for c in $configs; do
    k=${c%%:*} rest=${c#*:}
    core=${rest%%:*} th=${rest#*:}
    echo "STZ_KERNELS=$k OPENBLAS_CORETYPE=$core -T $th"
    if STZ_KERNELS=$k OPENBLAS_CORETYPE=$core run_all "$T/$k" "$th"; then ok; else bad "$k: the run failed"; fi
    compare "$T/ref" "$T/$k" "$k, $core, -T $th"
done
finish same_bits
