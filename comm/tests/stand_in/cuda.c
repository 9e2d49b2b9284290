/* CPU stand-in for the CUDA driver (libcuda.so.1), used only by comm/tests/nccl_stand_in.rs.
 *
 * It implements the few driver calls that cudarc and localsgd-comm's NCCL backend make, so that
 * the backend's own logic (buffers, copies, waits, subgroups, errors) can run on a machine
 * without a GPU. "Device memory" is host memory and every copy happens at once; a stream is
 * busy while a stand-in NCCL collective enqueued on it runs (stand_in.h). Stricter than needed
 * where it is cheap: memory calls and copies need a bound context, and every copy (and, through
 * stand_in_device_range_ok, every NCCL buffer) must lie inside one live allocation. It says
 * nothing about real GPUs: that is scripts/gpu-smoke's job.
 *
 * STAND_IN_GPUS sets how many devices it reports (default 2). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "stand_in.h"

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef void *CUstream;
typedef unsigned long long CUdeviceptr;

enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_INVALID_CONTEXT = 201,
    CUDA_ERROR_INVALID_DEVICE = 101,
    CUDA_ERROR_NOT_READY = 600,
};

static int gpus(void) {
    const char *s = getenv("STAND_IN_GPUS");
    return s ? atoi(s) : 2;
}

static char primary[64]; /* device d's primary context is &primary[d] */
static __thread CUcontext current;

/* Live allocations, to reject copies and NCCL buffers outside them. */
struct allocation { CUdeviceptr base; size_t bytes; struct allocation *next; };
static struct allocation *allocations;
static pthread_mutex_t allocations_lock = PTHREAD_MUTEX_INITIALIZER;

/* 1 when [p, p + bytes) lies inside one live allocation (exported for the stand-in NCCL). */
int stand_in_device_range_ok(const void *p, size_t bytes) {
    CUdeviceptr a = (CUdeviceptr)p;
    int ok = 0;
    pthread_mutex_lock(&allocations_lock);
    for (struct allocation *x = allocations; x; x = x->next)
        if (a >= x->base && bytes <= x->bytes && a - x->base <= x->bytes - bytes) { ok = 1; break; }
    pthread_mutex_unlock(&allocations_lock);
    return ok;
}

CUresult cuInit(unsigned flags) { (void)flags; return CUDA_SUCCESS; }
CUresult cuDriverGetVersion(int *v) { *v = 12080; return CUDA_SUCCESS; }
CUresult cuDeviceGetCount(int *n) { *n = gpus(); return CUDA_SUCCESS; }
CUresult cuDeviceGet(CUdevice *d, int ordinal) {
    if (ordinal < 0 || ordinal >= gpus() || ordinal >= 64) return CUDA_ERROR_INVALID_DEVICE;
    *d = ordinal;
    return CUDA_SUCCESS;
}
CUresult cuDeviceGetName(char *name, int len, CUdevice d) {
    snprintf(name, (size_t)len, "CPU stand-in device %d", d);
    return CUDA_SUCCESS;
}
CUresult cuDeviceGetAttribute(int *v, int attribute, CUdevice d) {
    (void)attribute; (void)d;
    *v = 0;
    return CUDA_SUCCESS;
}
CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d) { *c = &primary[d]; return CUDA_SUCCESS; }
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) { (void)d; return CUDA_SUCCESS; }
CUresult cuCtxGetCurrent(CUcontext *c) { *c = current; return CUDA_SUCCESS; }
CUresult cuCtxSetCurrent(CUcontext c) { current = c; return CUDA_SUCCESS; }
CUresult cuCtxSynchronize(void) { return CUDA_SUCCESS; }
CUresult cuStreamCreate(CUstream *s, unsigned flags) {
    (void)flags;
    if (!current) return CUDA_ERROR_INVALID_CONTEXT;
    *s = calloc(1, sizeof(struct stand_in_stream));
    return *s ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}
CUresult cuStreamDestroy_v2(CUstream s) { free(s); return CUDA_SUCCESS; }
CUresult cuStreamQuery(CUstream s) {
    return atomic_load(&((struct stand_in_stream *)s)->pending) ? CUDA_ERROR_NOT_READY
                                                                : CUDA_SUCCESS;
}
CUresult cuStreamSynchronize(CUstream s) {
    struct timespec nap = {0, 20000};
    while (atomic_load(&((struct stand_in_stream *)s)->pending)) nanosleep(&nap, NULL);
    return CUDA_SUCCESS;
}
CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t bytes) {
    if (!current) return CUDA_ERROR_INVALID_CONTEXT;
    struct allocation *x = malloc(sizeof *x);
    void *m = malloc(bytes ? bytes : 1);
    if (!m || !x) { free(m); free(x); return CUDA_ERROR_OUT_OF_MEMORY; }
    *p = x->base = (CUdeviceptr)m;
    x->bytes = bytes;
    pthread_mutex_lock(&allocations_lock);
    x->next = allocations;
    allocations = x;
    pthread_mutex_unlock(&allocations_lock);
    return CUDA_SUCCESS;
}
CUresult cuMemFree_v2(CUdeviceptr p) {
    if (!current) return CUDA_ERROR_INVALID_CONTEXT;
    struct allocation *found = NULL;
    pthread_mutex_lock(&allocations_lock);
    for (struct allocation **x = &allocations; *x; x = &(*x)->next)
        if ((*x)->base == p) { found = *x; *x = found->next; break; }
    pthread_mutex_unlock(&allocations_lock);
    if (!found) return CUDA_ERROR_INVALID_VALUE;
    free((void *)found->base);
    free(found);
    return CUDA_SUCCESS;
}
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr d, const void *h, size_t n, CUstream s) {
    (void)s;
    if (!current) return CUDA_ERROR_INVALID_CONTEXT;
    if (!stand_in_device_range_ok((const void *)d, n)) return CUDA_ERROR_INVALID_VALUE;
    memcpy((void *)d, h, n);
    return CUDA_SUCCESS;
}
CUresult cuMemcpyDtoHAsync_v2(void *h, CUdeviceptr d, size_t n, CUstream s) {
    (void)s;
    if (!current) return CUDA_ERROR_INVALID_CONTEXT;
    if (!stand_in_device_range_ok((const void *)d, n)) return CUDA_ERROR_INVALID_VALUE;
    memcpy(h, (const void *)d, n);
    return CUDA_SUCCESS;
}
CUresult cuGetErrorString(CUresult e, const char **s) { (void)e; *s = "stand-in driver error"; return CUDA_SUCCESS; }
CUresult cuGetErrorName(CUresult e, const char **s) { (void)e; *s = "CUDA_ERROR_STAND_IN"; return CUDA_SUCCESS; }
