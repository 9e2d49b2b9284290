/* CPU stand-in for NCCL (libnccl.so.2), used only by comm/tests/nccl_stand_in.rs.
 *
 * Ranks are separate processes (or threads), as with real NCCL. They exchange data through
 * files in STAND_IN_NCCL_DIR (default /dev/shm) and meet at barriers on a counter in a shared
 * mapping. As on a GPU, a collective is only enqueued: it runs on a thread and keeps its stream
 * busy (stand_in.h) until it is done; one that fails (a peer never came) stays busy, with the
 * error in ncclCommGetAsyncError, until the communicator is aborted. Reductions run in rank
 * order, accumulating in double. Compiled with -DNO_SPLIT it has no ncclCommSplit, like NCCL
 * before 2.18. Every buffer must lie inside memory of the stand-in driver
 * (stand_in_device_range_ok). It says nothing about real GPUs or real NCCL.
 *
 * STAND_IN_NCCL_VERSION sets what ncclGetVersion reports (default 22105, i.e. 2.21.5);
 * STAND_IN_NCCL_PATIENCE how many seconds a barrier waits for a missing peer before the
 * collective fails (default 900, longer than any collective timeout the tests set). */
#include <dlfcn.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "stand_in.h"

typedef struct { char internal[128]; } ncclUniqueId;

typedef struct comm {
    char name[200];
    int n, rank;
    unsigned long long seq;      /* exchanges so far on this communicator */
    unsigned long long barriers; /* barriers so far on this communicator */
    _Atomic unsigned long long *counter;
    _Atomic int aborted;
    _Atomic int async_error;
    pthread_t worker; /* the running or last collective */
    int has_worker;
    struct stand_in_stream *stuck; /* the stream of a failed collective, busy until abort */
    char last_error[512];
} comm_t;

enum { ok = 0, system_error = 2, internal_error = 3, invalid_argument = 4 };
enum { t_u8 = 1, t_u64 = 5, t_f16 = 6, t_f32 = 7, t_f64 = 8, t_bf16 = 9 };
enum { op_sum = 0, op_max = 2, op_min = 3 };

/* The last error of calls without a communicator, per thread; those of a communicator are
 * kept in it (a collective fails on its own thread, and ncclGetLastError asks later). */
static __thread char last_error[512];

static int fail_on(comm_t *c, int code, const char *what) {
    snprintf(c ? c->last_error : last_error, sizeof last_error, "stand-in NCCL: %s", what);
    return code;
}

static int fail(int code, const char *what) { return fail_on(NULL, code, what); }

/* The stand-in driver's check that a buffer is device memory, found in the instance cudarc
 * loaded (its soname is libcuda.so.1). Without the stand-in driver every buffer is refused. */
static int range_ok(const void *p, size_t bytes) {
    static int (*_Atomic check)(const void *, size_t);
    if (!check) {
        void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
        if (h) check = (int (*)(const void *, size_t))dlsym(h, "stand_in_device_range_ok");
    }
    return check && (bytes == 0 || check(p, bytes));
}

static const char *dir(void) {
    const char *d = getenv("STAND_IN_NCCL_DIR");
    return d ? d : "/dev/shm";
}

int ncclGetVersion(int *v) {
    const char *s = getenv("STAND_IN_NCCL_VERSION");
    *v = s ? atoi(s) : 22105;
    return ok;
}

const char *ncclGetErrorString(int rc) {
    switch (rc) {
    case ok: return "no error";
    case system_error: return "unhandled system error (stand-in)";
    case internal_error: return "internal error (stand-in)";
    case invalid_argument: return "invalid argument (stand-in)";
    default: return "unknown result code (stand-in)";
    }
}

const char *ncclGetLastError(comm_t *comm) { return comm ? comm->last_error : last_error; }

int ncclGetUniqueId(ncclUniqueId *id) {
    static _Atomic unsigned counter;
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    memset(id, 0, sizeof *id);
    snprintf(id->internal, sizeof id->internal, "sin-%d-%lld%09ld-%u", (int)getpid(),
             (long long)t.tv_sec, t.tv_nsec, atomic_fetch_add(&counter, 1));
    return ok;
}

static int open_comm(comm_t **out, const char *name, int n, int rank) {
    comm_t *c = calloc(1, sizeof *c);
    if (!c) return fail(system_error, "out of memory");
    snprintf(c->name, sizeof c->name, "%s", name);
    c->n = n;
    c->rank = rank;
    char path[512];
    snprintf(path, sizeof path, "%s/%s.ctr", dir(), c->name);
    int fd = open(path, O_RDWR | O_CREAT, 0600);
    if (fd < 0 || ftruncate(fd, 8) != 0) {
        free(c);
        return fail(system_error, "cannot create the barrier counter");
    }
    void *m = mmap(NULL, 8, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED) {
        free(c);
        return fail(system_error, "cannot map the barrier counter");
    }
    c->counter = m;
    *out = c;
    return ok;
}

/* Every rank waits until all n have arrived; gives up after 60 s (a peer died). */
static int barrier(comm_t *c) {
    unsigned long long b = ++c->barriers;
    atomic_fetch_add(c->counter, 1);
    struct timespec start, now, nap = {0, 20000};
    clock_gettime(CLOCK_MONOTONIC, &start);
    const char *p = getenv("STAND_IN_NCCL_PATIENCE");
    long patience = p ? atol(p) : 900;
    while (atomic_load(c->counter) < b * (unsigned long long)c->n) {
        if (atomic_load(&c->aborted)) return fail_on(c, system_error, "communicator aborted");
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (now.tv_sec - start.tv_sec > patience)
            return fail_on(c, system_error, "a peer never arrived");
        nanosleep(&nap, NULL);
    }
    return ok;
}

/* All-gather `bytes` from every rank into `all` (n * bytes), in rank order. */
static int exchange(comm_t *c, const void *mine, size_t bytes, char *all) {
    unsigned long long seq = ++c->seq;
    char path[512];
    snprintf(path, sizeof path, "%s/%s.%llu.%d", dir(), c->name, seq, c->rank);
    FILE *f = fopen(path, "wb");
    if (!f) return fail_on(c, system_error, "cannot write the exchange file");
    size_t w = bytes ? fwrite(mine, 1, bytes, f) : 0;
    if (fclose(f) != 0 || w != bytes) return fail_on(c, system_error, "short write");
    int rc = barrier(c);
    if (rc != ok) return rc;
    for (int r = 0; r < c->n; r++) {
        char peer[512];
        snprintf(peer, sizeof peer, "%s/%s.%llu.%d", dir(), c->name, seq, r);
        FILE *p = fopen(peer, "rb");
        if (!p) return fail_on(c, system_error, "a peer's exchange file is missing");
        long size = fseek(p, 0, SEEK_END) == 0 ? ftell(p) : -1;
        rewind(p);
        size_t got = bytes ? fread(all + (size_t)r * bytes, 1, bytes, p) : 0;
        fclose(p);
        if (size != (long)bytes || got != bytes)
            return fail_on(c, invalid_argument, "peers passed different sizes");
    }
    rc = barrier(c);
    unlink(path);
    return rc;
}

static size_t type_size(int t) {
    switch (t) {
    case t_u64: case t_f64: return 8;
    case t_f32: return 4;
    case t_f16: case t_bf16: return 2;
    case t_u8: return 1;
    default: return 0;
    }
}

static double f16_to_double(uint16_t h) {
    int e = (h >> 10) & 31, m = h & 1023;
    double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(m + 1024, e - 25);
    return (h & 0x8000) ? -v : v;
}

static uint16_t double_to_f16(double d) {
    uint16_t sign = signbit(d) ? 0x8000 : 0;
    d = fabs(d);
    if (isnan(d)) return 0x7e00;
    if (d >= 65520.0) return sign | 0x7c00;
    if (d < ldexp(1, -14)) return sign | (uint16_t)nearbyint(ldexp(d, 24)); /* subnormal */
    int e;
    double fr = frexp(d, &e); /* d = fr * 2^e, fr in [0.5, 1) */
    long m = lrint(ldexp(fr, 11));  /* 11 significant bits, round to nearest even */
    if (m == 2048) { m = 1024; e++; }
    return sign | (uint16_t)(((e + 14) << 10) | (m - 1024));
}

static double bf16_to_double(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint16_t double_to_bf16(double d) {
    float f = (float)d;
    uint32_t u;
    memcpy(&u, &f, 4);
    if (isnan(f)) return 0x7fc0;
    u += 0x7fff + ((u >> 16) & 1); /* round to nearest even */
    return (uint16_t)(u >> 16);
}

static double load(int t, const char *p) {
    switch (t) {
    case t_u64: { uint64_t v; memcpy(&v, p, 8); return (double)v; }
    case t_f64: { double v; memcpy(&v, p, 8); return v; }
    case t_f32: { float v; memcpy(&v, p, 4); return v; }
    case t_f16: { uint16_t v; memcpy(&v, p, 2); return f16_to_double(v); }
    default: { uint16_t v; memcpy(&v, p, 2); return bf16_to_double(v); }
    }
}

static void store(int t, char *p, double d) {
    switch (t) {
    case t_f64: memcpy(p, &d, 8); break;
    case t_f32: { float v = (float)d; memcpy(p, &v, 4); break; }
    case t_f16: { uint16_t v = double_to_f16(d); memcpy(p, &v, 2); break; }
    default: { uint16_t v = double_to_bf16(d); memcpy(p, &v, 2); break; }
    }
}

int ncclCommInitRank(comm_t **comm, int n, ncclUniqueId id, int rank) {
    if (n < 1 || rank < 0 || rank >= n) return fail(invalid_argument, "bad rank or size");
    id.internal[127] = 0;
    int rc = open_comm(comm, id.internal, n, rank);
    return rc == ok ? barrier(*comm) : rc;
}

static void join_worker(comm_t *c) {
    if (c->has_worker) {
        pthread_join(c->worker, NULL);
        c->has_worker = 0;
    }
}

static void close_comm(comm_t *c) {
    if (!c) return;
    join_worker(c);
    if (c->stuck) atomic_fetch_sub(&c->stuck->pending, 1);
    munmap((void *)c->counter, 8);
    free(c);
}

int ncclCommDestroy(comm_t *c) { close_comm(c); return ok; }
int ncclCommAbort(comm_t *c) {
    if (c) atomic_store(&c->aborted, 1);
    close_comm(c);
    return ok;
}
int ncclCommGetAsyncError(comm_t *c, int *rc) { *rc = atomic_load(&c->async_error); return ok; }

enum { k_all_reduce, k_broadcast, k_all_gather };

struct job {
    comm_t *c;
    int kind, type, op, root;
    const void *send;
    void *recv;
    size_t count;
    struct stand_in_stream *stream;
};

static int all_reduce(struct job *j) {
    comm_t *c = j->c;
    size_t es = type_size(j->type), count = j->count, bytes = count * es;
    char *all = malloc(bytes * (size_t)c->n + 1);
    if (!all) return fail_on(c, system_error, "out of memory");
    int rc = exchange(c, j->send, bytes, all);
    for (size_t i = 0; rc == ok && i < count; i++) {
        if (j->type == t_u64) {
            uint64_t acc, v;
            memcpy(&acc, all + i * 8, 8);
            for (int r = 1; r < c->n; r++) {
                memcpy(&v, all + (size_t)r * bytes + i * 8, 8);
                acc = j->op == op_sum ? acc + v : j->op == op_max ? (v > acc ? v : acc)
                                                                  : (v < acc ? v : acc);
            }
            memcpy((char *)j->recv + i * 8, &acc, 8);
            continue;
        }
        double acc = load(j->type, all + i * es);
        for (int r = 1; r < c->n; r++) {
            double v = load(j->type, all + (size_t)r * bytes + i * es);
            acc = j->op == op_sum ? acc + v : j->op == op_max ? fmax(acc, v) : fmin(acc, v);
        }
        store(j->type, (char *)j->recv + i * es, acc);
    }
    free(all);
    return rc;
}

static int broadcast(struct job *j) {
    comm_t *c = j->c;
    size_t bytes = j->count * type_size(j->type);
    char *all = malloc(bytes * (size_t)c->n + 1);
    if (!all) return fail_on(c, system_error, "out of memory");
    /* Non-roots send their (ignored) receive buffer: sizes must still agree. */
    int rc = exchange(c, c->rank == j->root ? j->send : j->recv, bytes, all);
    if (rc == ok) memcpy(j->recv, all + (size_t)j->root * bytes, bytes);
    free(all);
    return rc;
}

static void *run_job(void *arg) {
    struct job *j = arg;
    comm_t *c = j->c;
    int rc = j->kind == k_all_reduce ? all_reduce(j)
             : j->kind == k_broadcast ? broadcast(j)
                                      : exchange(c, j->send, j->count * type_size(j->type), j->recv);
    if (rc == ok) {
        atomic_fetch_sub(&j->stream->pending, 1);
    } else {
        atomic_store(&c->async_error, rc);
        c->stuck = j->stream;
    }
    free(j);
    return NULL;
}

/* Check the arguments now (as NCCL does), then run the collective on a thread. */
static int enqueue(struct job j) {
    comm_t *c = j.c;
    size_t es = type_size(j.type), bytes = j.count * es;
    if (!es) return fail_on(c, invalid_argument, "unknown datatype");
    if (j.kind == k_all_reduce && j.op != op_sum && j.op != op_max && j.op != op_min)
        return fail_on(c, invalid_argument, "unknown reduction");
    if (j.kind == k_broadcast && (j.root < 0 || j.root >= c->n))
        return fail_on(c, invalid_argument, "bad root");
    if (!j.stream) return fail_on(c, invalid_argument, "the stand-in needs a stream");
    size_t out = j.kind == k_all_gather ? bytes * (size_t)c->n : bytes;
    if (!range_ok(j.send, bytes) || !range_ok(j.recv, out))
        return fail_on(c, invalid_argument,
                       "a buffer is not (all) device memory of the stand-in driver");
    join_worker(c); /* stream order: the previous collective is done */
    if (atomic_load(&c->aborted) || c->stuck)
        return fail_on(c, invalid_argument, "communicator failed earlier");
    struct job *h = malloc(sizeof *h);
    if (!h) return fail_on(c, system_error, "out of memory");
    *h = j;
    atomic_fetch_add(&j.stream->pending, 1);
    if (pthread_create(&c->worker, NULL, run_job, h) != 0) {
        atomic_fetch_sub(&j.stream->pending, 1);
        free(h);
        return fail_on(c, system_error, "cannot start the collective's thread");
    }
    c->has_worker = 1;
    return ok;
}

int ncclAllReduce(const void *send, void *recv, size_t count, int type, int op, comm_t *c,
                  void *stream) {
    struct job j = {c, k_all_reduce, type, op, 0, send, recv, count, stream};
    return enqueue(j);
}

int ncclBroadcast(const void *send, void *recv, size_t count, int type, int root, comm_t *c,
                  void *stream) {
    struct job j = {c, k_broadcast, type, 0, root, send, recv, count, stream};
    return enqueue(j);
}

int ncclAllGather(const void *send, void *recv, size_t count, int type, comm_t *c, void *stream) {
    struct job j = {c, k_all_gather, type, 0, 0, send, recv, count, stream};
    return enqueue(j);
}

#ifndef NO_SPLIT
int ncclCommSplit(comm_t *c, int color, int key, comm_t **out, void *config) {
    (void)config;
    join_worker(c);
    int mine[2] = {color, key};
    int *all = malloc(sizeof mine * (size_t)c->n);
    if (!all) return fail(system_error, "out of memory");
    int rc = exchange(c, mine, sizeof mine, (char *)all);
    if (rc != ok || color < 0) { /* NCCL_SPLIT_NOCOLOR is -1 */
        free(all);
        *out = NULL;
        return rc;
    }
    int n = 0, rank = 0;
    for (int r = 0; r < c->n; r++) {
        if (all[2 * r] != color) continue;
        n++;
        /* order by key, then by parent rank */
        if (all[2 * r + 1] < key || (all[2 * r + 1] == key && r < c->rank)) rank++;
    }
    free(all);
    char name[200];
    snprintf(name, sizeof name, "%s.s%lluc%d", c->name, c->seq, color);
    rc = open_comm(out, name, n, rank);
    return rc == ok ? barrier(*out) : rc;
}
#endif
