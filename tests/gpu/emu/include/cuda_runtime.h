/* cuda_runtime.h (emulation) - the subset of the CUDA runtime and device
 * intrinsics that loom's hand-written kernels use, executed on the CPU:
 * every CUDA thread of a block is a fiber (ucontext), warps of 32
 * consecutive threads. Barriers (__syncthreads, warp shuffles, __syncwarp)
 * switch fibers; a barrier that cannot complete (divergent __syncthreads, a
 * shuffle with exited lanes) aborts with a message instead of hanging.
 * Streams are synchronous. For checking kernel logic (indexing,
 * synchronisation, numerics of the formulas) without a GPU - it says nothing
 * about GPU performance or about cuBLAS/NCCL. */
#ifndef LOOM_EMU_CUDA_RUNTIME_H
#define LOOM_EMU_CUDA_RUNTIME_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <utility>

struct dim3 {
    unsigned x, y, z;
    dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
typedef dim3 uint3;

struct emu_fiber_state {
    uint3 tid;
};
emu_fiber_state *emu_self(void);
extern dim3 emu_block_idx, emu_block_dim, emu_grid_dim;
#define threadIdx (emu_self()->tid)
#define blockIdx emu_block_idx
#define blockDim emu_block_dim
#define gridDim emu_grid_dim

#define __global__
#define __device__
#define __host__
#define __shared__ static

void emu_syncthreads(void);
int emu_syncthreads_or(int pred);
void emu_syncwarp(void);
double emu_shfl(double v, int src_lane, int xor_mask);
void *emu_dyn_shared(void);
#define __syncthreads() emu_syncthreads()
#define __syncthreads_or(p) emu_syncthreads_or(p)
#define __syncwarp(...) emu_syncwarp()
static inline float __shfl_sync(unsigned, float v, int lane) { return (float)emu_shfl(v, lane, -1); }
static inline float __shfl_xor_sync(unsigned, float v, int mask) { return (float)emu_shfl(v, -1, mask); }
static inline unsigned __float_as_uint(float f) {
    unsigned u;
    memcpy(&u, &f, 4);
    return u;
}
static inline float __uint_as_float(unsigned u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

typedef enum {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorNotReady = 600
} cudaError_t;
typedef enum { cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost, cudaMemcpyDeviceToDevice } cudaMemcpyKind;
typedef struct emu_stream *cudaStream_t;
typedef struct emu_event *cudaEvent_t;
#define cudaStreamNonBlocking 1

const char *cudaGetErrorString(cudaError_t e);
cudaError_t cudaGetLastError(void);
cudaError_t cudaGetDeviceCount(int *n);
cudaError_t cudaSetDevice(int d);
cudaError_t cudaMalloc(void **p, size_t n);
cudaError_t cudaFree(void *p);
cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, cudaMemcpyKind k, cudaStream_t st);
cudaError_t cudaMemsetAsync(void *d, int v, size_t n, cudaStream_t st);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned f);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned f);
cudaError_t cudaEventCreate(cudaEvent_t *e);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s);
cudaError_t cudaEventSynchronize(cudaEvent_t e);
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b);

enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
template <class K> cudaError_t cudaFuncSetAttribute(K, cudaFuncAttribute, int) { return cudaSuccess; }

/* kernel<<<cfg>>>(args) is rewritten by run_emu.sh to emu_launch(kernel, emu_cfg(cfg), args) */
struct emu_cfg {
    dim3 grid, block;
    size_t shm;
    emu_cfg(dim3 g, dim3 b, size_t s = 0, cudaStream_t = 0) : grid(g), block(b), shm(s) {}
};
void emu_run(const emu_cfg &c, void (*body)(void *), void *ctx);
template <class K, class... A> void emu_launch(K k, emu_cfg c, A... args) {
    auto call = [&]() { k(args...); };
    emu_run(c, [](void *p) { (*static_cast<decltype(call) *>(p))(); }, &call);
}

#endif
