/*
 * tool_loop.c - a GPU-bound launch loop on the fake driver that reports the share of the
 * device its own kernels got, for the burst-share end-to-end test and bench/.
 *
 *   tool_loop DEV KERNEL_NS DURATION_MS REPORT_MS [START_DELAY_MS [STREAMS]]
 *
 * STREAMS (default 0): 0 launches on the legacy stream; N > 0 alternates between N
 * non-blocking streams (the shape of NCCL and side-stream work).
 * Every REPORT_MS it prints "<ms since start> <share %>" (its own kernels' simulated busy
 * time over the interval), and at the end "total <share %>" over the whole run.
 */
#include "vgt_drv.h"

#define MAX_STREAMS 128

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: tool_loop DEV KERNEL_NS DURATION_MS REPORT_MS [START_DELAY_MS [STREAMS]]\n");
        return 2;
    }
    int dev = atoi(argv[1]);
    uint64_t kns = strtoull(argv[2], NULL, 10), dur = strtoull(argv[3], NULL, 10) * 1000000ull;
    uint64_t rep = strtoull(argv[4], NULL, 10) * 1000000ull;
    if (argc > 5) usleep((useconds_t)(strtoull(argv[5], NULL, 10) * 1000));
    int nstreams = argc > 6 ? atoi(argv[6]) : 0;
    if (nstreams < 0 || nstreams > MAX_STREAMS) {
        fprintf(stderr, "tool_loop: STREAMS must be 0..%d, got %s\n", MAX_STREAMS, argv[6]);
        return 2;
    }
    vgt_ctx(dev);
    CUfunction f = vgt_kernel(kns);
    CUstream streams[MAX_STREAMS] = {NULL};
    for (int i = 0; i < nstreams; i++) CHECK_RC(cuStreamCreate(&streams[i], CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    uint64_t start = vgt_now_ns(), next = start + rep, end = start + dur, last = start;
    int pid = getpid();
    for (uint64_t i = 0; vgt_now_ns() < end; i++) {
        CUstream s = nstreams ? streams[i % (uint64_t)nstreams] : NULL;
        CHECK_RC(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s, NULL, NULL), CUDA_SUCCESS);
        uint64_t now = vgt_now_ns();
        if (now >= next) {
            double share = 100.0 * (double)fakecuda_busy_between_pid(dev, last, now, pid) / (double)(now - last);
            printf("%llu %.2f\n", (unsigned long long)((now - start) / 1000000ull), share);
            fflush(stdout);
            last = now;
            next = now + rep;
        }
    }
    uint64_t now = vgt_now_ns();
    printf("total %.2f\n", 100.0 * (double)fakecuda_busy_between_pid(dev, start, now, pid) / (double)(now - start));
    return 0;
}
