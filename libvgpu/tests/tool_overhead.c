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
