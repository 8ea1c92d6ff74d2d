/*
 * fake_cuda.c - a fake libcuda.so.1 for libvgpu's tests (see fakecuda.h). It keeps the
 * driver's contracts that libvgpu depends on: error codes for NULL and zero arguments,
 * OUT_OF_MEMORY at the device's size, cuGetProcAddress's version and per-thread-stream
 * rules, asynchronous launches with a bounded queue. Internal calls go to static
 * functions, never through exported symbols (which libvgpu interposes).
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fake_dev.h"
#include "fakecuda.h"
#include "vg_cuda.h"

#define FX __attribute__((visibility("default")))
struct CUctx_st { int dev; };
struct CUfunc_st { uint64_t ns; };
struct CUmod_st { int unused; };
/* A stream-ordered pool keeps up to its release threshold of freed memory (`retained`,
 * still used on the device) and hands it out again before taking more. */
struct CUmemPoolHandle_st { int dev, is_default; uint64_t threshold, retained; };
static struct CUmemPoolHandle_st default_pools[MAXDEV];
static CUmemoryPool current_pools[MAXDEV]; /* NULL: the default pool */
static pthread_mutex_t pool_mu = PTHREAD_MUTEX_INITIALIZER;
struct CUarray_st { int dev; uint64_t bytes; };

static fdev local_devs[MAXDEV];
/* Device i's state: local, an entry of the FAKECUDA_SHARED array, or a card's own file. */
static fdev *dev_of[MAXDEV];
#define devs_at(i) (dev_of[(i)])
static uint64_t my_pidns;
static struct CUctx_st ctxs[MAXDEV];
static int ndev = 2, inited = 0;
/* When this process's own last kernel on each device ends: an event waits for its own
 * context's work only, as on a real GPU where contexts of processes time-slice. */
static uint64_t mine_until[MAXDEV];
static uint64_t queue_ns = 30000000;
static uint64_t alloc_calls, sync_calls;
static __thread CUcontext cur;
static pthread_once_t once = PTHREAD_ONCE_INIT;

/* Allocations: address -> (bytes, dev). A simple locked list is plenty for tests. */
typedef struct alloc { uint64_t key, bytes; int dev, device_mem; struct CUmemPoolHandle_st *pool; struct alloc *next; } alloc;
static alloc *allocs;
static pthread_mutex_t alloc_mu = PTHREAD_MUTEX_INITIALIZER;
static uint64_t next_addr = 0x7f0000000000ull, next_low = 0x10000000ull, next_handle = 1;
enum { ADDR = 0, HANDLE = 1, LOW_ADDR = 2 }; /* what mem_add hands out */

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void sleep_until(uint64_t t) {
    struct timespec ts = {(time_t)(t / 1000000000ull), (long)(t % 1000000000ull)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) != 0) {
    }
}

static unsigned char uuids[MAXDEV][16];
static char uuid_text[MAXDEV][48];

/* Map n devices from fd at offset off (under flock), initialising those not yet ready. */
static fdev *map_devs(int fd, int n, uint64_t mib) {
    if (flock(fd, LOCK_EX) != 0) abort();
    struct stat st;
    fstat(fd, &st);
    if ((size_t)st.st_size < sizeof(fdev) * (size_t)n && ftruncate(fd, (off_t)(sizeof(fdev) * (size_t)n)) != 0)
        abort();
    fdev *m = mmap(NULL, sizeof(fdev) * (size_t)n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) abort();
    for (int i = 0; i < n; i++) {
        if (m[i].ready == FDEV_READY) continue;
        pthread_mutexattr_t a;
        pthread_mutexattr_init(&a);
        pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
        pthread_mutex_init(&m[i].mu, &a);
        if (m[i].total == 0) m[i].total = mib << 20; /* the host may have set the card's size */
        m[i].ready = FDEV_READY;
    }
    flock(fd, LOCK_UN);
    close(fd);
    return m;
}

static void setup(void) {
    const char *e = getenv("FAKECUDA_DEVICES");
    if (e) ndev = atoi(e) < 1 ? 1 : atoi(e) > MAXDEV ? MAXDEV : atoi(e);
    int visible = fdev_visible_cards(uuids, uuid_text);
    if (visible > 0) ndev = visible;
    uint64_t mib = 16384;
    if ((e = getenv("FAKECUDA_MEM_MIB"))) mib = strtoull(e, NULL, 10);
    if ((e = getenv("FAKECUDA_QUEUE_NS"))) queue_ns = strtoull(e, NULL, 10);
    const char *dir = getenv("FAKECUDA_DEVICE_DIR");
    const char *shared = getenv("FAKECUDA_SHARED");
    for (int i = 0; i < MAXDEV; i++) {
        ctxs[i].dev = i;
        dev_of[i] = &local_devs[i];
    }
    if (dir && dir[0]) {
        /* One file per physical card: every process on the node that sees the card shares
         * its timeline, its memory and its process table. */
        for (int i = 0; i < ndev; i++) {
            char path[512];
            snprintf(path, sizeof path, "%s/%s", dir, uuid_text[i]);
            int fd = open(path, O_RDWR | O_CREAT, 0666);
            if (fd < 0) abort();
            dev_of[i] = map_devs(fd, 1, mib);
        }
    } else if (shared && shared[0]) {
        /* Processes that name the same file share the devices' timelines, as processes on
         * one real GPU do: their kernels take turns. */
        int fd = open(shared, O_RDWR | O_CREAT, 0600);
        if (fd < 0) abort();
        fdev *m = map_devs(fd, MAXDEV, mib);
        for (int i = 0; i < MAXDEV; i++) dev_of[i] = &m[i];
    } else {
        for (int i = 0; i < MAXDEV; i++) {
            pthread_mutexattr_t a;
            pthread_mutexattr_init(&a);
            pthread_mutex_init(&local_devs[i].mu, &a);
            local_devs[i].total = mib << 20;
            local_devs[i].ready = FDEV_READY;
        }
    }
    struct stat ns;
    my_pidns = stat("/proc/self/ns/pid", &ns) == 0 ? (uint64_t)ns.st_ino : 0;
}

/* Field 22 of /proc/self/stat: when this process started, in clock ticks since boot. */
static uint64_t my_start_time(void) {
    char buf[1024];
    int fd = open("/proc/self/stat", O_RDONLY);
    if (fd < 0) return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return 0;
    buf[n] = 0;
    char *p = strrchr(buf, ')'); /* the command name may hold spaces */
    if (p == NULL) return 0;
    for (int field = 2; field < 22 && p != NULL; field++) p = strchr(p + 1, ' ');
    return p != NULL ? strtoull(p + 1, NULL, 10) : 0;
}

/* This process's entry in d's process table (claimed on first use); d->mu held. An entry
 * with this pid and pid namespace but another start time belongs to a process that is
 * gone (the namespace inode and the pid were reused): its memory is freed, as the driver
 * frees a dead process's memory, and the entry is taken over. */
static fproc *my_proc(fdev *d) {
    static int cached_pid;
    static uint64_t cached_start;
    int pid = (int)getpid();
    if (pid != cached_pid) { /* first use, or a forked child */
        cached_start = my_start_time();
        cached_pid = pid;
    }
    fproc *free_slot = NULL;
    for (int i = 0; i < FPROC_MAX; i++) {
        fproc *p = &d->procs[i];
        if (p->pid == pid && p->pidns == my_pidns) {
            if (p->start == cached_start) return p;
            d->used -= p->bytes; /* a dead namesake's leftovers */
            p->bytes = 0;
            p->start = cached_start;
            return p;
        }
        if (free_slot == NULL && p->bytes == 0) free_slot = p;
    }
    if (free_slot != NULL) {
        free_slot->pid = pid;
        free_slot->pidns = my_pidns;
        free_slot->start = cached_start;
    }
    return free_slot;
}

/* A process that exits returns its device memory, as with a real driver. One that is
 * killed keeps its table entry: the host-side reader skips processes that are gone. */
__attribute__((destructor)) static void release_memory(void) {
    if (!inited) return;
    for (int i = 0; i < ndev; i++) {
        fdev *d = dev_of[i];
        if (d == NULL || d == &local_devs[i]) continue;
        pthread_mutex_lock(&d->mu);
        for (int k = 0; k < FPROC_MAX; k++) {
            fproc *p = &d->procs[k];
            if (p->pid == (int)getpid() && p->pidns == my_pidns) {
                d->used -= p->bytes;
                p->bytes = 0;
                p->pid = 0;
            }
        }
        pthread_mutex_unlock(&d->mu);
    }
}

/* Charge delta bytes to d and to this process; 0 (nothing charged) past the card's size. */
static int account(fdev *d, int64_t delta) {
    pthread_mutex_lock(&d->mu);
    if (delta > 0 && d->used + (uint64_t)delta > d->total) {
        pthread_mutex_unlock(&d->mu);
        return 0;
    }
    d->used += (uint64_t)delta;
    if (d->used > d->peak) d->peak = d->used;
    fproc *p = my_proc(d);
    if (p != NULL) p->bytes += (uint64_t)delta;
    pthread_mutex_unlock(&d->mu);
    return 1;
}

static int cur_dev(void) { return cur ? cur->dev : -1; }

/* ---- memory ---- */

static CUresult mem_add(unsigned long long *out, uint64_t bytes, int dev, int device_mem, int kind) {
    if (out == NULL || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
    if (!inited) return CUDA_ERROR_NOT_INITIALIZED;
    if (dev < 0) return CUDA_ERROR_INVALID_CONTEXT;
    if (dev >= ndev) return CUDA_ERROR_INVALID_DEVICE;
    __atomic_fetch_add(&alloc_calls, 1, __ATOMIC_RELAXED);
    fdev *d = devs_at(dev);
    pthread_mutex_lock(&alloc_mu);
    if (device_mem && !account(d, (int64_t)bytes)) {
        pthread_mutex_unlock(&alloc_mu);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    alloc *a = malloc(sizeof *a);
    uint64_t *next = kind == HANDLE ? &next_handle : kind == LOW_ADDR ? &next_low : &next_addr;
    a->key = *next;
    *next += kind == HANDLE ? 1 : (bytes + 0xfff) & ~0xfffull;
    a->bytes = bytes;
    a->dev = dev;
    a->device_mem = device_mem;
    a->pool = NULL;
    a->next = allocs;
    allocs = a;
    *out = a->key;
    pthread_mutex_unlock(&alloc_mu);
    return CUDA_SUCCESS;
}

static CUresult mem_del(uint64_t key) {
    if (!inited) return CUDA_ERROR_NOT_INITIALIZED;
    if (key == 0) return CUDA_SUCCESS;
    pthread_mutex_lock(&alloc_mu);
    for (alloc **p = &allocs; *p; p = &(*p)->next) {
        if ((*p)->key == key) {
            alloc *a = *p;
            *p = a->next;
            if (a->device_mem) account(devs_at(a->dev), -(int64_t)a->bytes);
            pthread_mutex_unlock(&alloc_mu);
            free(a);
            return CUDA_SUCCESS;
        }
    }
    pthread_mutex_unlock(&alloc_mu);
    return CUDA_ERROR_INVALID_VALUE;
}

FX CUresult cuInit(unsigned int flags) {
    pthread_once(&once, setup);
    if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
    inited = 1;
    return CUDA_SUCCESS;
}
FX CUresult cuDriverGetVersion(int *v) {
    if (!v) return CUDA_ERROR_INVALID_VALUE;
    const char *e = getenv("FAKECUDA_DRIVER_VERSION"); /* e.g. 13000 for a CUDA 13 runtime */
    *v = e && atoi(e) > 0 ? atoi(e) : 12040;
    return CUDA_SUCCESS;
}
FX CUresult cuDeviceGetCount(int *n) {
    if (!n) return CUDA_ERROR_INVALID_VALUE;
    if (!inited) return CUDA_ERROR_NOT_INITIALIZED;
    *n = ndev;
    return CUDA_SUCCESS;
}
FX CUresult cuDeviceGet(CUdevice *d, int ordinal) {
    if (!d) return CUDA_ERROR_INVALID_VALUE;
    if (!inited) return CUDA_ERROR_NOT_INITIALIZED;
    if (ordinal < 0 || ordinal >= ndev) return CUDA_ERROR_INVALID_DEVICE;
    *d = ordinal;
    return CUDA_SUCCESS;
}
FX CUresult cuDeviceGetUuid(CUuuid *u, CUdevice dev) {
    if (!u) return CUDA_ERROR_INVALID_VALUE;
    if (!inited) return CUDA_ERROR_NOT_INITIALIZED;
    if (dev < 0 || dev >= ndev) return CUDA_ERROR_INVALID_DEVICE;
    memcpy(u->bytes, uuids[dev], 16);
    return CUDA_SUCCESS;
}
static CUresult total_mem(size_t *b, CUdevice dev) {
    if (!b) return CUDA_ERROR_INVALID_VALUE;
    if (!inited) return CUDA_ERROR_NOT_INITIALIZED;
    if (dev < 0 || dev >= ndev) return CUDA_ERROR_INVALID_DEVICE;
    *b = devs_at(dev)->total;
    return CUDA_SUCCESS;
}
FX CUresult cuDeviceTotalMem_v2(size_t *b, CUdevice dev) { return total_mem(b, dev); }
FX CUresult cuDeviceTotalMem(unsigned int *b, CUdevice dev) {
    size_t v = 0;
    CUresult r = total_mem(b ? &v : NULL, dev);
    if (r == CUDA_SUCCESS) *b = v > 0xffffffffu ? 0xffffffffu : (unsigned int)v;
    return r;
}
/* Contexts: the primary context of each device (retained and released by count) and
 * created ones (cuCtxCreate*, current on return as the driver makes them), green ones. */
static int primary_refs[MAXDEV];
static pthread_mutex_t ctx_mu = PTHREAD_MUTEX_INITIALIZER;
FX CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice dev) {
    if (!c) return CUDA_ERROR_INVALID_VALUE;
    if (!inited) return CUDA_ERROR_NOT_INITIALIZED;
    if (dev < 0 || dev >= ndev) return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&ctx_mu);
    primary_refs[dev]++;
    pthread_mutex_unlock(&ctx_mu);
    *c = &ctxs[dev];
    return CUDA_SUCCESS;
}
static CUresult primary_release(CUdevice dev, int reset) {
    if (!inited) return CUDA_ERROR_NOT_INITIALIZED;
    if (dev < 0 || dev >= ndev) return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&ctx_mu);
    CUresult r = CUDA_SUCCESS;
    if (reset) primary_refs[dev] = 0;
    else if (primary_refs[dev] == 0) r = CUDA_ERROR_INVALID_CONTEXT;
    else primary_refs[dev]--;
    pthread_mutex_unlock(&ctx_mu);
    return r;
}
FX CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) { return primary_release(dev, 0); }
FX CUresult cuDevicePrimaryCtxRelease(CUdevice dev) { return primary_release(dev, 0); }
FX CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev) { return primary_release(dev, 1); }
FX CUresult cuDevicePrimaryCtxReset(CUdevice dev) { return primary_release(dev, 1); }
static CUresult ctx_create(CUcontext *c, unsigned int flags, CUdevice dev) {
    if (!c || flags > 0x1f) return CUDA_ERROR_INVALID_VALUE;
    if (!inited) return CUDA_ERROR_NOT_INITIALIZED;
    if (dev < 0 || dev >= ndev) return CUDA_ERROR_INVALID_DEVICE;
    *c = calloc(1, sizeof **c);
    (*c)->dev = dev;
    cur = *c;
    return CUDA_SUCCESS;
}
FX CUresult cuCtxCreate_v2(CUcontext *c, unsigned int flags, CUdevice dev) { return ctx_create(c, flags, dev); }
FX CUresult cuCtxCreate(CUcontext *c, unsigned int flags, CUdevice dev) { return ctx_create(c, flags, dev); }
FX CUresult cuCtxCreate_v3(CUcontext *c, CUexecAffinityParam *p, int n, unsigned int flags, CUdevice dev) {
    if (n < 0 || (n > 0 && !p)) return CUDA_ERROR_INVALID_VALUE;
    return ctx_create(c, flags, dev);
}
FX CUresult cuCtxCreate_v4(CUcontext *c, CUctxCreateParams *p, unsigned int flags, CUdevice dev) {
    (void)p;
    return ctx_create(c, flags, dev);
}
static int is_primary(CUcontext c) { return c >= ctxs && c < ctxs + MAXDEV; }
FX CUresult cuCtxDestroy_v2(CUcontext c) {
    if (!c || is_primary(c)) return CUDA_ERROR_INVALID_CONTEXT;
    if (cur == c) cur = NULL;
    free(c);
    return CUDA_SUCCESS;
}
FX CUresult cuCtxDestroy(CUcontext c) { return cuCtxDestroy_v2(c); }
struct CUgreenCtx_st { int dev; };
FX CUresult cuGreenCtxCreate(CUgreenCtx *g, CUdevResourceDesc desc, CUdevice dev, unsigned int flags) {
    if (!g || !desc || flags != 1) return CUDA_ERROR_INVALID_VALUE; /* CU_GREEN_CTX_DEFAULT_STREAM */
    if (!inited) return CUDA_ERROR_NOT_INITIALIZED;
    if (dev < 0 || dev >= ndev) return CUDA_ERROR_INVALID_DEVICE;
    *g = calloc(1, sizeof **g);
    (*g)->dev = dev;
    return CUDA_SUCCESS;
}
FX CUresult cuGreenCtxDestroy(CUgreenCtx g) {
    if (!g) return CUDA_ERROR_INVALID_HANDLE;
    free(g);
    return CUDA_SUCCESS;
}
FX CUresult cuCtxSetCurrent(CUcontext c) {
    cur = c;
    return CUDA_SUCCESS;
}
FX CUresult cuCtxGetCurrent(CUcontext *c) {
    if (!c) return CUDA_ERROR_INVALID_VALUE;
    *c = cur;
    return CUDA_SUCCESS;
}
FX CUresult cuCtxGetDevice(CUdevice *d) {
    if (!d) return CUDA_ERROR_INVALID_VALUE;
    if (!cur) return CUDA_ERROR_INVALID_CONTEXT;
    *d = cur->dev;
    return CUDA_SUCCESS;
}
static CUresult mem_info(size_t *f, size_t *t) {
    if (!f || !t) return CUDA_ERROR_INVALID_VALUE;
    if (!cur) return CUDA_ERROR_INVALID_CONTEXT;
    pthread_mutex_lock(&alloc_mu);
    *f = devs_at(cur->dev)->total - devs_at(cur->dev)->used;
    *t = devs_at(cur->dev)->total;
    pthread_mutex_unlock(&alloc_mu);
    return CUDA_SUCCESS;
}
FX CUresult cuMemGetInfo_v2(size_t *f, size_t *t) { return mem_info(f, t); }
FX CUresult cuMemGetInfo(unsigned int *f, unsigned int *t) {
    size_t a = 0, b = 0;
    CUresult r = mem_info(f ? &a : NULL, t ? &b : NULL);
    if (r == CUDA_SUCCESS) {
        *f = a > 0xffffffffu ? 0xffffffffu : (unsigned int)a;
        *t = b > 0xffffffffu ? 0xffffffffu : (unsigned int)b;
    }
    return r;
}

static CUresult alloc_v2(CUdeviceptr *p, size_t n) { return mem_add(p, n, cur_dev(), 1, 0); }
static CUresult unsafe_check(void);
/* cuMemAlloc may synchronise: a "potentially unsafe" call during capture. */
FX CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) {
    CUresult r = unsafe_check();
    return r != CUDA_SUCCESS ? r : alloc_v2(p, n);
}
FX CUresult cuMemAlloc(CUdeviceptr_v1 *p, unsigned int n) {
    unsigned long long v = 0;
    CUresult r = mem_add(p ? &v : NULL, n, cur_dev(), 1, LOW_ADDR);
    if (r == CUDA_SUCCESS) *p = (CUdeviceptr_v1)v;
    return r;
}
static size_t pitch_of(size_t w) { return (w + 511) & ~(size_t)511; }
FX CUresult cuMemAllocPitch_v2(CUdeviceptr *p, size_t *pitch, size_t w, size_t h, unsigned e) {
    if (!pitch || w == 0 || h == 0 || (e != 4 && e != 8 && e != 16)) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = mem_add(p, pitch_of(w) * h, cur_dev(), 1, 0);
    if (r == CUDA_SUCCESS) *pitch = pitch_of(w);
    return r;
}
FX CUresult cuMemAllocPitch(CUdeviceptr_v1 *p, unsigned int *pitch, unsigned int w, unsigned int h,
                            unsigned e) {
    (void)p, (void)pitch, (void)w, (void)h, (void)e;
    return CUDA_ERROR_NOT_SUPPORTED;
}
FX CUresult cuMemAllocManaged(CUdeviceptr *p, size_t n, unsigned flags) {
    if (flags != 1 && flags != 2) return CUDA_ERROR_INVALID_VALUE;
    return mem_add(p, n, cur_dev(), 1, 0);
}
FX CUresult cuMemFree_v2(CUdeviceptr p) { return mem_del(p); }
FX CUresult cuMemFree(CUdeviceptr_v1 p) { return mem_del(p); }
static CUmemoryPool default_pool(int dev) {
    default_pools[dev].dev = dev;
    default_pools[dev].is_default = 1;
    return &default_pools[dev];
}
/* n bytes from pool: its retained memory first (already used on the device), then more. */
static CUresult pool_alloc(CUdeviceptr *p, size_t n, CUmemoryPool pool) {
    if (!pool || !p || n == 0) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&pool_mu);
    uint64_t reuse = pool->retained < n ? pool->retained : n;
    pool->retained -= reuse;
    account(devs_at(pool->dev), -(int64_t)reuse); /* mem_add charges all n again */
    CUresult r = mem_add(p, n, pool->dev, 1, 0);
    if (r != CUDA_SUCCESS) {
        account(devs_at(pool->dev), (int64_t)reuse);
        pool->retained += reuse;
    } else {
        pthread_mutex_lock(&alloc_mu);
        for (alloc *a = allocs; a; a = a->next)
            if (a->key == *p) a->pool = pool;
        pthread_mutex_unlock(&alloc_mu);
    }
    pthread_mutex_unlock(&pool_mu);
    return r;
}
static int capture_alloc(CUstream s, int ptsz, uint64_t n);
static CUresult async_alloc(CUdeviceptr *p, size_t n, CUstream s, int ptsz) {
    int dev = cur_dev();
    if (dev < 0) return CUDA_ERROR_INVALID_CONTEXT;
    if (p && n && capture_alloc(s, ptsz, n)) /* a memory node of the capture's graph */
        return mem_add(p, n, dev, 0, 0);
    return pool_alloc(p, n, current_pools[dev] ? current_pools[dev] : default_pool(dev));
}
/* A free: pool memory goes back to its pool, which keeps it up to its threshold. */
static CUresult async_free(CUdeviceptr key) {
    pthread_mutex_lock(&pool_mu);
    pthread_mutex_lock(&alloc_mu);
    alloc *a = allocs;
    while (a && a->key != key) a = a->next;
    struct CUmemPoolHandle_st *pool = a ? a->pool : NULL;
    uint64_t keep = 0;
    if (pool) {
        uint64_t room = pool->threshold > pool->retained ? pool->threshold - pool->retained : 0;
        keep = a->bytes < room ? a->bytes : room;
    }
    pthread_mutex_unlock(&alloc_mu);
    CUresult r = mem_del(key);
    if (r == CUDA_SUCCESS && keep) {
        account(devs_at(pool->dev), (int64_t)keep); /* still the pool's */
        pool->retained += keep;
    }
    pthread_mutex_unlock(&pool_mu);
    return r;
}
static void pool_release_to(CUmemoryPool pool, uint64_t keep) {
    if (pool->retained > keep) {
        account(devs_at(pool->dev), -(int64_t)(pool->retained - keep));
        pool->retained = keep;
    }
}
FX CUresult cuMemAllocAsync(CUdeviceptr *p, size_t n, CUstream s) { return async_alloc(p, n, s, 0); }
FX CUresult cuMemAllocAsync_ptsz(CUdeviceptr *p, size_t n, CUstream s) { return async_alloc(p, n, s, 1); }
FX CUresult cuMemAllocFromPoolAsync(CUdeviceptr *p, size_t n, CUmemoryPool pool, CUstream s) {
    (void)s;
    return pool_alloc(p, n, pool);
}
FX CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *p, size_t n, CUmemoryPool pool, CUstream s) {
    (void)s;
    return pool_alloc(p, n, pool);
}
FX CUresult cuMemFreeAsync(CUdeviceptr p, CUstream s) { (void)s; return async_free(p); }
FX CUresult cuMemFreeAsync_ptsz(CUdeviceptr p, CUstream s) { (void)s; return async_free(p); }
FX CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool, CUdevice dev) {
    if (!pool) return CUDA_ERROR_INVALID_VALUE;
    if (!inited) return CUDA_ERROR_NOT_INITIALIZED;
    if (dev < 0 || dev >= ndev) return CUDA_ERROR_INVALID_DEVICE;
    *pool = default_pool(dev);
    return CUDA_SUCCESS;
}
FX CUresult cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice dev) {
    if (!pool) return CUDA_ERROR_INVALID_VALUE;
    if (!inited) return CUDA_ERROR_NOT_INITIALIZED;
    if (dev < 0 || dev >= ndev) return CUDA_ERROR_INVALID_DEVICE;
    *pool = current_pools[dev] ? current_pools[dev] : default_pool(dev);
    return CUDA_SUCCESS;
}
FX CUresult cuDeviceSetMemPool(CUdevice dev, CUmemoryPool pool) {
    if (!pool) return CUDA_ERROR_INVALID_VALUE;
    if (dev < 0 || dev >= ndev || pool->dev != dev) return CUDA_ERROR_INVALID_DEVICE;
    current_pools[dev] = pool;
    return CUDA_SUCCESS;
}
FX CUresult cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value) {
    if (!pool || !value || attr < 1 || attr > 8) return CUDA_ERROR_INVALID_VALUE;
    if (attr == CU_MEMPOOL_ATTR_RELEASE_THRESHOLD) {
        pthread_mutex_lock(&pool_mu);
        pool->threshold = *(const uint64_t *)value;
        pool_release_to(pool, pool->threshold); /* the driver releases the excess */
        pthread_mutex_unlock(&pool_mu);
    }
    return CUDA_SUCCESS;
}
FX CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t keep) {
    if (!pool) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&pool_mu);
    pool_release_to(pool, keep);
    pthread_mutex_unlock(&pool_mu);
    return CUDA_SUCCESS;
}
FX CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props) {
    if (!pool || !props || props->location.type != CU_MEM_LOCATION_TYPE_DEVICE) return CUDA_ERROR_INVALID_VALUE;
    if (props->location.id < 0 || props->location.id >= ndev) return CUDA_ERROR_INVALID_DEVICE;
    *pool = calloc(1, sizeof **pool);
    (*pool)->dev = props->location.id;
    return CUDA_SUCCESS;
}
FX CUresult cuMemPoolDestroy(CUmemoryPool pool) {
    if (!pool || pool->is_default) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&pool_mu);
    pool_release_to(pool, 0);
    for (int i = 0; i < MAXDEV; i++)
        if (current_pools[i] == pool) current_pools[i] = NULL;
    pthread_mutex_unlock(&pool_mu);
    free(pool);
    return CUDA_SUCCESS;
}
FX CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t n, const CUmemAllocationProp *prop,
                        unsigned long long flags) {
    if (!prop || flags != 0) return CUDA_ERROR_INVALID_VALUE;
    int on_dev = prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE;
    int dev = on_dev ? prop->location.id : 0;
    return mem_add(h, n, dev, on_dev, HANDLE);
}
FX CUresult cuMemRelease(CUmemGenericAllocationHandle h) {
    if (h == 0) return CUDA_ERROR_INVALID_VALUE;
    return mem_del(h);
}
static CUresult array_make(CUarray *a, uint64_t bytes) {
    unsigned long long key = 0;
    if (!a) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = mem_add(&key, bytes, cur_dev(), 1, HANDLE);
    if (r != CUDA_SUCCESS) return r;
    *a = malloc(sizeof **a);
    (*a)->dev = cur_dev();
    (*a)->bytes = key; /* the fake's handle for the bytes */
    return CUDA_SUCCESS;
}
static uint64_t elem(CUarray_format f) {
    return f == CU_AD_FORMAT_UNSIGNED_INT8 || f == CU_AD_FORMAT_SIGNED_INT8 ? 1
         : f == CU_AD_FORMAT_UNSIGNED_INT16 || f == CU_AD_FORMAT_SIGNED_INT16 || f == CU_AD_FORMAT_HALF ? 2
         : 4;
}
FX CUresult cuArrayCreate_v2(CUarray *a, const CUDA_ARRAY_DESCRIPTOR *d) {
    if (!d || d->Width == 0 || d->NumChannels == 0) return CUDA_ERROR_INVALID_VALUE;
    return array_make(a, d->Width * (d->Height ? d->Height : 1) * d->NumChannels * elem(d->Format));
}
FX CUresult cuArrayCreate(CUarray *a, const CUDA_ARRAY_DESCRIPTOR *d) { return cuArrayCreate_v2(a, d); }
FX CUresult cuArray3DCreate_v2(CUarray *a, const CUDA_ARRAY3D_DESCRIPTOR *d) {
    if (!d || d->Width == 0 || d->NumChannels == 0) return CUDA_ERROR_INVALID_VALUE;
    return array_make(a, d->Width * (d->Height ? d->Height : 1) * (d->Depth ? d->Depth : 1) *
                             d->NumChannels * elem(d->Format));
}
FX CUresult cuArray3DCreate(CUarray *a, const CUDA_ARRAY3D_DESCRIPTOR *d) { return cuArray3DCreate_v2(a, d); }
/* Mipmapped arrays: every level, each half the one before (at least 1). */
struct CUmipmappedArray_st { unsigned long long key; };
FX CUresult cuMipmappedArrayCreate(CUmipmappedArray *m, const CUDA_ARRAY3D_DESCRIPTOR *d, unsigned int levels) {
    if (!m || !d || d->Width == 0 || d->NumChannels == 0 || levels == 0) return CUDA_ERROR_INVALID_VALUE;
    uint64_t bytes = 0;
    for (unsigned l = 0; l < levels; l++) {
        uint64_t w = d->Width >> l, h = d->Height >> l, z = d->Depth >> l;
        bytes += (w ? w : 1) * (d->Height ? (h ? h : 1) : 1) * (d->Depth ? (z ? z : 1) : 1) *
                 d->NumChannels * elem(d->Format);
    }
    unsigned long long key = 0;
    CUresult r = mem_add(&key, bytes, cur_dev(), 1, HANDLE);
    if (r != CUDA_SUCCESS) return r;
    *m = malloc(sizeof **m);
    (*m)->key = key;
    return CUDA_SUCCESS;
}
FX CUresult cuMipmappedArrayDestroy(CUmipmappedArray m) {
    if (!m) return CUDA_ERROR_INVALID_HANDLE;
    CUresult r = mem_del(m->key);
    if (r == CUDA_SUCCESS) free(m);
    return r;
}
/* External memory: the size the descriptor names, on the current device. */
struct CUextMemory_st { unsigned long long key; };
FX CUresult cuImportExternalMemory(CUexternalMemory *m, const CUDA_EXTERNAL_MEMORY_HANDLE_DESC *d) {
    if (!m || !d || d->size == 0 || d->type < 1 || d->type > 8) return CUDA_ERROR_INVALID_VALUE;
    unsigned long long key = 0;
    CUresult r = mem_add(&key, d->size, cur_dev(), 1, HANDLE);
    if (r != CUDA_SUCCESS) return r;
    *m = malloc(sizeof **m);
    (*m)->key = key;
    return CUDA_SUCCESS;
}
FX CUresult cuDestroyExternalMemory(CUexternalMemory m) {
    if (!m) return CUDA_ERROR_INVALID_HANDLE;
    CUresult r = mem_del(m->key);
    if (r == CUDA_SUCCESS) free(m);
    return r;
}
FX CUresult cuArrayDestroy(CUarray a) {
    if (!a) return CUDA_ERROR_INVALID_HANDLE;
    CUresult r = mem_del(a->bytes);
    free(a);
    return r;
}

/* ---- modules and launches ---- */

FX CUresult cuModuleLoadData(CUmodule *m, const void *image) {
    static struct CUmod_st mod;
    if (!m || !image) return CUDA_ERROR_INVALID_VALUE;
    *m = &mod;
    return CUDA_SUCCESS;
}
FX CUresult cuModuleGetFunction(CUfunction *f, CUmodule m, const char *name) {
    if (!f || !m || !name) return CUDA_ERROR_INVALID_VALUE;
    if (strncmp(name, "busy_", 5) != 0) return CUDA_ERROR_NOT_FOUND;
    *f = malloc(sizeof **f);
    (*f)->ns = strtoull(name + 5, NULL, 10);
    return CUDA_SUCCESS;
}

/* ---- Streams and stream capture ----
 *
 * Every stream keeps when its own last kernel ends (`until`); kernels of all streams
 * still take turns on the device timeline. The legacy stream (NULL, CU_STREAM_LEGACY)
 * waits for, and is waited for by, every blocking stream (created with flags 0, and the
 * per-thread default stream); a non-blocking stream waits for nothing but itself. An
 * event recorded on a stream completes when that stream's work before it does.
 *
 * Capture, with the driver's rules as the CUDA programming guide states them: work
 * launched into a capturing stream is recorded into its graph, not run; the legacy stream
 * may not be used while a blocking stream captures (CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
 * a synchronising call (event, stream or context synchronise, event query, cuMemAlloc) is
 * refused with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED when the calling thread is
 * prohibited from "potentially unsafe" calls -- its mode (cuThreadExchangeStreamCaptureMode)
 * is not RELAXED and it captures itself, or its mode is GLOBAL and any thread captures in
 * GLOBAL mode. Each illegal call invalidates the captures it hits, and cuStreamEndCapture
 * then answers CUDA_ERROR_STREAM_CAPTURE_INVALIDATED. */
struct CUstream_st {
    int dev, nonblocking, capturing, invalid, mode;
    pthread_t owner;
    uint64_t until, captured_ns, captured_alloc; /* kernels and stream-ordered allocations */
    struct CUstream_st *next;
};
/* A graph runs as one kernel of its captured time, and its memory nodes (one per
 * allocation; a capture's allocations make one node) are reserved when it is
 * instantiated, kept until the executable graph is destroyed. An executable graph starts
 * like a CUfunc_st, so a test may also pass a CUfunction as a CUgraphExec. */
struct CUgraphNode_st { int type, dev; uint64_t bytes; CUdeviceptr dptr; struct CUgraphNode_st *next; };
struct CUgraph_st { uint64_t ns; struct CUgraphNode_st *nodes; size_t nnodes; };
typedef struct { uint64_t ns; unsigned long long mem; } fake_exec;
static void graph_add(CUgraph g, int type, int dev, uint64_t bytes, CUdeviceptr dptr);
static struct CUstream_st legacy_streams[MAXDEV];
static __thread struct CUstream_st per_thread_streams[MAXDEV];
static uint64_t blocking_until[MAXDEV]; /* end of the last kernel of any blocking stream */
static struct CUstream_st *created;     /* streams made by cuStreamCreate */
static pthread_mutex_t stream_mu = PTHREAD_MUTEX_INITIALIZER;
static int global_captures;             /* captures begun in GLOBAL mode, process-wide */
static int blocking_captures[MAXDEV];
static __thread int thread_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
static __thread int my_captures, my_global_captures; /* not RELAXED, begun by this thread */

static struct CUstream_st *stream_of(CUstream s, int ptsz) {
    int dev = cur_dev();
    if (dev < 0) return NULL;
    if (s == NULL) s = ptsz ? CU_STREAM_PER_THREAD : CU_STREAM_LEGACY;
    struct CUstream_st *st = s == CU_STREAM_LEGACY       ? &legacy_streams[dev]
                             : s == CU_STREAM_PER_THREAD ? &per_thread_streams[dev]
                                                         : NULL;
    if (st == NULL) return s;
    st->dev = dev; /* the special handles are per device */
    return st;
}

static int is_legacy(const struct CUstream_st *st) {
    return st >= legacy_streams && st < legacy_streams + MAXDEV;
}

/* When work recorded on st now would be done (stream_mu held). */
static uint64_t stream_done(const struct CUstream_st *st) {
    uint64_t t = st->until;
    if (!st->nonblocking) {
        uint64_t other = is_legacy(st) ? blocking_until[st->dev] : legacy_streams[st->dev].until;
        if (other > t) t = other;
    }
    return t;
}

/* Invalidate every capture on dev (dev < 0: on every device) that is blocking (or any). */
static void invalidate(int dev, int blocking_only) {
    for (struct CUstream_st *st = created; st; st = st->next)
        if (st->capturing && (dev < 0 || st->dev == dev) && (!blocking_only || !st->nonblocking))
            st->invalid = 1;
    for (int i = 0; i < MAXDEV; i++)
        if (per_thread_streams[i].capturing && (dev < 0 || i == dev)) per_thread_streams[i].invalid = 1;
}

/* The capture errors of using st now: IMPLICIT for the legacy stream while a blocking
 * stream of its device captures (stream_mu held). */
static CUresult legacy_check(const struct CUstream_st *st) {
    if (!is_legacy(st) || blocking_captures[st->dev] == 0) return CUDA_SUCCESS;
    invalidate(st->dev, 1);
    return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
}

/* UNSUPPORTED when this thread is prohibited from potentially unsafe calls now. */
static CUresult unsafe_check(void) {
    pthread_mutex_lock(&stream_mu);
    int prohibited = thread_mode != CU_STREAM_CAPTURE_MODE_RELAXED &&
                     (my_captures > 0 || (thread_mode == CU_STREAM_CAPTURE_MODE_GLOBAL &&
                                          global_captures > my_global_captures));
    if (prohibited) invalidate(-1, 0);
    pthread_mutex_unlock(&stream_mu);
    return prohibited ? CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED : CUDA_SUCCESS;
}

FX CUresult cuStreamCreate(CUstream *s, unsigned int flags) {
    if (!s || flags > CU_STREAM_NON_BLOCKING) return CUDA_ERROR_INVALID_VALUE;
    if (!cur) return CUDA_ERROR_INVALID_CONTEXT;
    struct CUstream_st *st = calloc(1, sizeof *st);
    st->dev = cur->dev;
    st->nonblocking = flags == CU_STREAM_NON_BLOCKING;
    pthread_mutex_lock(&stream_mu);
    st->next = created;
    created = st;
    pthread_mutex_unlock(&stream_mu);
    *s = st;
    return CUDA_SUCCESS;
}

FX CUresult cuStreamDestroy_v2(CUstream s) {
    if (!s || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD) return CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&stream_mu);
    struct CUstream_st **pp = &created;
    while (*pp && *pp != s) pp = &(*pp)->next;
    if (!*pp) {
        pthread_mutex_unlock(&stream_mu);
        return CUDA_ERROR_INVALID_HANDLE;
    }
    if (s->capturing) {
        pthread_mutex_unlock(&stream_mu);
        return CUDA_ERROR_ILLEGAL_STATE;
    }
    *pp = s->next;
    pthread_mutex_unlock(&stream_mu);
    free(s);
    return CUDA_SUCCESS;
}

FX CUresult cuStreamBeginCapture_v2(CUstream s, CUstreamCaptureMode mode) {
    if ((unsigned)mode > CU_STREAM_CAPTURE_MODE_RELAXED) return CUDA_ERROR_INVALID_VALUE;
    struct CUstream_st *st = stream_of(s, 0);
    if (!st) return CUDA_ERROR_INVALID_CONTEXT;
    if (is_legacy(st)) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    pthread_mutex_lock(&stream_mu);
    if (st->capturing) {
        pthread_mutex_unlock(&stream_mu);
        return CUDA_ERROR_ILLEGAL_STATE;
    }
    *st = (struct CUstream_st){st->dev, st->nonblocking, 1, 0, mode, pthread_self(), st->until, 0, 0, st->next};
    if (mode == CU_STREAM_CAPTURE_MODE_GLOBAL) global_captures++, my_global_captures++;
    if (mode != CU_STREAM_CAPTURE_MODE_RELAXED) my_captures++;
    if (!st->nonblocking) blocking_captures[st->dev]++;
    pthread_mutex_unlock(&stream_mu);
    return CUDA_SUCCESS;
}

FX CUresult cuStreamEndCapture(CUstream s, CUgraph *graph) {
    if (!graph) return CUDA_ERROR_INVALID_VALUE;
    struct CUstream_st *st = stream_of(s, 0);
    if (!st) return CUDA_ERROR_INVALID_CONTEXT;
    pthread_mutex_lock(&stream_mu);
    if (!st->capturing) {
        pthread_mutex_unlock(&stream_mu);
        return CUDA_ERROR_ILLEGAL_STATE;
    }
    if (st->mode != CU_STREAM_CAPTURE_MODE_RELAXED && !pthread_equal(st->owner, pthread_self())) {
        pthread_mutex_unlock(&stream_mu);
        return CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD;
    }
    st->capturing = 0;
    if (st->mode == CU_STREAM_CAPTURE_MODE_GLOBAL) global_captures--, my_global_captures--;
    if (st->mode != CU_STREAM_CAPTURE_MODE_RELAXED) my_captures--;
    if (!st->nonblocking) blocking_captures[st->dev]--;
    int invalid = st->invalid;
    uint64_t ns = st->captured_ns, alloc = st->captured_alloc;
    pthread_mutex_unlock(&stream_mu);
    *graph = NULL;
    if (invalid) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    *graph = calloc(1, sizeof **graph);
    (*graph)->ns = ns;
    if (alloc) graph_add(*graph, CU_GRAPH_NODE_TYPE_MEM_ALLOC, st->dev, alloc, 0);
    return CUDA_SUCCESS;
}

FX CUresult cuStreamIsCapturing(CUstream s, CUstreamCaptureStatus *status) {
    if (!status) return CUDA_ERROR_INVALID_VALUE;
    struct CUstream_st *st = stream_of(s, 0);
    if (!st) return CUDA_ERROR_INVALID_CONTEXT;
    pthread_mutex_lock(&stream_mu);
    CUresult r = legacy_check(st);
    *status = !st->capturing ? CU_STREAM_CAPTURE_STATUS_NONE
              : st->invalid  ? CU_STREAM_CAPTURE_STATUS_INVALIDATED
                             : CU_STREAM_CAPTURE_STATUS_ACTIVE;
    pthread_mutex_unlock(&stream_mu);
    return r;
}

FX CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode *mode) {
    if (!mode || (unsigned)*mode > CU_STREAM_CAPTURE_MODE_RELAXED) return CUDA_ERROR_INVALID_VALUE;
    int old = thread_mode;
    thread_mode = (int)*mode;
    *mode = (CUstreamCaptureMode)old;
    return CUDA_SUCCESS;
}

FX CUresult cuGraphCreate(CUgraph *graph, unsigned int flags) {
    if (!graph || flags != 0) return CUDA_ERROR_INVALID_VALUE;
    *graph = calloc(1, sizeof **graph);
    return CUDA_SUCCESS;
}
static void graph_add(CUgraph g, int type, int dev, uint64_t bytes, CUdeviceptr dptr) {
    struct CUgraphNode_st *n = calloc(1, sizeof *n);
    *n = (struct CUgraphNode_st){type, dev, bytes, dptr, g->nodes};
    g->nodes = n;
    g->nnodes++;
}
FX CUresult cuGraphAddMemAllocNode(CUgraphNode *node, CUgraph g, const CUgraphNode *deps, size_t n,
                                   CUDA_MEM_ALLOC_NODE_PARAMS *p) {
    if (!node || !g || (n && !deps) || !p || p->bytesize == 0) return CUDA_ERROR_INVALID_VALUE;
    if (p->poolProps.allocType != CU_MEM_ALLOCATION_TYPE_PINNED ||
        p->poolProps.location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return CUDA_ERROR_INVALID_VALUE;
    if (p->poolProps.location.id < 0 || p->poolProps.location.id >= ndev) return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&alloc_mu); /* an address reserved for the graph; no memory yet */
    p->dptr = next_addr;
    next_addr += (p->bytesize + 0xfff) & ~0xfffull;
    pthread_mutex_unlock(&alloc_mu);
    graph_add(g, CU_GRAPH_NODE_TYPE_MEM_ALLOC, p->poolProps.location.id, p->bytesize, 0);
    *node = g->nodes;
    return CUDA_SUCCESS;
}
FX CUresult cuGraphGetNodes(CUgraph g, CUgraphNode *nodes, size_t *n) {
    if (!g || !n) return CUDA_ERROR_INVALID_VALUE;
    if (nodes) {
        size_t i = 0;
        for (struct CUgraphNode_st *x = g->nodes; x && i < *n; x = x->next) nodes[i++] = x;
        for (; i < *n; i++) nodes[i] = NULL;
    }
    *n = g->nnodes;
    return CUDA_SUCCESS;
}
FX CUresult cuGraphNodeGetType(CUgraphNode node, CUgraphNodeType *type) {
    if (!node || !type) return CUDA_ERROR_INVALID_VALUE;
    *type = (CUgraphNodeType)node->type;
    return CUDA_SUCCESS;
}
FX CUresult cuGraphMemAllocNodeGetParams(CUgraphNode node, CUDA_MEM_ALLOC_NODE_PARAMS *p) {
    if (!node || !p || node->type != CU_GRAPH_NODE_TYPE_MEM_ALLOC) return CUDA_ERROR_INVALID_VALUE;
    memset(p, 0, sizeof *p);
    p->poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    p->poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p->poolProps.location.id = node->dev;
    p->bytesize = node->bytes;
    p->dptr = node->dptr;
    return CUDA_SUCCESS;
}
/* Instantiate: the graph's memory nodes are reserved on the device now (at most one
 * device per graph in the fake). */
static CUresult instantiate(CUgraphExec *exec, CUgraph graph) {
    if (!exec || !graph) return CUDA_ERROR_INVALID_VALUE;
    uint64_t bytes = 0;
    int dev = 0;
    for (struct CUgraphNode_st *x = graph->nodes; x; x = x->next)
        if (x->type == CU_GRAPH_NODE_TYPE_MEM_ALLOC) bytes += x->bytes, dev = x->dev;
    fake_exec *e = calloc(1, sizeof *e);
    e->ns = graph->ns;
    if (bytes) {
        CUresult r = mem_add(&e->mem, bytes, dev, 1, HANDLE);
        if (r != CUDA_SUCCESS) {
            free(e);
            return r;
        }
    }
    *exec = (CUgraphExec)e;
    return CUDA_SUCCESS;
}
FX CUresult cuGraphInstantiateWithFlags(CUgraphExec *exec, CUgraph graph, unsigned long long flags) {
    return flags > 15 ? CUDA_ERROR_INVALID_VALUE : instantiate(exec, graph);
}
FX CUresult cuGraphInstantiate(CUgraphExec *exec, CUgraph graph, CUgraphNode *err, char *log, size_t n) {
    (void)err, (void)log, (void)n;
    return instantiate(exec, graph);
}
FX CUresult cuGraphInstantiate_v2(CUgraphExec *exec, CUgraph graph, CUgraphNode *err, char *log, size_t n) {
    (void)err, (void)log, (void)n;
    return instantiate(exec, graph);
}
FX CUresult cuGraphInstantiateWithParams(CUgraphExec *exec, CUgraph graph, CUDA_GRAPH_INSTANTIATE_PARAMS *p) {
    return p ? instantiate(exec, graph) : CUDA_ERROR_INVALID_VALUE;
}
FX CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec *exec, CUgraph graph, CUDA_GRAPH_INSTANTIATE_PARAMS *p) {
    return p ? instantiate(exec, graph) : CUDA_ERROR_INVALID_VALUE;
}
FX CUresult cuGraphDestroy(CUgraph graph) {
    if (!graph) return CUDA_ERROR_INVALID_VALUE;
    while (graph->nodes) {
        struct CUgraphNode_st *x = graph->nodes;
        graph->nodes = x->next;
        if (x->dptr) mem_del(x->dptr);
        free(x);
    }
    free(graph);
    return CUDA_SUCCESS;
}
FX CUresult cuGraphExecDestroy(CUgraphExec exec) {
    if (!exec) return CUDA_ERROR_INVALID_VALUE;
    fake_exec *e = (fake_exec *)exec;
    if (e->mem) mem_del(e->mem);
    free(e);
    return CUDA_SUCCESS;
}

/* Whether stream s captures; if so, n bytes join its graph's memory. */
static int capture_alloc(CUstream s, int ptsz, uint64_t n) {
    struct CUstream_st *st = stream_of(s, ptsz);
    if (!st) return 0;
    pthread_mutex_lock(&stream_mu);
    int capturing = st->capturing;
    if (capturing) st->captured_alloc += n;
    pthread_mutex_unlock(&stream_mu);
    return capturing;
}

/* A kernel of f->ns on stream st: recorded if st captures, else queued on the device. */
static CUresult run_on(CUfunction f, struct CUstream_st *st) {
    if (!f) return CUDA_ERROR_INVALID_HANDLE;
    if (!st) return CUDA_ERROR_INVALID_CONTEXT;
    int dev = st->dev;
    pthread_mutex_lock(&stream_mu);
    CUresult r = legacy_check(st);
    if (r == CUDA_SUCCESS && st->capturing) st->captured_ns += f->ns;
    int captured = st->capturing;
    pthread_mutex_unlock(&stream_mu);
    if (r != CUDA_SUCCESS || captured) return r;
    fdev *d = devs_at(dev);
    pthread_mutex_lock(&d->mu);
    uint64_t now = now_ns();
    while (d->busy_until > now + queue_ns) { /* queue full: wait like a real push buffer */
        uint64_t t = d->busy_until - queue_ns;
        pthread_mutex_unlock(&d->mu);
        sleep_until(t);
        pthread_mutex_lock(&d->mu);
        now = now_ns();
    }
    uint64_t start = d->busy_until > now ? d->busy_until : now;
    d->busy_until = start + f->ns;
    mine_until[dev] = start + f->ns;
    d->log[d->nlog % LOG_CAP] = (span){start, start + f->ns, getpid()};
    d->nlog++;
    d->launches++;
    pthread_mutex_unlock(&d->mu);
    pthread_mutex_lock(&stream_mu);
    st->until = start + f->ns;
    if (!st->nonblocking && !is_legacy(st) && st->until > blocking_until[dev]) blocking_until[dev] = st->until;
    pthread_mutex_unlock(&stream_mu);
    return CUDA_SUCCESS;
}
static CUresult run(CUfunction f, CUstream s, int ptsz) {
    if (cur_dev() < 0) return CUDA_ERROR_INVALID_CONTEXT;
    return run_on(f, stream_of(s, ptsz));
}

#define GRID_OK (gx && gy && gz && bx && by && bz)
FX CUresult cuLaunchKernel(VG_LAUNCH_ARGS_DECL, void **p, void **x) {
    (void)shmem, (void)p, (void)x;
    return GRID_OK ? run(f, stream, 0) : CUDA_ERROR_INVALID_VALUE;
}
FX CUresult cuLaunchKernel_ptsz(VG_LAUNCH_ARGS_DECL, void **p, void **x) {
    (void)shmem, (void)p, (void)x;
    return GRID_OK ? run(f, stream, 1) : CUDA_ERROR_INVALID_VALUE;
}
FX CUresult cuLaunchKernelEx(const CUlaunchConfig *c, CUfunction f, void **p, void **x) {
    (void)p, (void)x;
    return c ? run(f, c->hStream, 0) : CUDA_ERROR_INVALID_VALUE;
}
FX CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *c, CUfunction f, void **p, void **x) {
    (void)p, (void)x;
    return c ? run(f, c->hStream, 1) : CUDA_ERROR_INVALID_VALUE;
}
FX CUresult cuLaunchCooperativeKernel(VG_LAUNCH_ARGS_DECL, void **p) {
    (void)shmem, (void)p;
    return GRID_OK ? run(f, stream, 0) : CUDA_ERROR_INVALID_VALUE;
}
FX CUresult cuLaunchCooperativeKernel_ptsz(VG_LAUNCH_ARGS_DECL, void **p) {
    (void)shmem, (void)p;
    return GRID_OK ? run(f, stream, 1) : CUDA_ERROR_INVALID_VALUE;
}
FX CUresult cuLaunchCooperativeKernelMultiDevice(CUDA_LAUNCH_PARAMS *l, unsigned n, unsigned fl) {
    (void)fl;
    if (!l || n == 0) return CUDA_ERROR_INVALID_VALUE;
    for (unsigned i = 0; i < n; i++) {
        CUresult r = run(l[i].function, l[i].hStream, 0);
        if (r != CUDA_SUCCESS) return r;
    }
    return CUDA_SUCCESS;
}
FX CUresult cuGraphLaunch(CUgraphExec g, CUstream s) { return run((CUfunction)g, s, 0); }
FX CUresult cuGraphLaunch_ptsz(CUgraphExec g, CUstream s) { return run((CUfunction)g, s, 1); }
FX CUresult cuLaunch(CUfunction f) { return run(f, NULL, 0); }
FX CUresult cuLaunchGrid(CUfunction f, int w, int h) { return w > 0 && h > 0 ? run(f, NULL, 0) : CUDA_ERROR_INVALID_VALUE; }
FX CUresult cuLaunchGridAsync(CUfunction f, int w, int h, CUstream s) {
    return w > 0 && h > 0 ? run(f, s, 0) : CUDA_ERROR_INVALID_VALUE;
}

static CUresult sync_dev(int dev) {
    if (dev < 0) return CUDA_ERROR_INVALID_CONTEXT;
    CUresult r = unsafe_check();
    if (r != CUDA_SUCCESS) return r;
    pthread_mutex_lock(&stream_mu);
    int capturing = blocking_captures[dev] > 0;
    for (struct CUstream_st *st = created; st; st = st->next) capturing |= st->capturing && st->dev == dev;
    if (capturing) invalidate(dev, 0);
    pthread_mutex_unlock(&stream_mu);
    if (capturing) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    __atomic_fetch_add(&sync_calls, 1, __ATOMIC_RELAXED);
    pthread_mutex_lock(&devs_at(dev)->mu);
    uint64_t t = devs_at(dev)->busy_until;
    pthread_mutex_unlock(&devs_at(dev)->mu);
    if (t > now_ns()) sleep_until(t);
    return CUDA_SUCCESS;
}
FX CUresult cuCtxSynchronize(void) { return sync_dev(cur_dev()); }

/* Events: a recorded event "completes" when its stream's work before it does. One
 * recorded into a capturing stream is a node of the graph: it has no time, and waiting
 * on it is CUDA_ERROR_CAPTURED_EVENT. */
struct CUevent_st { int dev; uint64_t t; int recorded, captured; };
FX CUresult cuEventCreate(CUevent *e, unsigned int flags) {
    if (!e || flags > 15) return CUDA_ERROR_INVALID_VALUE;
    if (!cur) return CUDA_ERROR_INVALID_CONTEXT;
    *e = calloc(1, sizeof **e);
    (*e)->dev = cur->dev;
    return CUDA_SUCCESS;
}
FX CUresult cuEventDestroy_v2(CUevent e) {
    free(e);
    return CUDA_SUCCESS;
}
FX CUresult cuEventRecord(CUevent e, CUstream s) {
    if (!e) return CUDA_ERROR_INVALID_HANDLE;
    struct CUstream_st *st = stream_of(s, 0);
    if (!st) return CUDA_ERROR_INVALID_CONTEXT;
    pthread_mutex_lock(&stream_mu);
    CUresult r = legacy_check(st);
    if (r == CUDA_SUCCESS) {
        uint64_t now = now_ns(), done = stream_done(st);
        e->captured = st->capturing;
        e->recorded = !st->capturing;
        e->t = done > now ? done : now;
    }
    pthread_mutex_unlock(&stream_mu);
    return r;
}
static CUresult event_ready(CUevent e) {
    if (!e) return CUDA_ERROR_INVALID_HANDLE;
    if (e->captured) return CUDA_ERROR_CAPTURED_EVENT;
    return unsafe_check();
}
FX CUresult cuEventSynchronize(CUevent e) {
    CUresult r = event_ready(e);
    if (r != CUDA_SUCCESS) return r;
    __atomic_fetch_add(&sync_calls, 1, __ATOMIC_RELAXED);
    if (e->recorded && e->t > now_ns()) sleep_until(e->t);
    return CUDA_SUCCESS;
}
FX CUresult cuEventQuery(CUevent e) {
    CUresult r = event_ready(e);
    if (r != CUDA_SUCCESS) return r;
    return e->recorded && e->t > now_ns() ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS;
}
FX CUresult cuEventElapsedTime(float *ms, CUevent a, CUevent b) {
    if (!ms) return CUDA_ERROR_INVALID_VALUE;
    if (!a || !b) return CUDA_ERROR_INVALID_HANDLE;
    if (a->captured || b->captured) return CUDA_ERROR_CAPTURED_EVENT;
    if (!a->recorded || !b->recorded) return CUDA_ERROR_INVALID_HANDLE;
    *ms = (float)((double)((int64_t)b->t - (int64_t)a->t) / 1e6);
    return CUDA_SUCCESS;
}
FX CUresult cuStreamSynchronize(CUstream s) {
    struct CUstream_st *st = stream_of(s, 0);
    if (!st) return CUDA_ERROR_INVALID_CONTEXT;
    CUresult r = unsafe_check();
    if (r != CUDA_SUCCESS) return r;
    pthread_mutex_lock(&stream_mu);
    r = legacy_check(st);
    if (r == CUDA_SUCCESS && st->capturing) {
        st->invalid = 1;
        r = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
    uint64_t t = stream_done(st);
    pthread_mutex_unlock(&stream_mu);
    if (r != CUDA_SUCCESS) return r;
    __atomic_fetch_add(&sync_calls, 1, __ATOMIC_RELAXED);
    if (t > now_ns()) sleep_until(t);
    return CUDA_SUCCESS;
}

/* ---- cuGetProcAddress: the driver's rules, over the fake's own table ---- */

#define PROC(name, params, args) {#name, (void *)name},
static const struct { const char *name; void *fn; } procs[] = {
    VG_CUDA_FUNCS(PROC) VG_CUDA_USED(PROC)
    PROC(cuCtxSetCurrent, , ) PROC(cuCtxGetCurrent, , ) PROC(cuModuleLoadData, , ) PROC(cuModuleGetFunction, , )
    PROC(cuStreamSynchronize, , ) PROC(cuDriverGetVersion, , ) PROC(cuEventDestroy_v2, , )
    PROC(cuDeviceGet, , ) PROC(cuDeviceGetCount, , ) PROC(cuEventQuery, , )
    PROC(cuStreamCreate, , ) PROC(cuStreamDestroy_v2, , ) PROC(cuStreamBeginCapture_v2, , )
    PROC(cuStreamEndCapture, , ) PROC(cuGraphDestroy, , ) PROC(cuGraphCreate, , )
    PROC(cuGraphAddMemAllocNode, , ) PROC(cuDeviceGetDefaultMemPool, , )
    PROC(cuDeviceSetMemPool, , ) {NULL, NULL},
};

/* With FAKECUDA_PROC_INTERNAL=1, cuGetProcAddress hands out internal entry points (as
 * real drivers may), not the exported symbols, for every name libvgpu hooks: a static
 * function per name that calls the fake's own (the fake links -Bsymbolic, so the call
 * stays inside it). */
#define INTERNAL(name, params, args) \
    static CUresult internal_##name params { return name args; }
VG_CUDA_FUNCS(INTERNAL)
#undef INTERNAL
#define INTERNAL(name, params, args) {#name, (void *)internal_##name},
static const struct { const char *name; void *fn; } internals[] = {VG_CUDA_FUNCS(INTERNAL) {NULL, NULL}};
#undef INTERNAL

/* The CUDA version that introduced a name (cuGetProcAddress refuses older requests with
 * CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT): facts of the driver API reference, for the
 * names the tests ask about. */
static const struct { const char *name; int since; } introduced[] = {
    {"cuMemAllocAsync", 11020}, {"cuMemFreeAsync", 11020}, {"cuMemAllocFromPoolAsync", 11020},
    {"cuMemPoolCreate", 11020}, {"cuLaunchKernelEx", 11060}, {"cuGraphInstantiateWithParams", 12000},
    {"cuGraphAddMemAllocNode", 11040}, {"cuGreenCtxCreate", 12040}, {"cuStreamBeginCaptureToGraph", 12030},
    {NULL, 0},
};

static void *proc_named(const char *name) {
    for (int i = 0; procs[i].name; i++)
        if (strcmp(procs[i].name, name) == 0) return procs[i].fn;
    return NULL;
}

/* With FAKECUDA_PROC_LOG=<file>, every lookup is appended to it as "<name> <version>
 * <flags> <the fake's symbol it resolved to, or ->" lines: what a real CUDA runtime asks
 * the driver for (tests/integration/test_cuda_runtime.py). */
static void log_lookup(const char *sym, int ver, cuuint64_t flags, const char *resolved) {
    const char *path = getenv("FAKECUDA_PROC_LOG");
    if (!path || !path[0]) return;
    FILE *f = fopen(path, "a");
    if (!f) return;
    fprintf(f, "%s %d %llu %s\n", sym, ver, (unsigned long long)flags, resolved ? resolved : "-");
    fclose(f);
}

static CUresult get_proc(const char *sym, void **pfn, int ver, cuuint64_t flags, int *too_old) {
    char name[128];
    void *fn = NULL;
    *too_old = 0;
    if (!sym || !pfn) return CUDA_ERROR_INVALID_VALUE;
    for (int i = 0; introduced[i].name; i++) {
        if (strcmp(introduced[i].name, sym) == 0 && ver < introduced[i].since) {
            log_lookup(sym, ver, flags, NULL);
            *pfn = NULL;
            *too_old = 1;
            return CUDA_ERROR_NOT_FOUND;
        }
    }
    if (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) {
        snprintf(name, sizeof name, "%s_ptsz", sym);
        fn = proc_named(name);
    }
    if (!fn && ver >= (strcmp(sym, "cuGetProcAddress") == 0 ? 12000 : 3020)) {
        snprintf(name, sizeof name, "%s_v2", sym);
        fn = proc_named(name);
    }
    if (!fn && (fn = proc_named(sym)) != NULL) snprintf(name, sizeof name, "%s", sym);
    log_lookup(sym, ver, flags, fn ? name : NULL);
    *pfn = NULL;
    if (!fn) return CUDA_ERROR_NOT_FOUND;
    const char *internal = getenv("FAKECUDA_PROC_INTERNAL");
    if (internal && internal[0] == '1')
        for (int i = 0; internals[i].name; i++)
            if (strcmp(internals[i].name, name) == 0) fn = internals[i].fn;
    *pfn = fn;
    return CUDA_SUCCESS;
}

FX CUresult cuGetProcAddress(const char *sym, void **pfn, int ver, cuuint64_t flags) {
    int too_old = 0;
    return get_proc(sym, pfn, ver, flags, &too_old);
}
FX CUresult cuGetProcAddress_v2(const char *sym, void **pfn, int ver, cuuint64_t flags,
                                CUdriverProcAddressQueryResult *status) {
    int too_old = 0;
    CUresult r = get_proc(sym, pfn, ver, flags, &too_old);
    if (status)
        *status = r == CUDA_SUCCESS ? CU_GET_PROC_ADDRESS_SUCCESS
                  : too_old         ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
                                    : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    return r;
}

/* ---- test controls (fakecuda.h) ---- */

FX uint64_t fakecuda_busy_between_pid(int dev, uint64_t t0, uint64_t t1, int pid) {
    fdev *d = devs_at(dev);
    pthread_mutex_lock(&d->mu);
    uint64_t sum = fdev_busy(d, t0, t1, pid);
    pthread_mutex_unlock(&d->mu);
    return sum;
}
FX uint64_t fakecuda_busy_between(int dev, uint64_t t0, uint64_t t1) {
    return fakecuda_busy_between_pid(dev, t0, t1, 0);
}
FX uint64_t fakecuda_used(int dev) {
    pthread_mutex_lock(&alloc_mu);
    uint64_t u = devs_at(dev)->used;
    pthread_mutex_unlock(&alloc_mu);
    return u;
}
FX uint64_t fakecuda_peak(int dev) {
    pthread_mutex_lock(&alloc_mu);
    uint64_t u = devs_at(dev)->peak;
    pthread_mutex_unlock(&alloc_mu);
    return u;
}
FX uint64_t fakecuda_alloc_calls(void) { return __atomic_load_n(&alloc_calls, __ATOMIC_RELAXED); }
FX uint64_t fakecuda_sync_calls(void) { return __atomic_load_n(&sync_calls, __ATOMIC_RELAXED); }
FX uint64_t fakecuda_launches(int dev) {
    pthread_mutex_lock(&devs_at(dev)->mu);
    uint64_t n = devs_at(dev)->launches;
    pthread_mutex_unlock(&devs_at(dev)->mu);
    return n;
}
