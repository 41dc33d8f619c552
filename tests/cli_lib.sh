# Shared by the shell tests: a temporary directory $T removed at exit,
# pass/fail counters, and checks on a command's exit status and output.
# Usage (sourced): . cli_lib.sh STZ [SHARED_DATA_DIR]
STZ=$1
DATA=${2:-}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
pass=0 fail=0
ok() { pass=$((pass + 1)); }
bad() { echo "FAIL: $*"; fail=$((fail + 1)); }
expect_rc() { # expected-rc description command...
    want=$1 what=$2; shift 2
    "$@" >"$T/out" 2>"$T/err" </dev/null; rc=$?
    if [ "$rc" = "$want" ]; then ok; else bad "$what: exit $rc, wanted $want"; cat "$T/err"; fi
}
has() { # file pattern description
    if grep -q -- "$2" "$1"; then ok; else bad "$3: '$2' not in output"; cat "$1"; fi
}
hasnt() { # file pattern description
    if grep -q -- "$2" "$1"; then bad "$3: '$2' in output"; cat "$1"; else ok; fi
}
same() { # file-a file-b description: byte-identical (sha256)
    if [ "$(sha256sum <"$1")" = "$(sha256sum <"$2")" ]; then ok; else bad "$3: $1 and $2 differ"; fi
}
finish() { # name
    echo "$1: $pass passed, $fail failed"
    [ "$fail" -eq 0 ]
}
