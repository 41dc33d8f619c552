#!/bin/sh
# Scale: a Llama-3.1-8B-shaped BF16 model (stz synth llama-3.1-8b, ~16 GB)
# as a Hugging Face directory of 4 shards, compressed and decompressed
# (--lossless and --policy int4-nl) with -T 2: time, MB/s, peak RSS, and the disk
# space used beyond the output (df of WORK's file system sampled every
# 0.2 s during the run, peak minus the final figure). The same commands on
# the Qwen2-0.5B-shaped model give the per-core throughput to compare, as
# MB per CPU second (user + system): 16 GB and its output do not fit in the
# page cache, so the wall clock of the big runs also waits for the disk,
# whose speed `cp -r` of the model shows in the same run.
# The lossless round trip is checked shard by shard with cmp.
# Usage: bench/bench_8b.sh [BUILD_DIR] [WORK_DIR]   (WORK needs ~45 GB free)
set -eu
. "$(dirname "$0")/bench_lib.sh"
BUILD=${1:-build}
WORK=${2:-/tmp/stz-bench-8b}
STZ=$(cd "$(dirname "$BUILD/stz")" && pwd)/stz
mkdir -p "$WORK"
cd "$WORK"
rm -rf m c.* d.* q.safetensors q.stz
used() { df --output=used -B1 . | tail -1; }
# run NAME OUTPUT CMD...: prints a table row, sets S RSS EXTRA CPU (user + system seconds)
run() {
    name=$1 out=$2
    shift 2
    base=$(used)
    (peak=0; while :; do u=$(used); [ "$u" -gt "$peak" ] && peak=$u && echo "$peak" >peak; sleep 0.2; done) &
    sampler=$!
    /usr/bin/time -f "%e %M %U %S" -o time "$@"
    kill "$sampler"
    wait "$sampler" 2>/dev/null || true
    final=$(used)
    set -- $(cat time)
    S=$1 RSS=$(($2 / 1024)) CPU=$(awk "BEGIN { print $3 + $4 }")
    EXTRA=$(( ($(cat peak) - final) / 1000000 ))
    [ "$EXTRA" -lt 0 ] && EXTRA=0
    echo "| $name | $S | $(awk "BEGIN { printf \"%.0f\", $IN / $S / 1e6 }") | $(awk "BEGIN { printf \"%.0f\", $IN / $CPU / 1e6 }") | $RSS | $(du -sb "$out" | cut -f1) | $EXTRA |"
}
echo "## Scale: Llama-3.1-8B-shaped model in 4 shards"
echo
"$STZ" synth llama-3.1-8b --shards 4 -o m -q
IN=$(du -sb m | cut -f1)
echo "$(date -u +%Y-%m-%d), llama-3.1-8b BF16 synthetic, 4 shards, $IN bytes, in $WORK ($(df --output=source . | tail -1)), -T 2."
echo "MB/s are of the input (the model for compress, the container for decompress)."
echo
echo "| run | s | MB/s | MB per CPU s | peak RSS MiB | output bytes | disk beyond the output, MB |"
echo "|---|---|---|---|---|---|---|"
run "cp -r (the disk's speed)" cp.m cp -r m cp.m
rm -rf cp.m
for mode in lossless int4; do
    run "compress --$mode" "c.$mode" "$STZ" compress --$mode m -o "c.$mode" -T 2 -q
    eval "c_${mode}_s=$S c_${mode}_cpu=$CPU c_${mode}_rss=$RSS c_${mode}_x=$EXTRA"
    check_rss="$RSS"
    IN_SAVE=$IN
    IN=$(du -sb "c.$mode" | cut -f1)
    run "decompress --$mode" "d.$mode" "$STZ" decompress "c.$mode" -o "d.$mode" -T 2 -q
    eval "d_${mode}_rss=$RSS d_${mode}_x=$EXTRA"
    IN=$IN_SAVE
done
same=yes
for f in m/*.safetensors; do cmp -s "$f" "d.lossless/$(basename "$f")" || same=no; done
echo
echo "Lossless round trip identical, shard by shard: $same."
[ "$same" = yes ] || fails=$((fails + 1))
rm -rf d.lossless d.int4 c.lossless
# per core on the small model, same commands and threads
"$STZ" synth qwen2-0.5b -o q.safetensors -q -f
Q=$(stat -c %s q.safetensors)
/usr/bin/time -f "%e %U %S" -o time "$STZ" compress --lossless q.safetensors -o q.stz -T 2 -q -f
set -- $(cat time)
ql=$(awk "BEGIN { printf \"%.0f\", $Q / $1 / 1e6 }") qlc=$(awk "BEGIN { printf \"%.0f\", $Q / ($2 + $3) / 1e6 }")
/usr/bin/time -f "%e %U %S" -o time "$STZ" compress --policy int4-nl q.safetensors -o q.stz -T 2 -q -f
set -- $(cat time)
q4=$(awk "BEGIN { printf \"%.0f\", $Q / $1 / 1e6 }") q4c=$(awk "BEGIN { printf \"%.0f\", $Q / ($2 + $3) / 1e6 }")
bl=$(awk "BEGIN { printf \"%.0f\", $IN / $c_lossless_cpu / 1e6 }")
b4=$(awk "BEGIN { printf \"%.0f\", $IN / $c_int4_cpu / 1e6 }")
echo "Qwen2-0.5B-shaped ($Q bytes, in the page cache), same -T 2: compress --lossless $ql MB/s ($qlc per CPU s),"
echo "--int4 $q4 MB/s ($q4c per CPU s)."
echo
for v in c_lossless_rss d_lossless_rss c_int4_rss d_int4_rss; do
    eval "r=\$$v"
    check "$v $r MiB <= 512" "$r <= 512"
done
for v in c_lossless_x d_lossless_x c_int4_x d_int4_x; do
    eval "x=\$$v"
    check "$v: $x MB of disk beyond the output (<= 64: a few chunks in flight)" "$x <= 64"
done
check "compress --lossless per core: $bl MB per CPU s >= 0.9 x the small model's $qlc" "$bl >= 0.9 * $qlc"
check "compress --policy int4-nl per core: $b4 MB per CPU s >= 0.9 x the small model's $q4c" "$b4 >= 0.9 * $q4c"
rm -rf m c.int4 q.safetensors q.stz time peak
exit $((fails > 0))
