#!/bin/sh
# test_device_flag.sh [CUDA_BUILT] - `--device` of loom train / eval / generate.
#  - --device cpu trains exactly as no flag does (the same loss lines);
#  - an unknown backend exits 64 naming it, before anything is written;
#  - --device cuda with build/loom (which never has the CUDA backend) exits
#    64 with the message naming -DLOOM_CUDA=ON and loom-cuda, on one rank and
#    on two (rank named, no hang);
#  - with the CUDA backend built (CUDA_BUILT = ON), build/loom-cuda trains
#    --device cpu exactly as loom, and --device cuda runs or exits 64 naming
#    the missing device.
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

# build/loom never has the CUDA backend (it is in build/loom-cuda)
if true; then
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
fi
if [ "$cuda_built" = ON ]; then
    # loom-cuda: --device cpu trains exactly as loom; --device cuda runs, or
    # (no GPU here) exits 64 naming the missing device
    lc=$(dirname "$LOOM")/loom-cuda
    [ -x "$lc" ] || bad "CUDA backend built but $lc missing"
    "$lc" train $common --device cpu --metrics "$dir/f.jsonl" >/dev/null 2>"$dir/f.err" || bad "loom-cuda --device cpu: $(cat "$dir/f.err")"
    lf=$(grep -o '"loss": *[^,]*' "$dir/f.jsonl")
    [ -n "$lf" ] && [ "$lf" = "$la" ] || bad "loom-cuda --device cpu losses [$lf] differ from loom's [$la]"
    "$lc" train $common --device cuda >/dev/null 2>"$dir/d.err"; rc=$?
    [ $rc -eq 0 ] || { [ $rc -eq 64 ] && grep -q "no CUDA device is visible" "$dir/d.err"; } ||
        bad "loom-cuda --device cuda: exit $rc, $(cat "$dir/d.err")"
fi
[ $fail -eq 0 ] && echo "device flag: all checks passed"
exit $fail
