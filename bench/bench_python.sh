#!/bin/sh
# Python package speed: stz.load_file of the lossless container of the
# generated Qwen2-0.5B-shaped model into numpy (BF16 as its uint16 bits:
# bf16_raw=True; widening 494M values to float32 is numpy's own cost) against `stz unpack` of the same container to tmpfs,
# best of 3 each; and safe_open(...).get_tensor of one small tensor.
# Target: load_file at >= 80% of unpack's speed.
# Usage: bench/bench_python.sh [BUILD_DIR] [WORK_DIR]
set -eu
BUILD=${1:-build}
WORK=${2:-/dev/shm/stz-bench}
mkdir -p "$WORK"
Q=$WORK/qwen2-0.5b.safetensors
"$BUILD/stz" synth qwen2-0.5b -o "$Q" -q -f
"$BUILD/stz" pack -q -f "$Q" -o "$Q.stz"
PY=/usr/bin/python3
[ -x "$PY" ] || PY=python3
STZ=$BUILD/stz STZ_LIBRARY=$BUILD/libstz.so PYTHONPATH=$(dirname "$0")/../python "$PY" - "$BUILD/stz" "$Q.stz" "$WORK" <<'PY'
import os, subprocess, sys, time
import stz
prog, packed, work = sys.argv[1:4]
def best(f):
    t = []
    for _ in range(3):
        t0 = time.perf_counter(); f(); t.append(time.perf_counter() - t0)
    return min(t)
size = 988098120
u = best(lambda: subprocess.run([prog, "unpack", "-q", "-f", packed, "-o", os.path.join(work, "u.safetensors")], check=True))
l = best(lambda: stz.load_file(packed, dequantize=False, bf16_raw=True))
with stz.safe_open(packed) as f:
    one = best(lambda: f.get_tensor("model.layers.3.input_layernorm.weight"))
print("| what | seconds | MB/s |\n|---|---|---|")
print("| stz unpack to tmpfs | %.2f | %.0f |" % (u, size / u / 1e6))
print("| stz.load_file into numpy (raw BF16) | %.2f | %.0f |" % (l, size / l / 1e6))
print("| safe_open().get_tensor of one 896-value tensor | %.4f | |" % one)
print("\n- %s: load_file at %.0f%% of unpack's speed (target >= 80%%)" % ("PASS" if u / l >= 0.8 else "FAIL", 100 * u / l))
PY
rm -f "$Q" "$Q.stz" "$WORK/u.safetensors"
