# Shared by the bench scripts (sourced before they change directory).
# check DESCRIPTION CONDITION: prints "- PASS: ..." or "- FAIL: ..." for an
# awk expression and counts failures in $fails.
fails=0
check() {
    if awk "BEGIN { exit !($2) }"; then echo "- PASS: $1"; else echo "- FAIL: $1"; fails=$((fails + 1)); fi
}
