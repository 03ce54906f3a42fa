/* cuda_core.cu - device selection, the sticky error, the context (its
 * cuBLAS handle, precision and scratch buffers), device memory, streams and
 * events of the CUDA backend.
 *
 * Kernels return void (as on the CPU), so a failure inside one is kept: the
 * first failed launch, CUDA call or cuBLAS call stores "cuda: <what>: <why>"
 * and loom_cuda_status / loom_cuda_sync report it as LOOM_EUNAVAIL. Later
 * failures are usually consequences of the first, so only the first counts.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_internal.cuh"

static char lc_err_msg[256];
static int lc_err_set;
static thread_local cudaStream_t lc_cur_stream;

static void lc_remember(const char *what, const char *why) {
    if (lc_err_set) return;
    snprintf(lc_err_msg, sizeof lc_err_msg, "cuda: %s: %s", what, why);
    lc_err_set = 1;
}

int lc_cuda(cudaError_t e, const char *what) {
    if (e == cudaSuccess) return 1;
    lc_remember(what, cudaGetErrorString(e));
    return 0;
}

int lc_launched(const char *what) { return lc_cuda(cudaGetLastError(), what); }

int lc_blas(cublasStatus_t s, const char *what) {
    if (s == CUBLAS_STATUS_SUCCESS) return 1;
    lc_remember(what, cublasGetStatusString(s));
    return 0;
}

cudaStream_t lc_stream(void) { return lc_cur_stream; }

cublasHandle_t lc_cublas(loom_cuda_ctx *c) {
    lc_blas(cublasSetStream(c->blas, lc_cur_stream), "cublasSetStream");
    return c->blas;
}

void *lc_scratch(loom_cuda_ctx *c, int slot, size_t bytes) {
    if (bytes <= c->scr_cap[slot] && c->scr[slot]) return c->scr[slot];
    /* cudaFree waits for the device, so kernels still reading the old buffer finish first */
    if (c->scr[slot]) cudaFree(c->scr[slot]);
    c->scr[slot] = NULL;
    c->scr_cap[slot] = 0;
    if (!lc_cuda(cudaMalloc(&c->scr[slot], bytes ? bytes : 1), "scratch cudaMalloc")) {
        c->scr[slot] = NULL;
        return NULL;
    }
    c->scr_cap[slot] = bytes;
    return c->scr[slot];
}

/* ---- the context ------------------------------------------------------------- */

loom_status loom_cuda_ctx_create(int precision, loom_cuda_ctx **out) {
    *out = NULL;
    loom_cuda_ctx *c = (loom_cuda_ctx *)calloc(1, sizeof *c);
    if (!c) return loom_fail(LOOM_EOS, "cuda: out of memory for a context");
    loom_cuda_set_precision(c, precision);
    if (!lc_blas(cublasCreate(&c->blas), "cublasCreate")) {
        free(c);
        return loom_cuda_status();
    }
    *out = c;
    return LOOM_OK;
}

void loom_cuda_ctx_free(loom_cuda_ctx *c) {
    if (!c) return;
    for (int i = 0; i < LC_SCRATCH_N; i++)
        if (c->scr[i]) cudaFree(c->scr[i]);
    if (c->lt) cublasLtDestroy(c->lt);
    cublasDestroy(c->blas);
    free(c->host);
    free(c);
}

void loom_cuda_set_precision(loom_cuda_ctx *c, int mode) {
    c->precision = mode == LOOM_CUDA_BF16 || mode == LOOM_CUDA_TF32 ? mode : LOOM_CUDA_FP32;
}

int loom_cuda_get_precision(const loom_cuda_ctx *c) { return c->precision; }

float *loom_cuda_host_scratch(loom_cuda_ctx *c, size_t n) {
    if (n > c->host_n) {
        float *p = (float *)realloc(c->host, n * sizeof(float));
        if (!p) abort(); /* kernels return void; out of host memory mid-step */
        c->host = p;
        c->host_n = n;
    }
    return c->host;
}

/* ---- device ---------------------------------------------------------------- */

int loom_cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError(); /* "no device" / "no driver" is an answer, not a failure */
        return 0;
    }
    return n;
}

loom_status loom_cuda_init(int dev) {
    int n = loom_cuda_device_count();
    if (dev < 0 || dev >= n)
        return loom_fail(LOOM_EUNAVAIL, "cuda: device %d does not exist (%d visible)", dev, n);
    cudaError_t e = cudaSetDevice(dev);
    if (e != cudaSuccess)
        return loom_fail(LOOM_EUNAVAIL, "cuda: cannot use device %d: %s", dev, cudaGetErrorString(e));
    return LOOM_OK;
}

loom_status loom_cuda_status(void) {
    if (!lc_err_set) return LOOM_OK;
    return loom_fail(LOOM_EUNAVAIL, "%s", lc_err_msg);
}

loom_status loom_cuda_sync(void) {
    lc_cuda(cudaStreamSynchronize(lc_cur_stream), "stream synchronize");
    return loom_cuda_status();
}

/* ---- memory ---------------------------------------------------------------- */

void *loom_cuda_alloc(size_t bytes) {
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        cudaGetLastError();
        loom_fail(LOOM_EOS, "cuda: cannot allocate %zu bytes of device memory: %s", bytes,
                  cudaGetErrorString(e));
        return NULL;
    }
    return p;
}

void loom_cuda_free(void *p) {
    if (p) cudaFree(p);
}

static loom_status lc_copy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind, const char *what,
                           int wait) {
    if (!bytes) return LOOM_OK;
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, kind, lc_cur_stream);
    if (e == cudaSuccess && wait) e = cudaStreamSynchronize(lc_cur_stream);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return loom_fail(LOOM_EUNAVAIL, "cuda: %s of %zu bytes failed: %s", what, bytes,
                         cudaGetErrorString(e));
    }
    return LOOM_OK;
}

loom_status loom_cuda_memcpy_h2d(void *dst, const void *src, size_t bytes) {
    return lc_copy(dst, src, bytes, cudaMemcpyHostToDevice, "copy host to device", 1);
}

loom_status loom_cuda_memcpy_d2h(void *dst, const void *src, size_t bytes) {
    return lc_copy(dst, src, bytes, cudaMemcpyDeviceToHost, "copy device to host", 1);
}

loom_status loom_cuda_memcpy_d2d(void *dst, const void *src, size_t bytes) {
    return lc_copy(dst, src, bytes, cudaMemcpyDeviceToDevice, "copy device to device", 0);
}

loom_status loom_cuda_memset(void *dst, int value, size_t bytes) {
    if (!bytes) return LOOM_OK;
    cudaError_t e = cudaMemsetAsync(dst, value, bytes, lc_cur_stream);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return loom_fail(LOOM_EUNAVAIL, "cuda: memset of %zu bytes failed: %s", bytes, cudaGetErrorString(e));
    }
    return LOOM_OK;
}

/* ---- streams and events ----------------------------------------------------- */

static loom_status lc_status_of(cudaError_t e, const char *what) {
    if (e == cudaSuccess) return LOOM_OK;
    cudaGetLastError();
    return loom_fail(LOOM_EUNAVAIL, "cuda: %s failed: %s", what, cudaGetErrorString(e));
}

loom_status loom_cuda_stream_create(loom_cuda_stream *s) {
    cudaStream_t st = NULL;
    loom_status r = lc_status_of(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), "stream create");
    *s = r == LOOM_OK ? (loom_cuda_stream)st : NULL;
    return r;
}

void loom_cuda_stream_destroy(loom_cuda_stream s) {
    if (s) cudaStreamDestroy((cudaStream_t)s);
}

void loom_cuda_stream_set(loom_cuda_stream s) { lc_cur_stream = (cudaStream_t)s; }

loom_cuda_stream loom_cuda_stream_get(void) { return (loom_cuda_stream)lc_cur_stream; }

loom_status loom_cuda_stream_sync(loom_cuda_stream s) {
    return lc_status_of(cudaStreamSynchronize((cudaStream_t)s), "stream synchronize");
}

loom_status loom_cuda_event_create(loom_cuda_event *e) {
    cudaEvent_t ev = NULL;
    loom_status r = lc_status_of(cudaEventCreate(&ev), "event create");
    *e = r == LOOM_OK ? (loom_cuda_event)ev : NULL;
    return r;
}

void loom_cuda_event_destroy(loom_cuda_event e) {
    if (e) cudaEventDestroy((cudaEvent_t)e);
}

loom_status loom_cuda_event_record(loom_cuda_event e, loom_cuda_stream s) {
    return lc_status_of(cudaEventRecord((cudaEvent_t)e, (cudaStream_t)s), "event record");
}

loom_status loom_cuda_stream_wait_event(loom_cuda_stream s, loom_cuda_event e) {
    return lc_status_of(cudaStreamWaitEvent((cudaStream_t)s, (cudaEvent_t)e, 0), "stream wait event");
}

loom_status loom_cuda_event_sync(loom_cuda_event e) {
    return lc_status_of(cudaEventSynchronize((cudaEvent_t)e), "event synchronize");
}

loom_status loom_cuda_event_elapsed(float *ms, loom_cuda_event start, loom_cuda_event end) {
    *ms = 0.0f;
    return lc_status_of(cudaEventElapsedTime(ms, (cudaEvent_t)start, (cudaEvent_t)end), "event elapsed time");
}
