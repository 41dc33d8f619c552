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
