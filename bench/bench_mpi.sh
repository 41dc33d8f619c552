#!/bin/sh
# MPI: a generated Qwen2-0.5B-shaped BF16 model with 96 layers (3.2 GB) in
# 16 shards compressed (--int4, --lossless) and decompressed by
# `mpirun -n 2 stz ... -T 1` against one process with one thread, best of
# RUNS; outputs identical. Also the time mpirun takes to start and end two
# ranks that do nothing (a refused command), and the speed-ups without it.
# Usage: bench/bench_mpi.sh [BUILD_DIR] [WORK_DIR] [RUNS]
set -eu
. "$(dirname "$0")/bench_lib.sh"
BUILD=${1:-build}
WORK=${2:-/dev/shm/stz-bench-mpi}
RUNS=${3:-3}
STZ=$(cd "$(dirname "$BUILD/stz")" && pwd)/stz
ldd "$STZ" | grep -q libmpi || { echo "stz was built without MPI"; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mkdir -p "$WORK"
cd "$WORK"
rm -rf m o1 o2 d1 d2
"$STZ" synth qwen2-0.5b --layers 96 --shards 16 -o m -q
N=$(du -sb m | cut -f1)
best() { best_time "$RUNS" "$@"; } # OUTDIR CMD...
echo "## MPI ranks"
echo
echo "$(date -u +%Y-%m-%d), qwen2-0.5b-shaped BF16 synthetic, 96 layers, 16 shards ($N bytes) in $WORK, best of $RUNS runs, -T 1 per process."
echo
"$STZ" synth tiny -o t.safetensors -q -f && "$STZ" pack t.safetensors -o t.stz -q -f
L=$(best none mpirun -n 2 "$STZ" verify t.stz)
echo "Starting and ending two ranks that do next to nothing (\`verify\` of a 0.1 MB container): $L s"
echo "(\"launch\", subtracted in the last column)."
echo
echo "| run | 1 process s | mpirun -n 2 s | speed-up | without the launch |"
echo "|---|---|---|---|---|"
for mode in int4 lossless; do # int4: the policy int4-nl (--int4 when the figures were recorded)
    flag=--lossless
    [ "$mode" = int4 ] && flag="--policy int4-nl"
    a=$(best o1 "$STZ" compress $flag m -o o1 -T 1 -q)
    b=$(best o2 mpirun -n 2 "$STZ" compress $flag m -o o2 -T 1 -q)
    same=no
    diff -r o1 o2 >/dev/null && same=yes
    up=$(awk "BEGIN { printf \"%.2f\", $a / $b }")
    echo "| compress $flag | $a | $b | ${up}x | $(awk "BEGIN { printf \"%.2f\", $a / ($b - $L) }")x |"
    eval "c_$mode=$up"
    c=$(best d1 "$STZ" decompress o1 -o d1 -T 1 -q)
    d=$(best d2 mpirun -n 2 "$STZ" decompress o1 -o d2 -T 1 -q)
    same2=no
    diff -r d1 d2 >/dev/null && same2=yes
    up2=$(awk "BEGIN { printf \"%.2f\", $c / $d }")
    echo "| decompress --$mode | $c | $d | ${up2}x | $(awk "BEGIN { printf \"%.2f\", $c / ($d - $L) }")x |"
    [ "$same" = yes ] && [ "$same2" = yes ] || { echo "- FAIL: --$mode: 2 ranks' output differs"; fails=$((fails + 1)); }
    rm -rf o1 o2 d1 d2
done
echo
check "mpirun -n 2 compress --policy int4-nl >= 1.7x one process, one thread (${c_int4}x)" "$c_int4 >= 1.7"
check "mpirun -n 2 compress --lossless >= 1.7x one process, one thread (${c_lossless}x)" "$c_lossless >= 1.7"
rm -rf m t.safetensors t.stz
exit $((fails > 0))
