#!/bin/sh
# run_emu.sh - run tests/gpu/test_cuda_kernels.c (and, on 2 ranks,
# test_cuda_staged.c) against loom's hand-written
# CUDA kernels compiled for the CPU emulation in include/ (fibers as CUDA
# threads). Checks the kernels' indexing, synchronisation and formulas
# without a GPU. cuBLAS/cuBLASLt are replaced by a reference GEMM written
# from cuBLAS's documented column-major semantics (include/cublas_v2.h), so
# the row-major -> column-major mapping is checked, not cuBLAS; nothing here
# says anything about GPU rounding or speed (TF32 is not modelled).
# ctest runs it as cuda_kernels_emu (label emu); on a GPU, `ctest -L gpu` is
# the real check.
#   tests/gpu/emu/run_emu.sh [BUILD_DIR]   (needs BUILD_DIR/libloom.a)
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
build=${1:-$root/build}
work=$(mktemp -d /tmp/loom-cuda-emu-XXXXXX)
trap 'rm -rf "$work"' EXIT
for f in cuda_core.cu cuda_elementwise.cu cuda_gemm.cu cuda_norm.cu cuda_vocab.cu cuda_attention.cu cuda_route.cu cuda_llama.cu cuda_internal.cuh cuda_backend.h; do
    cp "$root/src/backend/cuda/$f" "$work/"
done
# kernel<<<cfg>>>(args) -> emu_launch(kernel, emu_cfg(cfg), args); dynamic shared memory
/usr/bin/python3 "$here/emu_source.py" "$work"
CXX="g++ -std=c++17 -O1 -g -ffp-contract=off -Wall -Wextra -Wno-unused-parameter -Wno-unknown-pragmas"
INC="-I$here/include -I$work -I$root/include -I$root/src"
for f in "$work"/*.cu "$here/emu_runtime.cpp"; do
    $CXX $INC -x c++ -c "$f" -o "$work/$(basename "$f").o"
done
mpicc -std=c11 -D_GNU_SOURCE -O1 -g -Wall -Wextra -Werror -I"$work" -I"$root/include" -I"$root/tests" \
    -c "$root/tests/gpu/test_cuda_kernels.c" -o "$work/test.o"
mpicc -std=c11 -D_GNU_SOURCE -O1 -c "$root/tests/check.c" -I"$root/tests" -o "$work/check.o"
LIBS="$build/libloom.a -lopenblas -lcjson -lmicrohttpd -lgomp -lmvec -lm -lstdc++ -lpthread"
kern="$work/cuda_core.cu.o $work/cuda_elementwise.cu.o $work/cuda_gemm.cu.o $work/cuda_norm.cu.o $work/cuda_vocab.cu.o $work/cuda_attention.cu.o $work/cuda_route.cu.o $work/cuda_llama.cu.o $work/emu_runtime.cpp.o"
mpicc -o "$work/test_emu" "$work/test.o" "$work/check.o" $kern $LIBS
"$work/test_emu"
# the host-staged communicator (src/comm/comm_staged.c, in libloom.a) on
# (emulated) device buffers, 2 ranks
mpicc -std=c11 -D_GNU_SOURCE -O1 -g -Wall -Wextra -Werror -I"$work" -I"$root/include" \
    -I"$root/tests" -c "$root/tests/gpu/test_cuda_staged.c" -o "$work/test_staged.o"
mpicc -std=c11 -D_GNU_SOURCE -O1 -g -Wall -Wextra -Werror -I"$work" -I"$root/include" -I"$root/tests" \
    -c "$root/tests/gpu/gpu_mpi.c" -o "$work/gpu_mpi.o"
mpicc -o "$work/test_staged_emu" "$work/test_staged.o" "$work/gpu_mpi.o" "$work/check.o" $kern $LIBS
"$root/scripts/loomrun" -np 2 "$work/test_staged_emu"
