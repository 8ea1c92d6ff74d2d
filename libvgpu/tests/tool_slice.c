/*
 * tool_slice.c - what a container's process sees of its cards, for the real-node e2e
 * (tests/e2e/realnode) and by hand in a pod:
 *
 *   tool_slice            per visible card: "card ORD uuid=U total_mib=T free_mib=F"
 *                         (cuMemGetInfo), then "fill ORD ok=N oom=1" after allocating the
 *                         whole reported total in 1 MiB steps and one more that must fail
 *
 * Exits 0 when every allocation up to the reported total succeeded and the next one was
 * refused with CUDA_ERROR_OUT_OF_MEMORY; 1 otherwise. Run with libvgpu preloaded.
 */
#include "vgt_drv.h"

int main(void) {
    int n = 0, bad = 0;
    CHECK_RC(cuInit(0), CUDA_SUCCESS);
    CHECK_RC(cuDeviceGetCount(&n), CUDA_SUCCESS);
    for (int dev = 0; dev < n; dev++) {
        vgt_ctx(dev);
        CUuuid u;
        CHECK_RC(cuDeviceGetUuid(&u, dev), CUDA_SUCCESS);
        const unsigned char *b = (const unsigned char *)u.bytes;
        size_t free_b = 0, total_b = 0;
        CHECK_RC(cuMemGetInfo_v2(&free_b, &total_b), CUDA_SUCCESS);
        printf("card %d uuid=GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-"
               "%02x%02x%02x%02x%02x%02x total_mib=%zu free_mib=%zu\n",
               dev, b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11],
               b[12], b[13], b[14], b[15], total_b >> 20, free_b >> 20);
        size_t ok = 0;
        CUdeviceptr p = 0;
        while (ok < (free_b >> 20) && cuMemAlloc_v2(&p, VGT_MIB) == CUDA_SUCCESS) ok++;
        CUresult over = cuMemAlloc_v2(&p, VGT_MIB);
        printf("fill %d ok=%zu oom=%d\n", dev, ok, over == CUDA_ERROR_OUT_OF_MEMORY);
        if (ok != (free_b >> 20) || over != CUDA_ERROR_OUT_OF_MEMORY) bad = 1;
    }
    fflush(stdout);
    return bad;
}
