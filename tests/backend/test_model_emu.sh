#!/bin/sh
# test_model_emu.sh BUILD_DIR - the whole training loop on the CUDA backend
# table, without a GPU: `loom` is linked with loom's CUDA kernels compiled
# for the CPU emulation of CUDA (tests/gpu/emu: CUDA threads as fibers, a
# reference GEMM for cuBLAS, device memory as NaN-filled host memory), and
# `loom train --device cuda` must give the loss of the one-rank CPU run at
# every step (relative difference <= 1e-6) at 1 rank, dp2 zero3, tp2 sp and pp2 zb;
# and that of the CPU run of the same layout at cp2 ring and tiny-moe cp2
# Ulysses ep2 (MoE routing, dispatch, combine and the CP permutations).
# This checks the routing through src/backend/cuda_table.c (every kernel,
# tensor op, allocation, staged init) and the kernels' logic - not a GPU's
# rounding or speed; `ctest -L gpu` on a GPU is that check. Registered only
# for builds with the CUDA backend (src/backend/cuda_table.c, compiled here, defines
# loom_backend_cuda). Needs LOOM_SRC, LOOM_RUN (ctest sets them).
set -eu
build=$1
root=$LOOM_SRC
emu=$root/tests/gpu/emu
work=$(mktemp -d /tmp/loom-model-emu-XXXXXX)
trap 'rm -rf "$work"' EXIT
cp "$root"/src/backend/cuda/*.cu "$root"/src/backend/cuda/*.cuh "$root"/src/backend/cuda/cuda_backend.h "$work/"
# kernel<<<cfg>>>(args) -> emu_launch(kernel, emu_cfg(cfg), args), as tests/gpu/emu/run_emu.sh does
/usr/bin/python3 "$emu/emu_source.py" "$work"
objs=""
for f in "$work"/*.cu "$emu/emu_runtime.cpp"; do
    o="$work/$(basename "$f").o"
    g++ -std=c++17 -O1 -ffp-contract=off -w -I"$emu/include" -I"$work" -I"$root/include" -I"$root/src" \
        -x c++ -c "$f" -o "$o"
    objs="$objs $o"
done
# the CUDA table, as build/loom-cuda links it (the plain loom has none)
mpicc -std=c11 -D_GNU_SOURCE -O1 -DLOOM_HAVE_CUDA=1 -I"$work" -I"$root/include" -I"$root/src" \
    -c "$root/src/backend/cuda_table.c" -o "$work/cuda_table.o"
objs="$objs $work/cuda_table.o"
for f in "$root"/tools/*.c; do
    o="$work/$(basename "$f").o"
    mpicc -std=c11 -D_GNU_SOURCE -O1 -I"$root/include" -I"$root/src" -I"$root/tools" -c "$f" -o "$o"
    objs="$objs $o"
done
mpicc -o "$work/loom_emu" $objs "$build/libloom.a" -lopenblas -lcjson -lmicrohttpd -lgomp -lmvec -lm \
    -lstdc++ -lpthread

data="$work/data.bin"
/usr/bin/python3 - "$data" <<'PY'
import struct, sys
# an llm.c token shard: 256 int32 header (magic 20240520, version 1, count), uint16 tokens
n = 4096
toks = [(i * 7919 + (i >> 3) * 31) % 256 for i in range(n)]
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)))
    f.write(struct.pack("<%dH" % n, *toks))
PY
common="--data $data --model tiny --steps 3 --batch 4 --seq 16 --threads 1 --peak-flops 1e9 --quiet"
# the emulation's device memory is host memory, so MPI reads it: the
# multi-rank runs below declare that (the layout validator's device section,
# src/mesh/layout_check.c), and the first one checks the refusal without it
export LOOM_CUDA_AWARE_MPI=1
if LOOM_CUDA_AWARE_MPI=0 OMP_NUM_THREADS=1 timeout 120 "$LOOM_RUN" -np 2 "$work/loom_emu" train $common --dp 2 \
    --device cuda >"$work/refused" 2>&1 || ! grep -q "NCCL / host staging are not wired" "$work/refused"; then
    echo "FAIL: --device cuda on 2 ranks without LOOM_CUDA_AWARE_MPI was not refused: $(tail -3 "$work/refused")"
    exit 1
fi
# --comm-precision bf16 packs gradients on the host: refused on a device backend
if OMP_NUM_THREADS=1 timeout 120 "$LOOM_RUN" -np 2 "$work/loom_emu" train $common --dp 2 --device cuda \
    --precision bf16 --comm-precision bf16 >"$work/refused" 2>&1 ||
    ! grep -q "comm-precision bf16 with --device cuda" "$work/refused"; then
    echo "FAIL: --comm-precision bf16 with --device cuda was not refused: $(tail -3 "$work/refused")"
    exit 1
fi
OMP_NUM_THREADS=1 "$work/loom_emu" train $common --device cpu --metrics "$work/cpu.jsonl"
fail=0
run() {
    np=$1
    shift
    rm -f "$work/cuda.jsonl"
    if ! OMP_NUM_THREADS=1 timeout 240 "$LOOM_RUN" -np "$np" "$work/loom_emu" train $common --device cuda \
        --metrics "$work/cuda.jsonl" "$@" >"$work/log" 2>&1; then
        echo "FAIL: --device cuda $*: $(tail -3 "$work/log")"
        fail=1
        return
    fi
    /usr/bin/python3 - "$work/cpu.jsonl" "$work/cuda.jsonl" "$*" <<'PY' || fail=1
import json, sys
a = [json.loads(l)["loss"] for l in open(sys.argv[1])]
b = [json.loads(l)["loss"] for l in open(sys.argv[2])]
d = max(abs(x - y) / abs(x) for x, y in zip(a, b)) if len(a) == len(b) else float("inf")
print("--device cuda (emulated) %-28s losses %s, max |cpu - cuda| / |cpu| %.2e" % (sys.argv[3] or "1 rank", b, d))
sys.exit(0 if d <= 1e-6 and len(b) == 3 else 1)
PY
}
run 1
run 2 --dp 2 --zero 3
run 2 --tp 2 --sp
run 2 --pp 2 --schedule zb --micro-batches 2
# MoE, EP and CP (the routing and row ops, which the CUDA table runs on host
# copies): against the CPU run of the same layout
same() {
    np=$1
    shift
    for dev in cpu cuda; do
        rm -f "$work/$dev.same.jsonl"
        if ! OMP_NUM_THREADS=1 timeout 240 "$LOOM_RUN" -np "$np" "$work/loom_emu" train $common \
            --device $dev --metrics "$work/$dev.same.jsonl" "$@" >"$work/log" 2>&1; then
            echo "FAIL: --device $dev $*: $(tail -3 "$work/log")"
            fail=1
            return
        fi
    done
    /usr/bin/python3 - "$work/cpu.same.jsonl" "$work/cuda.same.jsonl" "$*" <<'PY' || fail=1
import json, sys
a = [json.loads(l)["loss"] for l in open(sys.argv[1])]
b = [json.loads(l)["loss"] for l in open(sys.argv[2])]
d = max(abs(x - y) / abs(x) for x, y in zip(a, b)) if len(a) == len(b) else float("inf")
print("--device cuda (emulated) %-28s losses %s, max |cpu - cuda| / |cpu| %.2e" % (sys.argv[3], b, d))
sys.exit(0 if d <= 1e-6 and len(b) == 3 else 1)
PY
}
same 2 --cp 2
same 2 --model tiny-moe --cp 2 --ep 2 --cp-impl ulysses
[ $fail -eq 0 ] && echo "model on the emulated CUDA backend: all checks passed"
exit $fail
