/* vg_state.c - see vg_state.h. */
#define _GNU_SOURCE
#include "vg_state.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "vg_real.h"

vg_state vg_g = {.slot = -1};
vg_table vg_ptrs = VG_TABLE_INIT, vg_handles = VG_TABLE_INIT, vg_arrays = VG_TABLE_INIT,
         vg_ctxs = VG_TABLE_INIT, vg_pool_ptrs = VG_TABLE_INIT,
         vg_execs = VG_TABLE_INIT;
static pthread_once_t vg_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t vg_slot_mu = PTHREAD_MUTEX_INITIALIZER;

void vg_log(const char *fmt, ...) {
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "[tessera libvgpu] %s\n", line);
}

uint64_t vg_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

uint64_t vg_unix_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000ULL + (uint64_t)ts.tv_nsec / 1000000ULL;
}

static const char *vg_limits_path(void) {
#ifdef VG_TESTING
    /* Test builds only: the production library reads nothing but VG_LIMITS_PATH. */
    const char *p = getenv("TESSERA_TEST_LIMITS");
    if (p != NULL && p[0] != '\0') return p;
#endif
    return VG_LIMITS_PATH;
}

static void vg_atfork_child(void) {
    /* The child owns none of the parent's allocations and no slot yet. */
    vg_g.slot = -1;
    vg_g.pid = getpid();
    pthread_mutex_init(&vg_slot_mu, NULL);
    vg_table_reset(&vg_ptrs);
    vg_table_reset(&vg_handles);
    vg_table_reset(&vg_arrays);
    vg_table_reset(&vg_ctxs);
    vg_table_reset(&vg_pool_ptrs);
    vg_table_reset(&vg_execs);
}

static void vg_do_init(void) {
    static char text[65536];
    char err[256];
    const char *path = vg_limits_path();
    for (int i = 0; i < VG_MAX_DEVS; i++) vg_g.dev_card[i] = -2;
    vg_g.pid = getpid();
    long n = vg_read_file(path, text, sizeof text);
    if (n < 0 && errno == ENOENT) {
        vg_g.mode = VG_MODE_INERT;
        return;
    }
    if (n < 0) {
        vg_log("%s: %s; failing closed", path, strerror(errno));
        vg_g.mode = VG_MODE_BROKEN;
        return;
    }
    if (vg_limits_parse(text, (size_t)n, &vg_g.limits, err, sizeof err) != VG_OK) {
        vg_log("%s: %s; failing closed", path, err);
        vg_g.mode = VG_MODE_BROKEN;
        return;
    }
    if (vg_region_open(vg_g.limits.region, &vg_g.region, err, sizeof err) != VG_OK) {
        vg_log("usage region: %s; failing closed", err);
        vg_g.mode = VG_MODE_BROKEN;
        return;
    }
    pthread_atfork(NULL, NULL, vg_atfork_child);
    vg_g.mode = VG_MODE_ACTIVE;
}

vg_mode vg_init(void) {
    pthread_once(&vg_once, vg_do_init);
    return vg_g.mode;
}

int vg_my_slot(void) {
    int s = __atomic_load_n(&vg_g.slot, __ATOMIC_ACQUIRE);
    if (s >= 0) return s;
    pthread_mutex_lock(&vg_slot_mu);
    if (vg_g.slot < 0) {
        s = vg_region_claim(vg_g.region, vg_g.pid);
        if (s < 0) vg_log("usage region: all %d process slots are live", VG_MAX_SLOTS);
        __atomic_store_n(&vg_g.slot, s, __ATOMIC_RELEASE);
    }
    s = vg_g.slot;
    pthread_mutex_unlock(&vg_slot_mu);
    return s;
}

__attribute__((destructor)) static void vg_fini(void) {
    if (vg_g.mode == VG_MODE_ACTIVE && vg_g.slot >= 0 && vg_g.pid == getpid())
        vg_region_release(vg_g.region, vg_g.slot);
}

int vg_card_of_uuid(const char *uuid) {
    for (int i = 0; i < vg_g.limits.ncards; i++)
        if (strcasecmp(vg_g.limits.cards[i].uuid, uuid) == 0) return i;
    return -1;
}

int vg_card_of_dev(CUdevice dev) {
    if (dev < 0 || dev >= VG_MAX_DEVS) return -1;
    int c = __atomic_load_n(&vg_g.dev_card[dev], __ATOMIC_RELAXED);
    if (c != -2) return c;
    CUuuid u;
    if (VG_CALL(cuDeviceGetUuid, &u, dev) == CUDA_SUCCESS) {
        const unsigned char *b = (const unsigned char *)u.bytes;
        char s[48];
        snprintf(s, sizeof s,
                 "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
                 b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
                 b[14], b[15]);
        c = vg_card_of_uuid(s);
    } else {
        c = dev < vg_g.limits.ncards ? dev : -1;
    }
    __atomic_store_n(&vg_g.dev_card[dev], c, __ATOMIC_RELAXED);
    return c;
}

int vg_current_card(int *card) {
    CUdevice dev = -1;
    if (VG_CALL(cuCtxGetDevice, &dev) != CUDA_SUCCESS) return -1;
    *card = vg_card_of_dev(dev);
    return 0;
}
