/*
 * vg_real.h - the intercepted symbols, listed once (VG_CUDA_FUNCS / VG_NVML_FUNCS in the
 * include/ headers), and how libvgpu reaches the real driver behind them.
 *
 * From the tables this module derives: an enum per symbol, the name table, the table of
 * hooks (libvgpu's exported functions of the same names), and the real functions resolved
 * with the real dlsym from libcuda.so.1 / libnvidia-ml.so.1. It also owns the three ways an
 * application can reach a driver function other than a direct call: dlsym (overridden
 * here), cuGetProcAddress and cuGetProcAddress_v2.
 */
#ifndef VG_REAL_H
#define VG_REAL_H

#include "vg_cuda.h"
#include "vg_nvml.h"

#define VG_ENUM(name, params, args) VG_CU_##name,
enum { VG_CUDA_FUNCS(VG_ENUM) VG_CUDA_USED(VG_ENUM) VG_CU_COUNT };
#undef VG_ENUM
#define VG_ENUM(name, params, args) VG_NV_##name,
enum { VG_NVML_FUNCS(VG_ENUM) VG_NVML_USED(VG_ENUM) VG_NV_COUNT };
#undef VG_ENUM

#define VG_TYPEDEF(name, params, args) typedef CUresult(*vg_##name##_fn) params;
VG_CUDA_FUNCS(VG_TYPEDEF)
VG_CUDA_USED(VG_TYPEDEF)
#undef VG_TYPEDEF
#define VG_TYPEDEF(name, params, args) typedef nvmlReturn_t(*vg_##name##_fn) params;
VG_NVML_FUNCS(VG_TYPEDEF)
VG_NVML_USED(VG_TYPEDEF)
#undef VG_TYPEDEF

/* The real driver function (NULL when the driver lacks it). Thread-safe; resolves once. */
void *vg_cuda_real(int sym);
void *vg_nvml_real(int sym);

/* Call the real function, or answer `missing` when the driver does not have it. */
#define VG_CALL_OR(missing, name, ...)                                                       \
    __extension__({                                                                          \
        vg_##name##_fn fn_ = (vg_##name##_fn)vg_cuda_real(VG_CU_##name);                     \
        fn_ ? fn_(__VA_ARGS__) : (missing);                                                  \
    })
#define VG_CALL(name, ...) VG_CALL_OR(CUDA_ERROR_NOT_FOUND, name, __VA_ARGS__)
#define VG_NVCALL(name, ...)                                                                 \
    __extension__({                                                                          \
        vg_##name##_fn fn_ = (vg_##name##_fn)vg_nvml_real(VG_NV_##name);                     \
        fn_ ? fn_(__VA_ARGS__) : NVML_ERROR_UNINITIALIZED;                                   \
    })

/* libvgpu's hook for a symbol name, or NULL if it is not intercepted. */
void *vg_hook_by_name(const char *name);

/* What cuGetProcAddress should hand out for a real driver pointer that it returned for
 * `sym` (base name, as asked): the matching hook, or real itself. */
void *vg_hook_for_proc(const char *sym, void *real, int cuda_version, cuuint64_t flags);

#endif /* VG_REAL_H */
