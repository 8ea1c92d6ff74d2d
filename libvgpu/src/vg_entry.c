/*
 * vg_entry.c - cuInit and the by-name entry point lookups. The CUDA 12 runtime reaches
 * every driver function through cuGetProcAddress(_v2); each pointer it would get is
 * swapped for libvgpu's hook of the same versioned name (vg_hook_for_proc).
 */
#include "vg_export.h"
#include "vg_real.h"
#include "vg_state.h"

VG_EXPORT CUresult cuInit(unsigned int flags) {
    if (vg_init() == VG_MODE_BROKEN) return CUDA_ERROR_NOT_INITIALIZED;
    return VG_CALL(cuInit, flags);
}

VG_EXPORT CUresult cuGetProcAddress(const char *sym, void **pfn, int ver, cuuint64_t flags) {
    CUresult r = VG_CALL(cuGetProcAddress, sym, pfn, ver, flags);
    if (r == CUDA_SUCCESS && pfn != NULL) *pfn = vg_hook_for_proc(sym, *pfn, ver, flags);
    return r;
}

VG_EXPORT CUresult cuGetProcAddress_v2(const char *sym, void **pfn, int ver, cuuint64_t flags,
                                       CUdriverProcAddressQueryResult *status) {
    CUresult r = VG_CALL(cuGetProcAddress_v2, sym, pfn, ver, flags, status);
    if (r == CUDA_SUCCESS && pfn != NULL) *pfn = vg_hook_for_proc(sym, *pfn, ver, flags);
    return r;
}
