/*
 * fake_nvml.c - a fake libnvidia-ml.so.1 for libvgpu's tests: FAKECUDA_DEVICES devices of
 * FAKECUDA_MEM_MIB each, with the same UUIDs as the fake libcuda (see fakecuda.h). Memory
 * "used" is always 0 here; libvgpu replaces the figures with the container's slice.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "fake_dev.h"
#include "vg_nvml.h"

#define FX __attribute__((visibility("default")))
struct nvmlDevice_st { int index; };
static struct nvmlDevice_st devs[MAXDEV];
static int inited = 0;
static unsigned char uuids[MAXDEV][16];
static char uuid_text[MAXDEV][48];
static int nvisible;

static int ndev(void) {
    if (nvisible > 0) return nvisible;
    const char *e = getenv("FAKECUDA_DEVICES");
    int n = e ? atoi(e) : 2;
    return n < 1 ? 1 : n > MAXDEV ? MAXDEV : n;
}
static unsigned long long total(void) {
    const char *e = getenv("FAKECUDA_MEM_MIB");
    return (e ? strtoull(e, NULL, 10) : 16384ull) << 20;
}
static int valid(nvmlDevice_t d) { return d && d >= devs && d < devs + ndev(); }

FX nvmlReturn_t nvmlInit_v2(void) {
    for (int i = 0; i < MAXDEV; i++) devs[i].index = i;
    nvisible = fdev_visible_cards(uuids, uuid_text);
    inited = 1;
    return NVML_SUCCESS;
}
FX nvmlReturn_t nvmlInit(void) { return nvmlInit_v2(); }
FX nvmlReturn_t nvmlShutdown(void) {
    inited = 0;
    return NVML_SUCCESS;
}
FX const char *nvmlErrorString(nvmlReturn_t r) { return r == NVML_SUCCESS ? "Success" : "Fake NVML error"; }
FX nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *n) {
    if (!inited) return NVML_ERROR_UNINITIALIZED;
    if (!n) return NVML_ERROR_INVALID_ARGUMENT;
    *n = (unsigned)ndev();
    return NVML_SUCCESS;
}
FX nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvmlDevice_t *d) {
    if (!inited) return NVML_ERROR_UNINITIALIZED;
    if (!d || i >= (unsigned)ndev()) return NVML_ERROR_INVALID_ARGUMENT;
    *d = &devs[i];
    return NVML_SUCCESS;
}
FX nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *uuid, unsigned int len) {
    if (!inited) return NVML_ERROR_UNINITIALIZED;
    if (!valid(d) || !uuid) return NVML_ERROR_INVALID_ARGUMENT;
    if (len < 41) return NVML_ERROR_INSUFFICIENT_SIZE;
    snprintf(uuid, len, "%s", uuid_text[d->index]);
    return NVML_SUCCESS;
}
/* Utilisation, as NVML defines it (percent of the last sample period with a kernel
 * running), over the last 200 ms of the shared fake timeline (FAKECUDA_SHARED); without a
 * shared timeline there is nothing to report. */
FX nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t d, nvmlUtilization_t *u) {
    static fdev *shared;
    static char mapped[512];
    if (!inited) return NVML_ERROR_UNINITIALIZED;
    if (!valid(d) || !u) return NVML_ERROR_INVALID_ARGUMENT;
    const char *path = getenv("FAKECUDA_SHARED");
    if (!path || !path[0]) return NVML_ERROR_NOT_SUPPORTED;
    if (!shared || strcmp(mapped, path) != 0) {
        int fd = open(path, O_RDWR);
        if (fd < 0) return NVML_ERROR_NOT_SUPPORTED;
        void *m = mmap(NULL, sizeof(fdev) * MAXDEV, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        close(fd);
        if (m == MAP_FAILED) return NVML_ERROR_UNKNOWN;
        if (shared) munmap(shared, sizeof(fdev) * MAXDEV);
        shared = m;
        snprintf(mapped, sizeof mapped, "%s", path);
    }
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    uint64_t now = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec, period = 200000000ull;
    fdev *dev = &shared[d->index];
    pthread_mutex_lock(&dev->mu);
    uint64_t busy = fdev_busy(dev, now - period, now, 0);
    pthread_mutex_unlock(&dev->mu);
    u->gpu = (unsigned)(busy * 100 / period);
    u->memory = 0;
    return NVML_SUCCESS;
}

FX nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *m) {
    if (!inited) return NVML_ERROR_UNINITIALIZED;
    if (!valid(d) || !m) return NVML_ERROR_INVALID_ARGUMENT;
    m->total = total();
    m->used = 0;
    m->free = m->total;
    return NVML_SUCCESS;
}
FX nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t d, nvmlMemory_v2_t *m) {
    if (!inited) return NVML_ERROR_UNINITIALIZED;
    if (!valid(d) || !m) return NVML_ERROR_INVALID_ARGUMENT;
    if (m->version != nvmlMemory_v2) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    m->total = total();
    m->reserved = 256ull << 20;
    m->used = m->reserved;
    m->free = m->total - m->used;
    return NVML_SUCCESS;
}
