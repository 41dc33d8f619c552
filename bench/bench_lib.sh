# Shared by the bench scripts (sourced before they change directory).
# check DESCRIPTION CONDITION: prints "- PASS: ..." or "- FAIL: ..." for an
# awk expression and counts failures in $fails.
fails=0
check() {
    if awk "BEGIN { exit !($2) }"; then echo "- PASS: $1"; else echo "- FAIL: $1"; fails=$((fails + 1)); fi
}
# best_time RUNS OUT CMD...: the fastest wall time (s) of RUNS runs of CMD,
# OUT (the file or directory it writes) removed before each run.
best_time() {
    runs=$1 out=$2
    shift 2
    b=999999
    for i in $(seq "$runs"); do
        rm -rf "$out"
        /usr/bin/time -f "%e" -o best_time.txt "$@" >/dev/null
        b=$(awk "BEGIN { t = $(cat best_time.txt); print (t < $b ? t : $b) }")
    done
    rm -f best_time.txt
    echo "$b"
}

# stories_and_small WORK DATA: generates a two-layer `small` model in WORK and
# sets MODELS to stories260K F32 (when DATA holds it) and that model.
stories_and_small() {
    "$STZ" synth small --layers 2 -o "$1/small.safetensors" -q -f
    MODELS="$1/small.safetensors"
    if [ -f "$2/stories260K.f32.safetensors" ]; then MODELS="$2/stories260K.f32.safetensors $MODELS"; fi
}

# pack_vs_zstd FILE: packs FILE with $STZ (default), checks that it unpacks
# to the same bytes, and compresses it with zstd -19 --long; sets
# orig_bytes, stz_bytes, zstd_bytes and leaves FILE.stz.
pack_vs_zstd() {
    "$STZ" pack "$1" -o "$1.stz" -q -f
    "$STZ" unpack "$1.stz" -o "$1.back" -q -f
    cmp -s "$1" "$1.back" || { echo "round trip failed: $1"; exit 1; }
    zstd -19 --long -T2 -q -f "$1" -o "$1.zst"
    orig_bytes=$(stat -c %s "$1") stz_bytes=$(stat -c %s "$1.stz") zstd_bytes=$(stat -c %s "$1.zst")
    rm -f "$1.back" "$1.zst"
}

# source_tree SRC DEST [PATHSPEC...]: sets TREE to SRC when it is a source
# tree (a CMakeLists.txt), else to DEST, where HEAD of the git directory SRC
# is extracted (PATHSPEC's files, default all) unless it already was, and
# prints the commit; returns 1 when SRC is neither.
source_tree() {
    src=$1 dest=$2
    shift 2
    if [ -f "$src/CMakeLists.txt" ]; then TREE=$src && return 0; fi
    git --git-dir="$src" rev-parse HEAD >/dev/null 2>&1 || return 1
    TREE=$dest
    if [ ! -f "$dest/CMakeLists.txt" ]; then
        rm -rf "$dest" && mkdir -p "$dest"
        git --git-dir="$src" archive HEAD -- "${@:-.}" | tar -x -C "$dest"
    fi
    echo "snapshot $(git --git-dir="$src" rev-parse --short HEAD)"
}

# llama_tools WORK TARGET...: builds llama.cpp's TARGETs (llama-imatrix,
# llama-quantize, ...) in WORK/llama-build from the snapshot at $SRC (a
# source tree or a git directory, extracted to WORK/llama-src) and sets
# LLAMA_BIN; returns 1 (after saying skip) when there is no snapshot.
llama_tools() {
    w=$1
    shift
    # its large vocabulary files are not in the snapshot
    if ! source_tree "$SRC" "$w/llama-src" . ':!models/*.gguf'; then
        echo "skip: no llama.cpp source at $SRC (set LLAMA_SRC)"
        return 1
    fi
    cmake -S "$TREE" -B "$w/llama-build" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
        -DLLAMA_BUILD_SERVER=OFF >/dev/null
    for t in "$@"; do cmake --build "$w/llama-build" --target "$t" -j2 >/dev/null; done
    LLAMA_BIN=$w/llama-build/bin
}

# byte_tokenizer FILE: a byte-level BPE tokenizer.json (256 byte symbols, no
# merges; Qwen2's end-of-text token) for exporting generated models.
byte_tokenizer() {
    python3 - "$1" <<'P'
import json, sys
bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
cs, n = bs[:], 0
for b in range(256):
    if b not in bs:
        bs.append(b), cs.append(256 + n)
        n += 1
json.dump({"model": {"type": "BPE", "vocab": {chr(c): i for i, c in enumerate(cs)}, "merges": []},
           "added_tokens": [{"id": 151643, "content": "<|endoftext|>", "special": True}]}, open(sys.argv[1], "w"))
P
}
# ggml_requant BUILD OUT: builds bench/ggml_requant.c (llama.cpp's own
# quantizer rewriting a GGUF's blocks) as OUT against the ggml that
# bench_ggml_types.sh built in $GGML_WORK (default /dev/shm/stz-bench-ggml)
# and prints OUT; prints nothing when there is no such build.
ggml_requant() {
    gg=${GGML_WORK:-/dev/shm/stz-bench-ggml}
    [ -f "$gg/ggml-build/src/libggml-base.so" ] && [ -d "$gg/ggml-src/include" ] || return 0
    ggml_cc ggml_requant.c "$1" "$gg/ggml-src/include" "$gg/ggml-build/src" "$2" && echo "$2"
}
# ggml_cc FILE.c BUILD INCLUDE LIBDIR OUT: the bench program bench/FILE.c
# built as OUT against stz's library in BUILD, ggml's headers in INCLUDE
# and its libggml-base in LIBDIR.
ggml_cc() {
    here=$(cd "$(dirname "$0")" && pwd)
    cc -O2 -I"$here/../include" -I"$3" "$here/$1" "$2/libstz.a" "$4/libggml-base.so" -Wl,-rpath,"$4" \
        $(pkg-config --libs libzstd libcjson libxxhash) -lopenblas -llapacke -lm -lpthread -o "$5"
}
