/*
 * tool_bypass.c - a tenant that corrupts its own usage region to get device memory past
 * its cap, for the node agent's memory backstop test (tests/e2e/test_realnode.py):
 *
 *   tool_bypass REGION MIB ROUNDS
 *
 * Each round allocates MIB MiB through libvgpu (preloaded as in any container), then
 * zeroes every process's memory figure in the region, so libvgpu's next check sees an
 * empty card. Prints "passed-cap SECONDS" (CLOCK_REALTIME) when the second round takes
 * it past a cap of MIB, then "bypassed PID TOTAL_MIB", and holds the memory for 120 s.
 *
 * The region is the container's own and must be writable by it (its processes write their
 * usage there), so libvgpu alone cannot stop this: only what reads the driver's own
 * per-process figures (NVML on a GPU node, the fake device files here) can.
 */
#include "vgt_drv.h"

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: tool_bypass REGION MIB ROUNDS\n");
        return 2;
    }
    unsigned long long mib = strtoull(argv[2], NULL, 10);
    int rounds = atoi(argv[3]);
    vgt_ctx(0);
    int fd = open(argv[1], O_RDWR);
    CHECK(fd >= 0, "open %s: %s", argv[1], strerror(errno));
    vg_region *r = mmap(NULL, sizeof(vg_region), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    CHECK(r != MAP_FAILED, "mmap region");
    for (int i = 0; i < rounds; i++) {
        CUdeviceptr p = 0;
        CHECK_RC(cuMemAlloc_v2(&p, mib * VGT_MIB), CUDA_SUCCESS);
        if (i == 1) { /* the second round passes a cap of MIB: when, for the benchmark */
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            printf("passed-cap %lld.%09ld\n", (long long)ts.tv_sec, ts.tv_nsec);
        }
        for (int s = 0; s < VG_MAX_SLOTS; s++)
            for (int c = 0; c < VG_MAX_CARDS; c++) __atomic_store_n(&r->slots[s].cards[c].mem_used, 0, __ATOMIC_RELAXED);
    }
    printf("bypassed %d %llu\n", (int)getpid(), mib * (unsigned long long)rounds);
    fflush(stdout);
    sleep(120);
    return 0;
}
