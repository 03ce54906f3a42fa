#!/bin/sh
# test_device_flag.sh [CUDA_BUILT] - `--device` of loom train / eval / generate.
#  - --device cpu trains exactly as no flag does (the same loss lines);
#  - an unknown backend exits 64 naming it, before anything is written;
#  - --device cuda on a build without the CUDA backend (CUDA_BUILT not ON)
#    exits 64 with the message naming -DLOOM_CUDA=ON, on one rank and on two
#    (rank named, no hang); with the CUDA backend built it must either run or
#    fail with a message naming cuda.
# Needs LOOM, LOOM_RUN, LOOM_SRC (set by ctest).
set -u
cuda_built=${1:-OFF}
dir=$(mktemp -d /tmp/loom-device-XXXXXX)
trap 'rm -rf "$dir"' EXIT
fail=0
bad() { echo "FAIL: $*"; fail=1; }
data="$LOOM_SRC/data/fortunes_train.bin"
[ -f "$data" ] || data=""
common="--model tiny --steps 2 --batch 2 --seq 16 --threads 1 --quiet --peak-flops 1e9"
[ -n "$data" ] && common="$common --data $data"

# --device cpu is the default
"$LOOM" train $common --metrics "$dir/a.jsonl" >/dev/null 2>"$dir/a.err" || bad "train without --device: $(cat "$dir/a.err")"
"$LOOM" train $common --device cpu --metrics "$dir/b.jsonl" >/dev/null 2>"$dir/b.err" || bad "train --device cpu: $(cat "$dir/b.err")"
la=$(grep -o '"loss": *[^,]*' "$dir/a.jsonl"); lb=$(grep -o '"loss": *[^,]*' "$dir/b.jsonl")
[ -n "$la" ] && [ "$la" = "$lb" ] || bad "--device cpu losses [$lb] differ from the default's [$la]"

# unknown backend
"$LOOM" train $common --device tpu --metrics "$dir/c.jsonl" >/dev/null 2>"$dir/c.err"; rc=$?
[ $rc -eq 64 ] || bad "--device tpu: exit $rc, want 64"
grep -q "device tpu: unknown backend" "$dir/c.err" || bad "--device tpu message: $(cat "$dir/c.err")"
[ ! -e "$dir/c.jsonl" ] || bad "--device tpu wrote metrics"

if [ "$cuda_built" != ON ]; then
    for cmd in "train $common" "eval --model tiny --load-params $dir/none.safetensors"; do
        "$LOOM" $cmd --device cuda >/dev/null 2>"$dir/d.err"; rc=$?
        [ $rc -eq 64 ] || bad "$cmd --device cuda: exit $rc, want 64"
        grep -q "built without the CUDA backend (configure with -DLOOM_CUDA=ON" "$dir/d.err" ||
            bad "$cmd --device cuda message: $(cat "$dir/d.err")"
    done
    "$LOOM" generate --model tiny --load-params "$dir/none.safetensors" --ids 1,2 --device cuda >/dev/null 2>"$dir/g.err"; rc=$?
    [ $rc -eq 64 ] && grep -q "LOOM_CUDA=ON" "$dir/g.err" || bad "generate --device cuda: exit $rc, $(cat "$dir/g.err")"
    timeout 120 "$LOOM_RUN" -np 2 "$LOOM" train $common --dp 2 --device cuda >/dev/null 2>"$dir/e.err"; rc=$?
    [ $rc -ne 0 ] && [ $rc -ne 124 ] || bad "two ranks --device cuda: exit $rc"
    grep -q "rank 0: --device cuda: this loom was built without the CUDA backend" "$dir/e.err" ||
        bad "two ranks message: $(cat "$dir/e.err")"
else
    "$LOOM" train $common --device cuda >/dev/null 2>"$dir/d.err"; rc=$?
    [ $rc -eq 0 ] || grep -qi "cuda" "$dir/d.err" || bad "--device cuda with CUDA built: exit $rc without naming cuda"
fi
[ $fail -eq 0 ] && echo "device flag: all checks passed"
exit $fail
