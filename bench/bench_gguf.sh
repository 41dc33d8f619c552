#!/bin/sh
# stz gguf (the one command: calibrated, --like TYPE) against llama.cpp's own
# quantizer at the same type, side by side in one run: llama.cpp's file is
# made by llama_model_quantize of node-llama-cpp's prebuilt libllama (its
# default rules, no importance matrix: the C API takes none) from the F32
# GGUF stz exports; stz gguf's at --like that type, calibrated and with
# --fast. Every file is measured by stz eval --forward on the same 16
# held-out sequences (seed 7). Models: an eight-layer generated Llama whose
# rows are whole 256-blocks (tests/test_gguf.py's wide_dir, 4 query heads
# per key head) and stories260K F32 (shared data; llama-quantize makes only
# its K mixes of it: its 172-wide down projections are not whole 32-blocks).
# Skips when node-llama-cpp cannot be installed.
# Usage: bench/bench_gguf.sh [BUILD_DIR] [WORK_DIR] [SHARED_DATA_DIR]
set -eu
BUILD=$(cd "${1:-build}" && pwd)
WORK=${2:-/dev/shm/stz-bench-gguf}
DATA=${3:-$(dirname "$0")/../../shared/data}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$WORK"
STZ=$BUILD/stz SHARED_DATA_DIR=$DATA /usr/bin/python3 - "$ROOT" "$WORK" "$DATA" <<'PY'
import json, os, subprocess, sys
from pathlib import Path
root, work, data = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
sys.path.insert(0, os.path.join(root, "tests"))
import test_gguf as tg
if tg.ggml_lib() is None:
    print("skip: no llama.cpp library (node-llama-cpp not installable)")
    sys.exit(0)

def kl(model, f):
    r = json.loads(tg.stz("eval", "--forward", model, f, "--sequences", "16", "--seed", "7", "--json", "-q").stdout)
    return r["kl"]["mean"]

def row(name, model, f32, like, extra=()):
    ref = work / ("%s-%s.llama.gguf" % (name, like))
    assert tg.llama_quantize(f32, ref, like) == 0
    figs = {"llama.cpp": (os.path.getsize(ref), kl(model, ref))}
    for mode, flags in (("stz gguf", ()), ("--fast", ("--fast",))):
        g = work / ("%s-%s-%s.gguf" % (name, like, mode.strip("- ").replace(" ", "_")))
        tg.stz("gguf", model, "--like", like, "-o", g, "-f", "-q", *extra, *flags)
        figs[mode] = (os.path.getsize(g), kl(model, g))
    l, s, f = figs["llama.cpp"], figs["stz gguf"], figs["--fast"]
    print("| %s | %s | %d | %.4g | %d | %.4g | %d | %.4g | %.3f | %.3f |" % (
        name, like, l[0], l[1], s[0], s[1], f[0], f[1], s[1] / l[1], s[1] / f[1]))
    return s[0] <= l[0] and s[1] < l[1]

print("## stz gguf --like TYPE against llama.cpp's own quantizer of that type (no imatrix), 16 x 128 held-out tokens\n")
print("| model | type | llama.cpp bytes | KL | stz gguf bytes | KL | --fast bytes | KL | KL / llama.cpp | KL / --fast |")
print("|---|---|---|---|---|---|---|---|---|---|")
ok = True
for d in (work / "wide8",):
    if d.exists():
        subprocess.run(["rm", "-rf", str(d)])
m = tg.wide_dir(work, name="wide8", layers=8, kv_heads=1)
f32 = work / "wide8.f32.gguf"
tg.stz("export", "--gguf", m, "-o", f32, "-f", "-q")
for like in ("q4_k_m", "q4_k_s", "iq4_xs", "iq4_nl", "q5_0", "q5_k_m", "q3_k_m"):
    ok &= row("generated 8-layer", m, f32, like)
stories = os.path.join(data, "stories260K.f32.safetensors")
if os.path.exists(stories):
    tok = os.path.join(data, "tok512.bin")
    f32 = work / "stories.f32.gguf"
    tg.stz("export", "--gguf", stories, "--tokenizer", tok, "-o", f32, "-f", "-q")
    for like in ("q4_k_m", "q5_k_m", "q3_k_m"):
        ok &= row("stories260K", stories, f32, like, ("--tokenizer", tok))
print("\n- %s: every stz gguf file no larger than llama.cpp's, at lower KL" % ("PASS" if ok else "FAIL"))
sys.exit(0 if ok else 1)
PY
