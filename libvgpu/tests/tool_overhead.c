/*
 * tool_overhead.c - nanoseconds per call of the intercepted entry points against the fake
 * driver, for bench/libvgpu_bench.py. Run it without libvgpu and with it; the difference
 * is libvgpu's cost per call (the fake driver's own cost is a few ns).
 *
 *   tool_overhead ITERATIONS
 *
 * Prints "<call> <ns per call>" lines.
 */
#include "vgt_drv.h"

static double per_call(uint64_t t0, uint64_t n) { return (double)(vgt_now_ns() - t0) / (double)n; }

int main(int argc, char **argv) {
    uint64_t n = argc > 1 ? strtoull(argv[1], NULL, 10) : 200000;
    vgt_ctx(0);
    CUfunction f = vgt_kernel(0);
    CUdeviceptr p = 0;
    size_t fr = 0, tot = 0;
    for (uint64_t i = 0; i < n / 10; i++) cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);

    uint64_t t0 = vgt_now_ns();
    for (uint64_t i = 0; i < n; i++) cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
    printf("cuLaunchKernel %.1f\n", per_call(t0, n));

    t0 = vgt_now_ns();
    for (uint64_t i = 0; i < n; i++) cuGraphLaunch((CUgraphExec)f, NULL);
    printf("cuGraphLaunch %.1f\n", per_call(t0, n));

    CUstream s = NULL;
    CHECK_RC(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    t0 = vgt_now_ns();
    for (uint64_t i = 0; i < n; i++) cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s, NULL, NULL);
    printf("cuLaunchKernel (non-blocking stream) %.1f\n", per_call(t0, n));

    /* Launches recorded into a capture (CUDA graphs): nothing runs, nothing is gated. */
    CUgraph g = NULL;
    CHECK_RC(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
    t0 = vgt_now_ns();
    for (uint64_t i = 0; i < n; i++) cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s, NULL, NULL);
    printf("cuLaunchKernel (into a capture) %.1f\n", per_call(t0, n));
    CUresult ended = cuStreamEndCapture(s, &g);
    if (ended == CUDA_SUCCESS) cuGraphDestroy(g);
    else fprintf(stderr, "the capture was invalidated (%d)\n", ended);
    CHECK_RC(cuStreamSynchronize(s), CUDA_SUCCESS);
    CHECK_RC(cuStreamDestroy_v2(s), CUDA_SUCCESS);

    uint64_t m = n / 10;
    t0 = vgt_now_ns();
    for (uint64_t i = 0; i < m; i++) {
        CHECK_RC(cuMemAlloc_v2(&p, 4096), CUDA_SUCCESS);
        CHECK_RC(cuMemFree_v2(p), CUDA_SUCCESS);
    }
    printf("cuMemAlloc_v2+cuMemFree_v2 %.1f\n", per_call(t0, m));

    t0 = vgt_now_ns();
    for (uint64_t i = 0; i < m; i++) CHECK_RC(cuMemGetInfo_v2(&fr, &tot), CUDA_SUCCESS);
    printf("cuMemGetInfo_v2 %.1f\n", per_call(t0, m));
    return 0;
}
