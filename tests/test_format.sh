#!/bin/sh
# The code's layout (.clang-format): every C file's lines at most 120
# columns, and with clang-format 14, the version the configuration was
# written for (others lay out some constructs differently), no file that
# clang-format would change. Usage: test_format.sh SOURCE_DIR
cd "${1:-$(dirname "$0")/..}" || exit 1
files=$(git ls-files '*.c' '*.h' 2>/dev/null)
[ -n "$files" ] || files=$(find . -name '*.[ch]' -not -path './build*' -not -path './.venv/*')
long=$(echo "$files" | xargs awk 'length > 120 { print FILENAME ":" FNR ": " length " columns" }')
if [ -n "$long" ]; then
    echo "lines over 120 columns:"
    echo "$long"
    exit 1
fi
echo "$(echo "$files" | wc -l) files, no line over 120 columns"
if ! clang-format --version 2>/dev/null | grep -q "version 14\."; then
    echo "skip: the layout check needs clang-format 14 (apt-get install clang-format-14)"
    exit 0
fi
echo "$files" | xargs clang-format --dry-run --Werror || {
    echo "clang-format would change the files above: run clang-format -i on them"
    exit 1
}
echo "clang-format 14: every file as .clang-format lays it out"
