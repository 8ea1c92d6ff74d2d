/*
 * vg_context.c - the charge per CUDA context.
 *
 * A context's own driver memory (code, stacks, the printf and malloc heaps: hundreds of
 * MiB on a real GPU) is outside every allocation the application makes. libvgpu charges
 * the limits file's context_mib against the card's cap for each context: every created
 * context (cuCtxCreate, _v2, _v3, _v4) and green context until it is destroyed, and the
 * device's primary context once per process while it is retained (the CUDA runtime
 * retains it on first use). Over the cap the driver is not called and the caller gets
 * CUDA_ERROR_OUT_OF_MEMORY, as it would from a full card. context_mib=0 (the default)
 * charges nothing: what a context costs depends on the GPU and the driver, so the node
 * agent sets it (docs/libvgpu.md).
 */
#include <pthread.h>
#include <stdint.h>

#include "vg_export.h"
#include "vg_hold.h"
#include "vg_real.h"
#include "vg_state.h"

static pthread_mutex_t vg_primary_mu = PTHREAD_MUTEX_INITIALIZER;
static int vg_primary_refs[VG_MAX_DEVS];
static vg_hold vg_primary_hold[VG_MAX_DEVS];
static pthread_once_t vg_context_once = PTHREAD_ONCE_INIT;

/* A child of fork has retained nothing (its parent's contexts are not its own). */
static void vg_context_atfork_child(void) {
    pthread_mutex_init(&vg_primary_mu, NULL);
    for (int i = 0; i < VG_MAX_DEVS; i++) {
        vg_primary_refs[i] = 0;
        vg_primary_hold[i].held = 0;
    }
}

static void vg_context_register_atfork(void) { pthread_atfork(NULL, NULL, vg_context_atfork_child); }

/* The charge for a context on dev: 0 when nothing is charged (inert, context_mib=0, an
 * out-of-range device or a NULL out-pointer, which the driver answers). */
static uint64_t vg_context_charge(const void *out, CUdevice dev) {
    if (vg_g.mode != VG_MODE_ACTIVE || out == NULL || dev < 0 || dev >= VG_MAX_DEVS) return 0;
    return vg_g.limits.context_bytes;
}

/* Created and green contexts: held under their handle in vg_ctxs until destroyed. */
#define VG_CTX_CREATE(name, params, args, out, dev)                                          \
    VG_EXPORT CUresult name params {                                                         \
        vg_hold h;                                                                           \
        VG_GUARD();                                                                          \
        uint64_t bytes = vg_context_charge(out, dev);                                        \
        CUresult r = vg_hold_card(bytes ? vg_card_of_dev(dev) : -1, bytes, &h);              \
        if (r != CUDA_SUCCESS) return r;                                                     \
        r = VG_CALL(name, VG_UNPAREN args);                                                  \
        vg_hold_done(&h, r, &vg_ctxs, r == CUDA_SUCCESS ? (uint64_t)(uintptr_t)*(out) : 0);  \
        return r;                                                                            \
    }
#define VG_CTX_DESTROY(name, type)                                                           \
    VG_EXPORT CUresult name(type c) {                                                        \
        vg_hold h;                                                                           \
        VG_GUARD();                                                                          \
        vg_forget_begin(&vg_ctxs, (uint64_t)(uintptr_t)c, &h);                               \
        CUresult r = VG_CALL(name, c);                                                       \
        vg_forget_end(&vg_ctxs, (uint64_t)(uintptr_t)c, &h, r);                              \
        return r;                                                                            \
    }

VG_CTX_CREATE(cuCtxCreate, (CUcontext *c, unsigned int flags, CUdevice dev), (c, flags, dev), c, dev)
VG_CTX_CREATE(cuCtxCreate_v2, (CUcontext *c, unsigned int flags, CUdevice dev), (c, flags, dev), c, dev)
VG_CTX_CREATE(cuCtxCreate_v3,
              (CUcontext *c, CUexecAffinityParam *p, int n, unsigned int flags, CUdevice dev),
              (c, p, n, flags, dev), c, dev)
VG_CTX_CREATE(cuCtxCreate_v4, (CUcontext *c, CUctxCreateParams *p, unsigned int flags, CUdevice dev),
              (c, p, flags, dev), c, dev)
VG_CTX_CREATE(cuGreenCtxCreate, (CUgreenCtx *g, CUdevResourceDesc desc, CUdevice dev, unsigned int flags),
              (g, desc, dev, flags), g, dev)
VG_CTX_DESTROY(cuCtxDestroy, CUcontext)
VG_CTX_DESTROY(cuCtxDestroy_v2, CUcontext)
VG_CTX_DESTROY(cuGreenCtxDestroy, CUgreenCtx)

/* The primary context: charged when this process's retain count goes from 0 to 1, given
 * back when it returns to 0 (release) or the context is reset. */
VG_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice dev) {
    VG_GUARD();
    uint64_t bytes = vg_context_charge(c, dev);
    if (bytes == 0) return VG_CALL(cuDevicePrimaryCtxRetain, c, dev);
    pthread_once(&vg_context_once, vg_context_register_atfork);
    pthread_mutex_lock(&vg_primary_mu);
    vg_hold h = {-1, 0, 0};
    CUresult r = vg_primary_refs[dev] == 0 ? vg_hold_card(vg_card_of_dev(dev), bytes, &h) : CUDA_SUCCESS;
    if (r == CUDA_SUCCESS) {
        r = VG_CALL(cuDevicePrimaryCtxRetain, c, dev);
        if (r == CUDA_SUCCESS && vg_primary_refs[dev]++ == 0)
            vg_primary_hold[dev] = h;
        else if (r != CUDA_SUCCESS)
            vg_hold_done(&h, r, &vg_ctxs, 0); /* gives the charge back */
    }
    pthread_mutex_unlock(&vg_primary_mu);
    return r;
}

static void vg_primary_drop(CUdevice dev, int reset) {
    if (dev < 0 || dev >= VG_MAX_DEVS) return;
    pthread_mutex_lock(&vg_primary_mu);
    if (reset)
        vg_primary_refs[dev] = 0;
    else if (vg_primary_refs[dev] > 0)
        vg_primary_refs[dev]--;
    if (vg_primary_refs[dev] == 0 && vg_primary_hold[dev].held) {
        vg_hold_done(&vg_primary_hold[dev], CUDA_ERROR_UNKNOWN, &vg_ctxs, 0); /* gives it back */
        vg_primary_hold[dev].held = 0;
    }
    pthread_mutex_unlock(&vg_primary_mu);
}

#define VG_PRIMARY_DROP(name, reset)                                                         \
    VG_EXPORT CUresult name(CUdevice dev) {                                                  \
        VG_GUARD();                                                                          \
        CUresult r = VG_CALL(name, dev);                                                     \
        if (r == CUDA_SUCCESS && vg_g.mode == VG_MODE_ACTIVE) vg_primary_drop(dev, reset);   \
        return r;                                                                            \
    }
VG_PRIMARY_DROP(cuDevicePrimaryCtxRelease, 0)
VG_PRIMARY_DROP(cuDevicePrimaryCtxRelease_v2, 0)
VG_PRIMARY_DROP(cuDevicePrimaryCtxReset, 1)
VG_PRIMARY_DROP(cuDevicePrimaryCtxReset_v2, 1)
