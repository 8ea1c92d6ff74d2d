/* vgt_drv.h - helpers of the driver tests (applications run with libvgpu preloaded). */
#ifndef VGT_DRV_H
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#define VGT_DRV_H

#include <fcntl.h>
#include <sys/mman.h>

#include "fakecuda.h"
#include "vg_cuda.h"
#include "vg_protocol.h"
#include "vgt.h"

/* cuInit and make device dev's primary context current on this thread. */
static inline void vgt_ctx(int dev) {
    CUcontext c = NULL;
    CHECK_RC(cuInit(0), CUDA_SUCCESS);
    CHECK_RC(cuDevicePrimaryCtxRetain(&c, dev), CUDA_SUCCESS);
    CHECK_RC(cuCtxSetCurrent(c), CUDA_SUCCESS);
}

/* The container's usage region in dir, mapped read-only as the node agent would. */
static inline const vg_region *vgt_region(const char *dir) {
    char path[512];
    snprintf(path, sizeof path, "%s/region", dir);
    int fd = open(path, O_RDONLY);
    CHECK(fd >= 0, "open %s: %s", path, strerror(errno));
    void *m = mmap(NULL, sizeof(vg_region), PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    CHECK(m != MAP_FAILED, "mmap region");
    return m;
}

/* Container-wide memory in use on card (sum over live slots). */
static inline uint64_t vgt_used(const vg_region *r, int card) {
    uint64_t sum = 0;
    for (int s = 0; s < VG_MAX_SLOTS; s++)
        if (__atomic_load_n(&r->slots[s].state, __ATOMIC_ACQUIRE) == VG_SLOT_LIVE)
            sum += __atomic_load_n(&r->slots[s].cards[card].mem_used, __ATOMIC_RELAXED);
    return sum;
}

/* Sum of a per-card counter over live slots plus what exited processes left behind. */
static inline uint64_t vgt_refused(const vg_region *r, int card) {
    uint64_t sum = r->hdr.cards[card].retired_refused;
    for (int s = 0; s < VG_MAX_SLOTS; s++)
        if (r->slots[s].state == VG_SLOT_LIVE) sum += r->slots[s].cards[card].refused;
    return sum;
}

static inline void vgt_sleep_ms(unsigned ms) {
    struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

static inline CUfunction vgt_kernel(uint64_t ns) {
    CUmodule m = NULL;
    CUfunction f = NULL;
    char name[64];
    snprintf(name, sizeof name, "busy_%llu", (unsigned long long)ns);
    CHECK_RC(cuModuleLoadData(&m, "fake"), CUDA_SUCCESS);
    CHECK_RC(cuModuleGetFunction(&f, m, name), CUDA_SUCCESS);
    return f;
}

#endif /* VGT_DRV_H */
