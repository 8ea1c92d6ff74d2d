/* drv_storm.c - many threads in two processes allocate and free at once: the accounting
 * stays exact and the cap is never passed. */
#include <pthread.h>

#include "vgt_drv.h"

#define CAP_MIB 128ull
#define THREADS 8
#define OPS 3000

static uint64_t refused_seen;

static void *storm(void *arg) {
    unsigned seed = (unsigned)(uintptr_t)arg * 2654435761u;
    CUdeviceptr held[16] = {0};
    CUcontext c = NULL;
    CHECK_RC(cuDevicePrimaryCtxRetain(&c, 0), CUDA_SUCCESS);
    CHECK_RC(cuCtxSetCurrent(c), CUDA_SUCCESS);
    for (int i = 0; i < OPS; i++) {
        int k = (int)(rand_r(&seed) % 16);
        if (held[k]) {
            CHECK_RC(cuMemFree_v2(held[k]), CUDA_SUCCESS);
            held[k] = 0;
        } else {
            size_t n = (1 + rand_r(&seed) % 16) * VGT_MIB - (rand_r(&seed) % 4096);
            CUresult r = (i & 1) ? cuMemAlloc_v2(&held[k], n) : cuMemAllocAsync(&held[k], n, NULL);
            CHECK(r == CUDA_SUCCESS || r == CUDA_ERROR_OUT_OF_MEMORY, "alloc returned %d", r);
            if (r != CUDA_SUCCESS) {
                held[k] = 0;
                __atomic_fetch_add(&refused_seen, 1, __ATOMIC_RELAXED);
            }
        }
    }
    for (int k = 0; k < 16; k++)
        if (held[k]) CHECK_RC(cuMemFree_v2(held[k]), CUDA_SUCCESS);
    return NULL;
}

static uint64_t run_storm(void) {
    vgt_ctx(0);
    pthread_t th[THREADS];
    for (uintptr_t i = 0; i < THREADS; i++) pthread_create(&th[i], NULL, storm, (void *)(i + 1 + (uintptr_t)getpid()));
    for (int i = 0; i < THREADS; i++) pthread_join(th[i], NULL);
    CHECK(fakecuda_peak(0) <= CAP_MIB * VGT_MIB, "the device held %llu bytes, over the cap",
          (unsigned long long)fakecuda_peak(0));
    CHECK(fakecuda_used(0) == 0, "device memory left: %llu", (unsigned long long)fakecuda_used(0));
    return refused_seen;
}

static void allocation_storm_keeps_exact_accounting(void) {
    vgt_card c = {0, CAP_MIB, 100, "fixed-share"};
    const char *dir = vgt_limits(1, &c);
    int fds[2];
    CHECK(pipe(fds) == 0, "pipe");
    fflush(NULL);
    pid_t other = fork();
    if (other == 0) {
        uint64_t n = run_storm();
        if (write(fds[1], &n, sizeof n) != sizeof n) _exit(3);
        _exit(0);
    }
    uint64_t mine = run_storm(), theirs = 0;
    CHECK(read(fds[0], &theirs, sizeof theirs) == sizeof theirs, "child report");
    int st = 0;
    waitpid(other, &st, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "storm in the second process failed (%d)", st);
    const vg_region *r = vgt_region(dir);
    CHECK(vgt_used(r, 0) == 0, "region says %llu bytes still used", (unsigned long long)vgt_used(r, 0));
    CHECK(vgt_refused(r, 0) == mine + theirs, "region counted %llu refusals, the threads saw %llu",
          (unsigned long long)vgt_refused(r, 0), (unsigned long long)(mine + theirs));
    CHECK(mine + theirs > 0, "the storm never reached the cap; make it harder");
}

VGT_MAIN(VGT_CASE(allocation_storm_keeps_exact_accounting))
