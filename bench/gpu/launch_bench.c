/*
 * launch_bench.c - launch-heavy microbenchmark on the real driver: an empty PTX kernel
 * launched N times, ns per launch (including a final synchronize). Built by
 * bench/gpu/run.sh with only libvgpu's headers; the driver is dlopen'ed, so libvgpu, when
 * preloaded, intercepts through its dlsym.
 *
 *   launch_bench N
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "vg_cuda.h"

static const char PTX[] =
    ".version 6.0\n.target sm_50\n.address_size 64\n"
    ".visible .entry empty() { ret; }\n";

#define SYM(name) ((__typeof__(&name))dlsym(h, #name))

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 200000;
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) return fprintf(stderr, "dlopen: %s\n", dlerror()), 1;
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CUfunction f;
    if (SYM(cuInit)(0) || SYM(cuDeviceGet)(&dev, 0) || SYM(cuDevicePrimaryCtxRetain)(&ctx, dev) ||
        SYM(cuCtxSetCurrent)(ctx) || SYM(cuModuleLoadData)(&mod, PTX) ||
        SYM(cuModuleGetFunction)(&f, mod, "empty"))
        return fprintf(stderr, "driver setup failed\n"), 1;
    __typeof__(&cuLaunchKernel) launch = SYM(cuLaunchKernel);
    __typeof__(&cuCtxSynchronize) sync = SYM(cuCtxSynchronize);
    for (long i = 0; i < n / 10; i++) launch(f, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL);
    sync();
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (long i = 0; i < n; i++) launch(f, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL);
    sync();
    clock_gettime(CLOCK_MONOTONIC, &b);
    printf("%.1f\n", ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / (double)n);
    return 0;
}
