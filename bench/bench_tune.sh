#!/bin/sh
# stz tune benchmark, against the targets of the tune issue:
# - quality: on stories260K (shared data, when present) and on a generated
#   model, the uniform shipped int4 policy against tuned policies at its
#   container size (KL <= 0.5x) and at its KL (container >= 15% smaller),
#   all measured by stz eval --forward on the same sequences (4 x 64 tokens
#   sampled from the original, seed 1: the ones tune measures on);
#   predicted against measured (KL within 30%, size within 2%);
# - cost: tuning the Qwen2-0.5B-shaped model on 2 threads (< 10 minutes),
#   and peak memory of models 4x deeper than one another (independent of
#   the number of layers).
# Usage: bench/bench_tune.sh [BUILD_DIR] [WORK_DIR] [SHARED_DATA_DIR]
set -eu
BUILD=${1:-build}
WORK=${2:-/dev/shm/stz-bench-tune}
DATA=${3:-$(dirname "$0")/../../shared/data}
STZ=$(cd "$(dirname "$BUILD/stz")" && pwd)/stz
DATA=$(cd "$DATA" 2>/dev/null && pwd || echo "")
PY=/usr/bin/python3
mkdir -p "$WORK"
cd "$WORK"
fails=0
get() { # json-file key
    $PY -c "import json,sys; v = json.load(open(sys.argv[1]))[sys.argv[2]]; print(v if isinstance(v, int) else '%.4g' % v)" "$1" "$2"
}
kl_of() { # json report of stz eval --forward
    $PY -c "import json,sys; print('%.4g' % json.load(open(sys.argv[1]))['kl']['mean'])" "$1"
}
verdict() { # condition-in-awk description
    if awk "BEGIN { exit !($1) }"; then echo "- PASS: $2"; else echo "- FAIL: $2"; fails=$((fails + 1)); fi
}

quality() { # MODEL LABEL
    m=$1 label=$2
    "$STZ" compress --policy int4-nl "$m" -o u.stz -q -f
    ub=$(stat -c %s u.stz)
    "$STZ" eval "$m" u.stz --forward --seq-len 64 --json -q >u.json
    uk=$(kl_of u.json)
    "$STZ" tune "$m" --size "$ub" -o s.json -f --json -q >ts.json
    "$STZ" compress --policy s.json "$m" -o s.stz -q -f
    "$STZ" eval "$m" s.stz --forward --seq-len 64 --json -q >s_eval.json
    sk=$(kl_of s_eval.json) sb=$(stat -c %s s.stz)
    "$STZ" tune "$m" --max-kl "$uk" -o k.json -f --json -q >tk.json
    "$STZ" compress --policy k.json "$m" -o k.stz -q -f
    "$STZ" eval "$m" k.stz --forward --seq-len 64 --json -q >k_eval.json
    kk=$(kl_of k_eval.json) kb=$(stat -c %s k.stz)
    echo "#### $label"
    echo
    echo "| policy | container bytes | mean KL (measured) | predicted bytes | predicted KL |"
    echo "|---|---|---|---|---|"
    echo "| uniform int4 | $ub | $uk | | |"
    echo "| tuned, --size $ub | $sb | $sk | $(get ts.json predicted_bytes) | $(get ts.json predicted_kl) |"
    echo "| tuned, --max-kl $uk | $kb | $kk | $(get tk.json predicted_bytes) | $(get tk.json predicted_kl) |"
    echo
    verdict "$sb <= $ub && $sk <= 0.5 * $uk" "$label: at int4's size, tuned KL $sk = $(awk "BEGIN { printf \"%.3f\", $sk / $uk }")x int4's (target <= 0.5x)"
    verdict "$kk <= $uk && $kb <= 0.85 * $ub" "$label: at int4's KL, tuned container $kb = $(awk "BEGIN { printf \"%.3f\", $kb / $ub }")x int4's (target <= 0.85x)"
    for r in ts tk; do
        pk=$(get $r.json predicted_kl) mk=$(get $r.json measured_kl)
        pb=$(get $r.json predicted_bytes) mb=$(get $r.json measured_bytes)
        verdict "$pk <= 1.3 * $mk && $pk >= 0.7 * $mk" "$label ($r): predicted KL $pk against measured $mk (within 30%)"
        verdict "$pb <= 1.02 * $mb && $pb >= 0.98 * $mb" "$label ($r): predicted $pb bytes against measured $mb (within 2%)"
    done
    echo
}

echo "## stz tune benchmark ($(nproc) cores)"
echo
if [ -n "$DATA" ] && [ -f "$DATA/stories260K.f32.safetensors" ]; then
    quality "$DATA/stories260K.f32.safetensors" "stories260K (F32, real weights)"
fi
"$STZ" synth small -o small.safetensors -q -f
quality small.safetensors "generated small model (8 layers, hidden 512, BF16)"

echo "#### Cost"
echo
echo "| model | threads | wall (s) | peak RSS (MiB) |"
echo "|---|---|---|---|"
run_cost() { # MODEL LABEL THREADS: a table row; cost_s, cost_k
    /usr/bin/time -f "%e %M" -o t.txt "$STZ" tune "$1" --ratio 4 -o c.json -f -q -T "$3"
    read -r cost_s cost_k <t.txt
    echo "| $2 | $3 | $cost_s | $((cost_k / 1024)) |"
}
for L in 4 16; do
    "$STZ" synth small --layers $L -o l$L.safetensors -q -f
done
run_cost l4.safetensors "generated small model, 4 layers" 2
r4=$cost_k
run_cost l16.safetensors "generated small model, 16 layers" 2
r16=$cost_k
"$STZ" synth qwen2-0.5b -o q.safetensors -q -f
run_cost q.safetensors "generated Qwen2-0.5B (24 layers, BF16)" 2
qt=$cost_s
echo
verdict "$qt < 600" "Qwen2-0.5B-shaped tuned in $qt s on 2 threads (target < 600 s)"
verdict "$r16 <= 1.15 * $r4" "peak memory 16 layers $((r16 / 1024)) MiB against 4 layers $((r4 / 1024)) MiB (independent of depth: within 15%)"
echo
echo "$fails target(s) missed."
cd / && rm -rf "$WORK"
