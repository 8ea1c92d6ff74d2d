/*
 * tool_usage.c - an application that leaves known usage in its container's region, for
 * the Python reader's test (tests/integration/test_libvgpu.py).
 *
 *   tool_usage [alloc DEV MIB | oom DEV MIB | launch DEV N]...
 *
 * Runs the steps, prints "ready <pid>", then holds everything until stdin closes and exits
 * normally. Run with libvgpu preloaded and TESSERA_TEST_LIMITS set.
 */
#include "vgt_drv.h"

int main(int argc, char **argv) {
    CUfunction f = NULL;
    CHECK_RC(cuInit(0), CUDA_SUCCESS);
    for (int i = 1; i + 2 < argc; i += 3) {
        int dev = atoi(argv[i + 1]);
        unsigned long long n = strtoull(argv[i + 2], NULL, 10);
        vgt_ctx(dev);
        CUdeviceptr p = 0;
        if (strcmp(argv[i], "alloc") == 0) {
            CHECK_RC(cuMemAlloc_v2(&p, n * VGT_MIB), CUDA_SUCCESS);
        } else if (strcmp(argv[i], "oom") == 0) {
            CHECK_RC(cuMemAlloc_v2(&p, n * VGT_MIB), CUDA_ERROR_OUT_OF_MEMORY);
        } else if (strcmp(argv[i], "launch") == 0) {
            if (f == NULL) f = vgt_kernel(1000);
            for (unsigned long long k = 0; k < n; k++)
                CHECK_RC(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL), CUDA_SUCCESS);
        } else {
            fprintf(stderr, "unknown step %s\n", argv[i]);
            return 2;
        }
    }
    printf("ready %d\n", (int)getpid());
    fflush(stdout);
    char buf[64];
    while (fread(buf, 1, sizeof buf, stdin) > 0) {
    }
    return 0;
}
