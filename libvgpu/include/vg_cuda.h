/*
 * vg_cuda.h - the subset of the CUDA driver API that libvgpu and its fake driver use.
 *
 * Types, enum values and signatures are facts of NVIDIA's public ABI, taken from the
 * CUDA 12.x toolkit header cuda.h (driver API reference, docs.nvidia.com/cuda/cuda-driver-api).
 * No CUDA toolkit is needed to build against this header. Only what Tessera touches is
 * declared; structs are declared up to the fields libvgpu reads, which keep cuda.h's
 * offsets.
 */
#ifndef VG_CUDA_H
#define VG_CUDA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef int CUresult;
enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_NO_DEVICE = 100,
    CUDA_ERROR_INVALID_DEVICE = 101,
    CUDA_ERROR_INVALID_CONTEXT = 201,
    CUDA_ERROR_INVALID_HANDLE = 400,
    CUDA_ERROR_ILLEGAL_STATE = 401,
    CUDA_ERROR_NOT_FOUND = 500,
    CUDA_ERROR_NOT_READY = 600,
    CUDA_ERROR_NOT_SUPPORTED = 801,
    CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED = 900,
    CUDA_ERROR_STREAM_CAPTURE_INVALIDATED = 901,
    CUDA_ERROR_STREAM_CAPTURE_IMPLICIT = 906,
    CUDA_ERROR_CAPTURED_EVENT = 907,
    CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD = 908,
    CUDA_ERROR_UNKNOWN = 999,
};

typedef int CUdevice;
typedef unsigned long long CUdeviceptr;      /* CUdeviceptr_v2 */
typedef unsigned int CUdeviceptr_v1;         /* the pre-3.2 32-bit entry points */
typedef struct CUctx_st *CUcontext;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUstream_st *CUstream;
typedef struct CUarray_st *CUarray;
typedef struct CUgraph_st *CUgraph;
typedef struct CUgraphNode_st *CUgraphNode;
typedef struct CUDA_GRAPH_INSTANTIATE_PARAMS_st CUDA_GRAPH_INSTANTIATE_PARAMS; /* passed through */
typedef struct CUgraphExec_st *CUgraphExec;
typedef struct CUevent_st *CUevent;
typedef struct CUmemPoolHandle_st *CUmemoryPool;
typedef struct CUmipmappedArray_st *CUmipmappedArray;
typedef struct CUextMemory_st *CUexternalMemory;
typedef struct CUgreenCtx_st *CUgreenCtx;
typedef struct CUdevResourceDesc_st *CUdevResourceDesc;
typedef struct CUexecAffinityParam_st CUexecAffinityParam; /* only passed through */
typedef struct CUctxCreateParams_st CUctxCreateParams;     /* only passed through */
typedef unsigned long long CUmemGenericAllocationHandle;
typedef uint64_t cuuint64_t;

typedef struct CUuuid_st {
    char bytes[16];
} CUuuid;

/* Streams: creation flags, the two special handles, and stream capture. */
enum { CU_STREAM_DEFAULT = 0, CU_STREAM_NON_BLOCKING = 1 };
#define CU_STREAM_LEGACY ((CUstream)0x1)
#define CU_STREAM_PER_THREAD ((CUstream)0x2)
typedef enum {
    CU_STREAM_CAPTURE_STATUS_NONE = 0,
    CU_STREAM_CAPTURE_STATUS_ACTIVE = 1,
    CU_STREAM_CAPTURE_STATUS_INVALIDATED = 2,
} CUstreamCaptureStatus;
typedef enum {
    CU_STREAM_CAPTURE_MODE_GLOBAL = 0,
    CU_STREAM_CAPTURE_MODE_THREAD_LOCAL = 1,
    CU_STREAM_CAPTURE_MODE_RELAXED = 2,
} CUstreamCaptureMode;

/* cuGetProcAddress flags and status. */
enum {
    CU_GET_PROC_ADDRESS_DEFAULT = 0,
    CU_GET_PROC_ADDRESS_LEGACY_STREAM = 1,
    CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM = 2,
};
typedef enum {
    CU_GET_PROC_ADDRESS_SUCCESS = 0,
    CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND = 1,
    CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT = 2,
} CUdriverProcAddressQueryResult;

/* Virtual memory management (cuMemCreate) and pools. */
typedef enum { CU_MEM_ALLOCATION_TYPE_INVALID = 0, CU_MEM_ALLOCATION_TYPE_PINNED = 1 } CUmemAllocationType;
typedef enum { CU_MEM_HANDLE_TYPE_NONE = 0 } CUmemAllocationHandleType;
typedef enum {
    CU_MEM_LOCATION_TYPE_INVALID = 0,
    CU_MEM_LOCATION_TYPE_DEVICE = 1,
    CU_MEM_LOCATION_TYPE_HOST = 2,
    CU_MEM_LOCATION_TYPE_HOST_NUMA = 3,
    CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT = 4,
} CUmemLocationType;
typedef struct CUmemLocation_st {
    CUmemLocationType type;
    int id;
} CUmemLocation;
typedef struct CUmemAllocationProp_st {
    CUmemAllocationType type;
    CUmemAllocationHandleType requestedHandleTypes;
    CUmemLocation location;
    void *win32HandleMetaData;
    struct {
        unsigned char compressionType;
        unsigned char gpuDirectRDMACapable;
        unsigned short usage;
        unsigned char reserved[4];
    } allocFlags;
} CUmemAllocationProp;
typedef struct CUmemPoolProps_st {
    CUmemAllocationType allocType;
    CUmemAllocationHandleType handleTypes;
    CUmemLocation location;
    void *win32SecurityAttributes;
    size_t maxSize;
    unsigned short usage;
    unsigned char reserved[54];
} CUmemPoolProps;

typedef enum {
    CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES = 1,
    CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC = 2,
    CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES = 3,
    CU_MEMPOOL_ATTR_RELEASE_THRESHOLD = 4, /* cuuint64_t: freed bytes the pool keeps */
    CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT = 5,
    CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH = 6,
    CU_MEMPOOL_ATTR_USED_MEM_CURRENT = 7,
    CU_MEMPOOL_ATTR_USED_MEM_HIGH = 8,
} CUmemPool_attribute;

/* Graph memory nodes. */
typedef enum { CU_GRAPH_NODE_TYPE_KERNEL = 0, CU_GRAPH_NODE_TYPE_MEM_ALLOC = 10, CU_GRAPH_NODE_TYPE_MEM_FREE = 11 } CUgraphNodeType;
typedef struct CUmemAccessDesc_st CUmemAccessDesc;
typedef struct CUDA_MEM_ALLOC_NODE_PARAMS_st {
    CUmemPoolProps poolProps;
    const CUmemAccessDesc *accessDescs;
    size_t accessDescCount;
    size_t bytesize;
    CUdeviceptr dptr; /* out */
} CUDA_MEM_ALLOC_NODE_PARAMS;

/* Arrays. */
typedef enum {
    CU_AD_FORMAT_UNSIGNED_INT8 = 0x01,
    CU_AD_FORMAT_UNSIGNED_INT16 = 0x02,
    CU_AD_FORMAT_UNSIGNED_INT32 = 0x03,
    CU_AD_FORMAT_SIGNED_INT8 = 0x08,
    CU_AD_FORMAT_SIGNED_INT16 = 0x09,
    CU_AD_FORMAT_SIGNED_INT32 = 0x0a,
    CU_AD_FORMAT_HALF = 0x10,
    CU_AD_FORMAT_FLOAT = 0x20,
} CUarray_format;
typedef struct CUDA_ARRAY_DESCRIPTOR_st {
    size_t Width;
    size_t Height;
    CUarray_format Format;
    unsigned int NumChannels;
} CUDA_ARRAY_DESCRIPTOR;
typedef struct CUDA_ARRAY3D_DESCRIPTOR_st {
    size_t Width;
    size_t Height;
    size_t Depth;
    CUarray_format Format;
    unsigned int NumChannels;
    unsigned int Flags;
} CUDA_ARRAY3D_DESCRIPTOR;

/* External memory (Vulkan, D3D, NvSciBuf, ...). */
typedef struct CUDA_EXTERNAL_MEMORY_HANDLE_DESC_st {
    int type; /* CUexternalMemoryHandleType */
    union {
        int fd;
        struct {
            void *handle;
            const void *name;
        } win32;
        const void *nvSciBufObject;
    } handle;
    unsigned long long size;
    unsigned int flags;
    unsigned int reserved[16];
} CUDA_EXTERNAL_MEMORY_HANDLE_DESC;

/* Launches. */
typedef struct CUlaunchAttribute_st CUlaunchAttribute;
typedef struct CUlaunchConfig_st {
    unsigned int gridDimX, gridDimY, gridDimZ;
    unsigned int blockDimX, blockDimY, blockDimZ;
    unsigned int sharedMemBytes;
    CUstream hStream;
    CUlaunchAttribute *attrs;
    unsigned int numAttrs;
} CUlaunchConfig;
typedef struct CUDA_LAUNCH_PARAMS_st {
    CUfunction function;
    unsigned int gridDimX, gridDimY, gridDimZ;
    unsigned int blockDimX, blockDimY, blockDimZ;
    unsigned int sharedMemBytes;
    CUstream hStream;
    void **kernelParams;
} CUDA_LAUNCH_PARAMS;

#define VG_LAUNCH_ARGS_DECL                                                                  \
    CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,       \
        unsigned int by, unsigned int bz, unsigned int shmem, CUstream stream
#define VG_LAUNCH_ARGS f, gx, gy, gz, bx, by, bz, shmem, stream

/*
 * The driver entry points libvgpu intercepts, each with its exact signature:
 * X(name, parameter list, argument list). The library expands this one table into its
 * symbol enum, name table, real-function pointers and exported hooks (STYLE.md).
 */
#define VG_CUDA_FUNCS(X)                                                                     \
    VG_CUDA_MEM_FUNCS(X) VG_CUDA_CTX_FUNCS(X) VG_CUDA_LAUNCH_FUNCS(X) VG_CUDA_ENTRY_FUNCS(X)

/* Memory: every allocation path, its free, and the queries that report the slice. */
#define VG_CUDA_MEM_FUNCS(X)                                                                 \
    X(cuDeviceTotalMem, (unsigned int *bytes, CUdevice dev), (bytes, dev))                   \
    X(cuDeviceTotalMem_v2, (size_t *bytes, CUdevice dev), (bytes, dev))                      \
    X(cuMemGetInfo, (unsigned int *free_b, unsigned int *total), (free_b, total))            \
    X(cuMemGetInfo_v2, (size_t *free_b, size_t *total), (free_b, total))                     \
    X(cuMemAlloc, (CUdeviceptr_v1 *dptr, unsigned int size), (dptr, size))                   \
    X(cuMemAlloc_v2, (CUdeviceptr *dptr, size_t size), (dptr, size))                         \
    X(cuMemAllocPitch, (CUdeviceptr_v1 *dptr, unsigned int *pitch, unsigned int w,           \
                        unsigned int h, unsigned int elem), (dptr, pitch, w, h, elem))       \
    X(cuMemAllocPitch_v2, (CUdeviceptr *dptr, size_t *pitch, size_t w, size_t h,             \
                           unsigned int elem), (dptr, pitch, w, h, elem))                    \
    X(cuMemAllocManaged, (CUdeviceptr *dptr, size_t size, unsigned int flags),               \
      (dptr, size, flags))                                                                   \
    X(cuMemFree, (CUdeviceptr_v1 dptr), (dptr))                                              \
    X(cuMemFree_v2, (CUdeviceptr dptr), (dptr))                                              \
    X(cuMemAllocAsync, (CUdeviceptr *dptr, size_t size, CUstream s), (dptr, size, s))        \
    X(cuMemAllocAsync_ptsz, (CUdeviceptr *dptr, size_t size, CUstream s), (dptr, size, s))   \
    X(cuMemAllocFromPoolAsync, (CUdeviceptr *dptr, size_t size, CUmemoryPool pool,           \
                                CUstream s), (dptr, size, pool, s))                          \
    X(cuMemAllocFromPoolAsync_ptsz, (CUdeviceptr *dptr, size_t size, CUmemoryPool pool,      \
                                     CUstream s), (dptr, size, pool, s))                     \
    X(cuMemFreeAsync, (CUdeviceptr dptr, CUstream s), (dptr, s))                             \
    X(cuMemFreeAsync_ptsz, (CUdeviceptr dptr, CUstream s), (dptr, s))                        \
    X(cuMemPoolCreate, (CUmemoryPool *pool, const CUmemPoolProps *props), (pool, props))     \
    X(cuMemPoolDestroy, (CUmemoryPool pool), (pool))                                         \
    X(cuMemPoolSetAttribute, (CUmemoryPool pool, CUmemPool_attribute attr, void *value),     \
      (pool, attr, value))                                                                   \
    X(cuMemPoolTrimTo, (CUmemoryPool pool, size_t keep), (pool, keep))                       \
    X(cuMemCreate, (CUmemGenericAllocationHandle *h, size_t size,                            \
                    const CUmemAllocationProp *prop, unsigned long long flags),              \
      (h, size, prop, flags))                                                                \
    X(cuMemRelease, (CUmemGenericAllocationHandle h), (h))                                   \
    X(cuArrayCreate, (CUarray *a, const CUDA_ARRAY_DESCRIPTOR *d), (a, d))                   \
    X(cuArrayCreate_v2, (CUarray *a, const CUDA_ARRAY_DESCRIPTOR *d), (a, d))                \
    X(cuArray3DCreate, (CUarray *a, const CUDA_ARRAY3D_DESCRIPTOR *d), (a, d))               \
    X(cuArray3DCreate_v2, (CUarray *a, const CUDA_ARRAY3D_DESCRIPTOR *d), (a, d))            \
    X(cuArrayDestroy, (CUarray a), (a))                                                      \
    X(cuMipmappedArrayCreate, (CUmipmappedArray *m, const CUDA_ARRAY3D_DESCRIPTOR *d,        \
                               unsigned int levels), (m, d, levels))                         \
    X(cuMipmappedArrayDestroy, (CUmipmappedArray m), (m))                                    \
    X(cuImportExternalMemory, (CUexternalMemory *m,                                          \
                               const CUDA_EXTERNAL_MEMORY_HANDLE_DESC *d), (m, d))           \
    X(cuDestroyExternalMemory, (CUexternalMemory m), (m))                                    \
    X(cuGraphInstantiate, (CUgraphExec *e, CUgraph g, CUgraphNode *err, char *log,           \
                           size_t n), (e, g, err, log, n))                                   \
    X(cuGraphInstantiate_v2, (CUgraphExec *e, CUgraph g, CUgraphNode *err, char *log,        \
                              size_t n), (e, g, err, log, n))                                \
    X(cuGraphInstantiateWithFlags, (CUgraphExec *e, CUgraph g, unsigned long long flags),    \
      (e, g, flags))                                                                         \
    X(cuGraphInstantiateWithParams, (CUgraphExec *e, CUgraph g,                              \
                                     CUDA_GRAPH_INSTANTIATE_PARAMS *p), (e, g, p))           \
    X(cuGraphInstantiateWithParams_ptsz, (CUgraphExec *e, CUgraph g,                         \
                                          CUDA_GRAPH_INSTANTIATE_PARAMS *p), (e, g, p))      \
    X(cuGraphExecDestroy, (CUgraphExec e), (e))

/* Contexts: each is charged the limits file's context_mib on its card (vg_context.c). */
#define VG_CUDA_CTX_FUNCS(X)                                                                 \
    X(cuCtxCreate, (CUcontext *c, unsigned int flags, CUdevice dev), (c, flags, dev))        \
    X(cuCtxCreate_v2, (CUcontext *c, unsigned int flags, CUdevice dev), (c, flags, dev))     \
    X(cuCtxCreate_v3, (CUcontext *c, CUexecAffinityParam *p, int n, unsigned int flags,      \
                       CUdevice dev), (c, p, n, flags, dev))                                 \
    X(cuCtxCreate_v4, (CUcontext *c, CUctxCreateParams *p, unsigned int flags, CUdevice dev),\
      (c, p, flags, dev))                                                                    \
    X(cuCtxDestroy, (CUcontext c), (c))                                                      \
    X(cuCtxDestroy_v2, (CUcontext c), (c))                                                   \
    X(cuDevicePrimaryCtxRetain, (CUcontext *c, CUdevice dev), (c, dev))                      \
    X(cuDevicePrimaryCtxRelease, (CUdevice dev), (dev))                                      \
    X(cuDevicePrimaryCtxRelease_v2, (CUdevice dev), (dev))                                   \
    X(cuDevicePrimaryCtxReset, (CUdevice dev), (dev))                                        \
    X(cuDevicePrimaryCtxReset_v2, (CUdevice dev), (dev))                                     \
    X(cuGreenCtxCreate, (CUgreenCtx *g, CUdevResourceDesc desc, CUdevice dev,                \
                         unsigned int flags), (g, desc, dev, flags))                         \
    X(cuGreenCtxDestroy, (CUgreenCtx g), (g))

/* Compute: every way to put work on the GPU. All share one hook body (vg_compute.c). */
#define VG_CUDA_LAUNCH_FUNCS(X)                                                              \
    X(cuLaunchKernel, (VG_LAUNCH_ARGS_DECL, void **params, void **extra),                    \
      (VG_LAUNCH_ARGS, params, extra))                                                       \
    X(cuLaunchKernel_ptsz, (VG_LAUNCH_ARGS_DECL, void **params, void **extra),               \
      (VG_LAUNCH_ARGS, params, extra))                                                       \
    X(cuLaunchKernelEx, (const CUlaunchConfig *cfg, CUfunction f, void **params,             \
                         void **extra), (cfg, f, params, extra))                             \
    X(cuLaunchKernelEx_ptsz, (const CUlaunchConfig *cfg, CUfunction f, void **params,        \
                              void **extra), (cfg, f, params, extra))                        \
    X(cuLaunchCooperativeKernel, (VG_LAUNCH_ARGS_DECL, void **params),                       \
      (VG_LAUNCH_ARGS, params))                                                              \
    X(cuLaunchCooperativeKernel_ptsz, (VG_LAUNCH_ARGS_DECL, void **params),                  \
      (VG_LAUNCH_ARGS, params))                                                              \
    X(cuLaunchCooperativeKernelMultiDevice, (CUDA_LAUNCH_PARAMS *list, unsigned int n,       \
                                             unsigned int flags), (list, n, flags))          \
    X(cuGraphLaunch, (CUgraphExec g, CUstream s), (g, s))                                    \
    X(cuGraphLaunch_ptsz, (CUgraphExec g, CUstream s), (g, s))                               \
    X(cuLaunch, (CUfunction f), (f))                                                         \
    X(cuLaunchGrid, (CUfunction f, int w, int h), (f, w, h))                                 \
    X(cuLaunchGridAsync, (CUfunction f, int w, int h, CUstream s), (f, w, h, s))

/* Entry: initialisation and the by-name lookups (vg_real.c). */
#define VG_CUDA_ENTRY_FUNCS(X)                                                               \
    X(cuInit, (unsigned int flags), (flags))                                                 \
    X(cuGetProcAddress, (const char *sym, void **pfn, int ver, cuuint64_t flags),            \
      (sym, pfn, ver, flags))                                                                \
    X(cuGetProcAddress_v2, (const char *sym, void **pfn, int ver, cuuint64_t flags,          \
                            CUdriverProcAddressQueryResult *status),                         \
      (sym, pfn, ver, flags, status))

/* Driver entry points libvgpu calls but does not intercept. */
#define VG_CUDA_USED(X)                                                                      \
    X(cuCtxGetDevice, (CUdevice *dev), (dev))                                                \
    X(cuCtxSynchronize, (void), ())                                                          \
    X(cuDeviceGetUuid, (CUuuid *uuid, CUdevice dev), (uuid, dev))                            \
    X(cuEventCreate, (CUevent *ev, unsigned int flags), (ev, flags))                         \
    X(cuEventRecord, (CUevent ev, CUstream s), (ev, s))                                      \
    X(cuEventSynchronize, (CUevent ev), (ev))                                                \
    X(cuEventElapsedTime, (float *ms, CUevent start, CUevent end), (ms, start, end))         \
    X(cuStreamIsCapturing, (CUstream s, CUstreamCaptureStatus *status), (s, status))         \
    X(cuThreadExchangeStreamCaptureMode, (CUstreamCaptureMode *mode), (mode))                \
    X(cuDeviceGetMemPool, (CUmemoryPool *pool, CUdevice dev), (pool, dev))                   \
    X(cuGraphGetNodes, (CUgraph g, CUgraphNode *nodes, size_t *n), (g, nodes, n))             \
    X(cuGraphNodeGetType, (CUgraphNode node, CUgraphNodeType *type), (node, type))           \
    X(cuGraphMemAllocNodeGetParams, (CUgraphNode node, CUDA_MEM_ALLOC_NODE_PARAMS *p), (node, p))

#define VG_DECLARE(name, params, args) CUresult name params;
VG_CUDA_FUNCS(VG_DECLARE)
VG_CUDA_USED(VG_DECLARE)
#undef VG_DECLARE

/* Also used by the tests and the fake driver. */
CUresult cuDeviceGet(CUdevice *dev, int ordinal);
CUresult cuDeviceGetCount(int *count);
CUresult cuCtxSetCurrent(CUcontext ctx);
CUresult cuCtxGetCurrent(CUcontext *ctx);
CUresult cuDriverGetVersion(int *version);
CUresult cuModuleLoadData(CUmodule *mod, const void *image);
CUresult cuModuleGetFunction(CUfunction *f, CUmodule mod, const char *name);
CUresult cuStreamSynchronize(CUstream s);
CUresult cuEventDestroy_v2(CUevent ev);
CUresult cuEventQuery(CUevent ev);
CUresult cuStreamCreate(CUstream *s, unsigned int flags);
CUresult cuStreamDestroy_v2(CUstream s);
CUresult cuStreamBeginCapture_v2(CUstream s, CUstreamCaptureMode mode);
CUresult cuStreamEndCapture(CUstream s, CUgraph *graph);
CUresult cuGraphDestroy(CUgraph graph);
CUresult cuGraphCreate(CUgraph *graph, unsigned int flags);
CUresult cuGraphAddMemAllocNode(CUgraphNode *node, CUgraph g, const CUgraphNode *deps, size_t n,
                                CUDA_MEM_ALLOC_NODE_PARAMS *params);
CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool, CUdevice dev);
CUresult cuDeviceSetMemPool(CUdevice dev, CUmemoryPool pool);

#ifdef __cplusplus
}
#endif
#endif /* VG_CUDA_H */
