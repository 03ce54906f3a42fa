#!/bin/sh
# run_fuzz.sh - build the libFuzzer harnesses and run each one: first over
# its kept crash inputs (tests/fuzz/regress/NAME, which must all pass), then
# fuzzing for SECONDS from the seed corpus (tests/fuzz/corpus/NAME) under
# ASan + UBSan. Prints each harness's executions; exits non-zero on a crash
# (the input is saved as OUTDIR/crash-*: fix the bug, then add the input to
# tests/fuzz/regress/NAME).
#   tests/fuzz/run_fuzz.sh OUTDIR SECONDS [HARNESS...]
set -eu
here=$(cd "$(dirname "$0")" && pwd)
out=${1:?usage: run_fuzz.sh OUTDIR SECONDS [HARNESS...]}
secs=${2:?usage: run_fuzz.sh OUTDIR SECONDS [HARNESS...]}
shift 2
"$here/build.sh" "$out"
[ "$#" -gt 0 ] || set -- safetensors config manifest tokens
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
for h in "$@"; do
    bin="$out/fuzz_$h"
    kept=$(find "$here/regress/$h" -type f ! -name '.*' 2>/dev/null | sort)
    if [ -n "$kept" ]; then
        # shellcheck disable=SC2086
        "$bin" $kept >"$out/regress_$h.log" 2>&1 || { cat "$out/regress_$h.log"; echo "fuzz_$h: a kept input fails again" >&2; exit 1; }
        echo "fuzz_$h: $(echo "$kept" | wc -l) kept inputs pass"
    fi
    mkdir -p "$out/corpus_$h"
    "$bin" -max_total_time="$secs" -print_final_stats=1 -artifact_prefix="$out/" -max_len=65536 \
        "$out/corpus_$h" "$here/corpus/$h" >"$out/fuzz_$h.log" 2>&1 || {
        tail -60 "$out/fuzz_$h.log"; echo "fuzz_$h: crashed (input in $out/crash-*)" >&2; exit 1; }
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$out/fuzz_$h.log")
    echo "fuzz_$h: $execs executions in $secs s, 0 crashes"
done
