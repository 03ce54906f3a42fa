#!/bin/sh
# check_format.sh [--fix] - the C sources follow .clang-format (clang-format
# 14, Debian 12's): src/, tools/, include/, tests/ and bench/ C and CUDA
# files; generated tables and vendored emulation headers opt out with
# clang-format off/on or are not listed. Prints each file that differs and
# exits 1; --fix rewrites them in place.
set -eu
cd "$(dirname "$0")/.."
if ! command -v clang-format >/dev/null 2>&1; then
    echo "check_format: clang-format not found (apt-get install clang-format)" >&2
    exit 69
fi
files=$(find src tools include tests bench \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \) \
        -not -path 'tests/gpu/emu/include/*' -not -path 'tests/fuzz/*corpus*' | sort)
if [ "${1:-}" = "--fix" ]; then
    clang-format -i $files
    exit 0
fi
bad=0
for f in $files; do
    if ! clang-format --dry-run --Werror "$f" >/dev/null 2>&1; then
        echo "not formatted: $f (scripts/check_format.sh --fix)"
        bad=1
    fi
done
[ "$bad" = 0 ] && echo "check_format: $(echo $files | wc -w) files follow .clang-format"
exit $bad
