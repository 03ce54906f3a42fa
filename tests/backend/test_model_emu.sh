#!/bin/sh
# test_model_emu.sh BUILD_DIR - the whole training loop on the CUDA backend
# table, without a GPU: `loom` is linked with loom's CUDA kernels compiled
# for the CPU emulation of CUDA (tests/gpu/emu: CUDA threads as fibers, a
# reference GEMM for cuBLAS, device memory as NaN-filled host memory whose
# allocations are listed, so a copy with a host buffer on its device side
# aborts), and test_model_emu.py runs `loom train --device cuda` on it: one
# rank and every parallelism axis on 2 ranks through the device's
# host-staged groups (dp2 ZeRO-3, tp2 SP, pp2, cp2, MoE ep2, bf16
# communication) against the CPU run of the same layout - losses, and the
# bytes every group moved - and a sharded checkpoint saved and resumed on
# the device. This checks the routing through src/backend/cuda_table.c
# (every kernel, tensor op, allocation, staged init), the communicator
# factory's staged groups, the checkpoints' host copies and the kernels'
# logic - not a GPU's rounding or speed; `ctest -L gpu` on a GPU is that
# check. The table is built without NCCL (LOOM_CUDA_NO_NCCL: the emulation
# has none). Registered only for builds with the CUDA backend. Needs
# LOOM_SRC, LOOM_RUN (ctest sets them).
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
mpicc -std=c11 -D_GNU_SOURCE -O1 -DLOOM_HAVE_CUDA=1 -DLOOM_CUDA_NO_NCCL=1 -I"$work" -I"$root/include" -I"$root/src" \
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
unset LOOM_CUDA_AWARE_MPI LOOM_DEVICE_COMM # the device's choice: host-staged groups for cuda
OMP_NUM_THREADS=1 LOOM="$work/loom_emu" /usr/bin/python3 "$root/tests/backend/test_model_emu.py" "$work"
echo "model on the emulated CUDA backend: all checks passed"
