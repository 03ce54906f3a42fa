/* emu_runtime.cpp - the CPU emulation behind include/cuda_runtime.h: a block's
 * threads run as fibers scheduled round-robin; a fiber runs until it reaches
 * a barrier (block or warp), and a barrier opens when every live thread of
 * its block (or warp) has reached it. Shared memory starts as NaN bytes so
 * reads before writes show up in results. Device memory is host memory, but
 * the runtime keeps the list of its allocations: a copy or memset whose
 * "device" side is not inside one (a host buffer handed where device memory
 * belongs), or whose "host" side is, aborts naming the call - on a GPU that
 * is an error or silent garbage. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <ucontext.h>

#include <map>
#include <mutex>
#include <vector>

#include "cuda_runtime.h"

dim3 emu_block_idx, emu_block_dim, emu_grid_dim;

enum { RUN, WAIT_WARP, WAIT_BLOCK, DONE };

struct fiber {
    emu_fiber_state st;
    ucontext_t ctx;
    int state;
    int linear;
};

static std::vector<fiber> g_f;
static std::vector<char> g_stacks, g_dyn;
static ucontext_t g_sched;
static int g_cur;
static void (*g_body)(void *);
static void *g_ctx;
static double g_warp_vals[32][32]; /* [warp][lane] */
static int g_block_or;
static const size_t STACK = 128 * 1024;

emu_fiber_state *emu_self(void) { return &g_f[g_cur].st; }
void *emu_dyn_shared(void) { return g_dyn.data(); }

static void trampoline(void) {
    g_body(g_ctx);
    g_f[g_cur].state = DONE;
    swapcontext(&g_f[g_cur].ctx, &g_sched);
}

static void wait_as(int s) {
    g_f[g_cur].state = s;
    swapcontext(&g_f[g_cur].ctx, &g_sched);
}

void emu_syncthreads(void) { wait_as(WAIT_BLOCK); }

int emu_syncthreads_or(int pred) {
    wait_as(WAIT_BLOCK); /* everyone arrived: previous uses of g_block_or are over */
    if (g_f[g_cur].linear == 0) g_block_or = 0;
    wait_as(WAIT_BLOCK);
    if (pred) g_block_or = 1;
    wait_as(WAIT_BLOCK);
    int r = g_block_or;
    wait_as(WAIT_BLOCK);
    return r;
}

void emu_syncwarp(void) { wait_as(WAIT_WARP); }

double emu_shfl(double v, int src_lane, int xor_mask) {
    int lin = g_f[g_cur].linear, w = lin / 32, lane = lin % 32;
    g_warp_vals[w % 32][lane] = v;
    wait_as(WAIT_WARP);
    int src = xor_mask >= 0 ? (lane ^ xor_mask) : src_lane;
    double r = g_warp_vals[w % 32][src & 31];
    wait_as(WAIT_WARP);
    return r;
}

static void run_block(int nthreads) {
    for (int i = 0; i < nthreads; i++) {
        fiber &f = g_f[i];
        f.state = RUN;
        f.linear = i;
        f.st.tid = dim3(i % emu_block_dim.x, (i / emu_block_dim.x) % emu_block_dim.y,
                        i / (emu_block_dim.x * emu_block_dim.y));
        getcontext(&f.ctx);
        f.ctx.uc_stack.ss_sp = g_stacks.data() + (size_t)i * STACK;
        f.ctx.uc_stack.ss_size = STACK;
        f.ctx.uc_link = NULL;
        makecontext(&f.ctx, trampoline, 0);
    }
    int nwarps = (nthreads + 31) / 32;
    for (;;) {
        for (int i = 0; i < nthreads; i++)
            if (g_f[i].state == RUN) {
                g_cur = i;
                swapcontext(&g_sched, &g_f[i].ctx);
            }
        int released = 0, live = 0, at_block = 0;
        for (int w = 0; w < nwarps; w++) {
            int lo = w * 32, hi = lo + 32 < nthreads ? lo + 32 : nthreads, n_live = 0, n_wait = 0;
            for (int i = lo; i < hi; i++) {
                if (g_f[i].state != DONE) n_live++;
                if (g_f[i].state == WAIT_WARP) n_wait++;
            }
            if (n_wait && n_wait != hi - lo) {
                if (n_wait == n_live)
                    fprintf(stderr, "emu: block (%u,%u) warp %d: warp-level op with %d exited lanes\n",
                            emu_block_idx.x, emu_block_idx.y, w, hi - lo - n_live);
                else
                    continue; /* others of the warp still running or at a block barrier */
                abort();
            }
            if (n_wait) {
                for (int i = lo; i < hi; i++) g_f[i].state = RUN;
                released = 1;
            }
        }
        for (int i = 0; i < nthreads; i++) {
            if (g_f[i].state != DONE) live++;
            if (g_f[i].state == WAIT_BLOCK) at_block++;
        }
        if (live == 0) return;
        if (at_block == live) {
            for (int i = 0; i < nthreads; i++)
                if (g_f[i].state == WAIT_BLOCK) g_f[i].state = RUN;
            released = 1;
        }
        int runnable = 0;
        for (int i = 0; i < nthreads; i++) runnable |= g_f[i].state == RUN;
        if (!released && !runnable) {
            fprintf(stderr, "emu: block (%u,%u): threads wait at barriers that cannot open (%d live, %d at __syncthreads)\n",
                    emu_block_idx.x, emu_block_idx.y, live, at_block);
            abort();
        }
    }
}

void emu_run(const emu_cfg &c, void (*body)(void *), void *ctx) {
    int nthreads = (int)(c.block.x * c.block.y * c.block.z);
    if (nthreads > 1024) {
        fprintf(stderr, "emu: %d threads per block\n", nthreads);
        abort();
    }
    if ((int)g_f.size() < nthreads) {
        g_f.resize(nthreads);
        g_stacks.resize((size_t)nthreads * STACK);
    }
    g_dyn.assign(c.shm ? c.shm : 1, (char)0xff); /* NaN floats */
    g_body = body, g_ctx = ctx;
    emu_block_dim = c.block, emu_grid_dim = c.grid;
    for (unsigned z = 0; z < c.grid.z; z++)
        for (unsigned y = 0; y < c.grid.y; y++)
            for (unsigned x = 0; x < c.grid.x; x++) {
                emu_block_idx = dim3(x, y, z);
                run_block(nthreads);
            }
}

/* ---- runtime ---------------------------------------------------------------- */

const char *cudaGetErrorString(cudaError_t e) {
    return e == cudaSuccess ? "no error" : e == cudaErrorMemoryAllocation ? "out of memory" : "invalid argument";
}
cudaError_t cudaGetLastError(void) { return cudaSuccess; }
cudaError_t cudaGetDeviceCount(int *n) { *n = 1; return cudaSuccess; }
cudaError_t cudaSetDevice(int) { return cudaSuccess; }
/* ---- device memory: host memory, its allocations listed --------------------- */

static std::mutex g_mem_mu;
static std::map<uintptr_t, size_t> g_allocs; /* start -> bytes */

/* 1 when [p, p + n) lies inside one device allocation. */
static int is_device(const void *p, size_t n) {
    std::lock_guard<std::mutex> lock(g_mem_mu);
    auto it = g_allocs.upper_bound((uintptr_t)p);
    if (it == g_allocs.begin()) return 0;
    --it;
    return (uintptr_t)p + n <= it->first + (it->second ? it->second : 1);
}

static void check_side(const char *call, const char *side, const void *p, size_t n, int device) {
    if (is_device(p, n) == device) return;
    fprintf(stderr, "emu: %s: the %s %p (%zu bytes) is %s device memory\n", call, side, p, n,
            device ? "not" : "inside");
    abort();
}

cudaError_t cudaMalloc(void **p, size_t n) {
    if (n > ((size_t)1 << 40)) return *p = NULL, cudaErrorMemoryAllocation;
    *p = malloc(n ? n : 1);
    if (*p) memset(*p, 0xff, n); /* device memory starts as NaN garbage */
    if (*p) {
        std::lock_guard<std::mutex> lock(g_mem_mu);
        g_allocs[(uintptr_t)*p] = n;
    }
    return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t cudaFree(void *p) {
    if (p) {
        std::lock_guard<std::mutex> lock(g_mem_mu);
        g_allocs.erase((uintptr_t)p);
    }
    free(p);
    return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, cudaMemcpyKind k, cudaStream_t) {
    if (n) {
        const char *call = k == cudaMemcpyHostToDevice   ? "cudaMemcpy host to device"
                           : k == cudaMemcpyDeviceToHost ? "cudaMemcpy device to host"
                                                         : "cudaMemcpy device to device";
        check_side(call, "source", s, n, k != cudaMemcpyHostToDevice);
        check_side(call, "destination", d, n, k != cudaMemcpyDeviceToHost);
    }
    memmove(d, s, n);
    return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void *d, int v, size_t n, cudaStream_t) {
    if (n) check_side("cudaMemset", "destination", d, n, 1);
    memset(d, v, n);
    return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned) { *s = (cudaStream_t)malloc(1); return cudaSuccess; }
cudaError_t cudaStreamDestroy(cudaStream_t s) { free(s); return cudaSuccess; }
cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t, unsigned) { return cudaSuccess; }
cudaError_t cudaEventCreate(cudaEvent_t *e) { *e = (cudaEvent_t)calloc(1, sizeof(double)); return cudaSuccess; }
cudaError_t cudaEventDestroy(cudaEvent_t e) { free(e); return cudaSuccess; }
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    *(double *)e = ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
    return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t) { return cudaSuccess; }
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b) {
    *ms = (float)(*(double *)b - *(double *)a);
    return cudaSuccess;
}
