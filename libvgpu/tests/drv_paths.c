/*
 * drv_paths.c - the allocation paths beyond plain allocations, table-driven: mipmapped
 * arrays, external memory imports, the charge per context (created, green, primary),
 * and graph memory (allocation nodes, and allocations captured into a graph).
 *
 * For each path, on a card capped at CAP_MIB: objects of a known size are made until the
 * next would pass the cap; that one is refused with CUDA_ERROR_OUT_OF_MEMORY and the
 * driver is not called; the region counts exactly what is held; destroying them gives
 * every byte back; and the driver's own refusals (bad arguments) cost nothing.
 */
#include "vgt_drv.h"

#define CAP_MIB 64ull
#define MAX_OBJS 16

typedef struct path {
    const char *name;
    uint64_t bytes;                   /* what one object is charged */
    const char *extra;                /* limits file lines beyond the card's */
    CUresult (*make)(void **obj);     /* make one object on device 0 */
    CUresult (*drop)(void *obj);
    CUresult (*bad)(void);            /* an argument the driver refuses */
} path;

/* ---- mipmapped arrays: 3 levels of 1024 x 1024 x 4 floats: 16 + 4 + 1 MiB ---- */
static CUDA_ARRAY3D_DESCRIPTOR mip_desc(void) {
    CUDA_ARRAY3D_DESCRIPTOR d;
    memset(&d, 0, sizeof d);
    d.Width = 1024;
    d.Height = 1024;
    d.Format = CU_AD_FORMAT_FLOAT;
    d.NumChannels = 4;
    return d;
}
static CUresult mip_make(void **o) {
    CUDA_ARRAY3D_DESCRIPTOR d = mip_desc();
    return cuMipmappedArrayCreate((CUmipmappedArray *)o, &d, 3);
}
static CUresult mip_drop(void *o) { return cuMipmappedArrayDestroy((CUmipmappedArray)o); }
static CUresult mip_bad(void) {
    CUmipmappedArray m = NULL;
    CUDA_ARRAY3D_DESCRIPTOR d = mip_desc();
    return cuMipmappedArrayCreate(&m, &d, 0); /* no levels */
}

/* ---- external memory: 20 MiB imported (an opaque fd, as from Vulkan) ---- */
static CUresult ext_make(void **o) {
    CUDA_EXTERNAL_MEMORY_HANDLE_DESC d;
    memset(&d, 0, sizeof d);
    d.type = 1; /* CU_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD */
    d.handle.fd = 3;
    d.size = 20 * VGT_MIB;
    return cuImportExternalMemory((CUexternalMemory *)o, &d);
}
static CUresult ext_drop(void *o) { return cuDestroyExternalMemory((CUexternalMemory)o); }
static CUresult ext_bad(void) {
    CUexternalMemory m = NULL;
    CUDA_EXTERNAL_MEMORY_HANDLE_DESC d;
    memset(&d, 0, sizeof d); /* type 0: invalid */
    d.size = VGT_MIB;
    return cuImportExternalMemory(&m, &d);
}

/* ---- contexts, charged context_mib=15 each ---- */
static CUresult ctx_make(void **o) {
    CUcontext keep = NULL;
    cuCtxGetCurrent(&keep);
    CUresult r = cuCtxCreate_v2((CUcontext *)o, 0, 0);
    cuCtxSetCurrent(keep); /* created contexts become current; the tests go on in device 0's primary */
    return r;
}
static CUresult ctx_drop(void *o) { return cuCtxDestroy_v2((CUcontext)o); }
static CUresult ctx_bad(void) {
    CUcontext c = NULL;
    return cuCtxCreate_v2(&c, 0, 99); /* no such device */
}
static CUresult green_make(void **o) { return cuGreenCtxCreate((CUgreenCtx *)o, (CUdevResourceDesc)0x1, 0, 1); }
static CUresult green_drop(void *o) { return cuGreenCtxDestroy((CUgreenCtx)o); }
static CUresult green_bad(void) {
    CUgreenCtx g = NULL;
    return cuGreenCtxCreate(&g, NULL, 0, 1); /* no resource descriptor */
}

/* ---- graph memory: an executable graph with one 20 MiB allocation node ---- */
static CUresult graph_make(void **o) {
    CUgraph g = NULL;
    CUgraphNode node = NULL;
    CUDA_MEM_ALLOC_NODE_PARAMS p;
    memset(&p, 0, sizeof p);
    p.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p.bytesize = 20 * VGT_MIB;
    CHECK_RC(cuGraphCreate(&g, 0), CUDA_SUCCESS);
    CHECK_RC(cuGraphAddMemAllocNode(&node, g, NULL, 0, &p), CUDA_SUCCESS);
    CUresult r = cuGraphInstantiateWithFlags((CUgraphExec *)o, g, 0);
    CHECK_RC(cuGraphDestroy(g), CUDA_SUCCESS); /* the executable graph keeps the memory */
    return r;
}
static CUresult graph_drop(void *o) { return cuGraphExecDestroy((CUgraphExec)o); }
static CUresult graph_bad(void) {
    CUgraphExec e = NULL;
    return cuGraphInstantiateWithFlags(&e, NULL, 0); /* no graph */
}

static const path PATHS[] = {
    {"mipmapped array", 21 * VGT_MIB, "", mip_make, mip_drop, mip_bad},
    {"external memory", 20 * VGT_MIB, "", ext_make, ext_drop, ext_bad},
    {"created context", 15 * VGT_MIB, "context_mib=15\n", ctx_make, ctx_drop, ctx_bad},
    {"green context", 15 * VGT_MIB, "context_mib=15\n", green_make, green_drop, green_bad},
    {"graph memory node", 20 * VGT_MIB, "", graph_make, graph_drop, graph_bad},
};

static void one_path(const path *p) {
    vgt_card c = {0, CAP_MIB, 100, "fixed-share"};
    const char *dir = vgt_limits_with(1, &c, p->extra);
    CUcontext primary = NULL;
    CHECK_RC(cuInit(0), CUDA_SUCCESS);
    CHECK_RC(cuDevicePrimaryCtxRetain(&primary, 0), CUDA_SUCCESS);
    CHECK_RC(cuCtxSetCurrent(primary), CUDA_SUCCESS);
    const vg_region *r = vgt_region(dir);
    uint64_t base = vgt_used(r, 0); /* the primary context's own charge, if any */
    uint64_t fit = (CAP_MIB * VGT_MIB - base) / p->bytes;
    CHECK(fit >= 1 && fit < MAX_OBJS, "%s: %llu objects fit", p->name, (unsigned long long)fit);
    void *objs[MAX_OBJS] = {NULL};
    for (uint64_t i = 0; i < fit; i++) {
        CHECK_RC(p->make(&objs[i]), CUDA_SUCCESS);
        CHECK(vgt_used(r, 0) == base + (i + 1) * p->bytes, "%s: %llu held after %llu", p->name,
              (unsigned long long)vgt_used(r, 0), (unsigned long long)i + 1);
    }
    void *extra = NULL;
    uint64_t calls = fakecuda_alloc_calls();
    CHECK_RC(p->make(&extra), CUDA_ERROR_OUT_OF_MEMORY);
    CHECK(fakecuda_alloc_calls() == calls, "%s: the driver was called for a refused object", p->name);
    CHECK(vgt_refused(r, 0) == 1, "%s: refused %llu", p->name, (unsigned long long)vgt_refused(r, 0));
    CHECK(p->bad() != CUDA_SUCCESS, "%s: the bad argument was accepted", p->name);
    CHECK(vgt_used(r, 0) == base + fit * p->bytes, "%s: a refusal changed the count", p->name);
    for (uint64_t i = 0; i < fit; i++) CHECK_RC(p->drop(objs[i]), CUDA_SUCCESS);
    CHECK(vgt_used(r, 0) == base, "%s: %llu left after every destroy", p->name,
          (unsigned long long)vgt_used(r, 0));
    CHECK_RC(p->make(&objs[0]), CUDA_SUCCESS); /* the room is back */
    CHECK_RC(p->drop(objs[0]), CUDA_SUCCESS);
}

static void mipmapped_arrays(void) { one_path(&PATHS[0]); }
static void external_memory(void) { one_path(&PATHS[1]); }
static void created_contexts(void) { one_path(&PATHS[2]); }
static void green_contexts(void) { one_path(&PATHS[3]); }
static void graph_memory_nodes(void) { one_path(&PATHS[4]); }

/* cuMemAllocAsync on a capturing stream (PyTorch's graphs with the cudaMallocAsync
 * backend) makes a memory node: nothing at capture, the graph's memory when it is
 * instantiated, until the executable graph is destroyed. */
static void captured_allocations_are_charged_to_the_executable_graph(void) {
    vgt_card c = {0, CAP_MIB, 100, "fixed-share"};
    const char *dir = vgt_limits(1, &c);
    vgt_ctx(0);
    const vg_region *r = vgt_region(dir);
    CUstream s = NULL;
    CUgraph g = NULL;
    CUgraphExec e[3] = {NULL, NULL, NULL};
    CUdeviceptr p = 0;
    CHECK_RC(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    CHECK_RC(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
    CHECK_RC(cuMemAllocAsync(&p, 30 * VGT_MIB, s), CUDA_SUCCESS);
    CHECK_RC(cuLaunchKernel(vgt_kernel(1000), 1, 1, 1, 1, 1, 1, 0, s, NULL, NULL), CUDA_SUCCESS);
    CHECK_RC(cuMemFreeAsync(p, s), CUDA_SUCCESS);
    CHECK_RC(cuStreamEndCapture(s, &g), CUDA_SUCCESS);
    CHECK(vgt_used(r, 0) == 0, "capture charged %llu", (unsigned long long)vgt_used(r, 0));
    CHECK_RC(cuGraphInstantiateWithFlags(&e[0], g, 0), CUDA_SUCCESS);
    CHECK(fakecuda_used(0) == 30 * VGT_MIB, "the fake reserved %llu", (unsigned long long)fakecuda_used(0));
    CHECK(vgt_used(r, 0) == 30 * VGT_MIB, "instantiation charged %llu", (unsigned long long)vgt_used(r, 0));
    CHECK_RC(cuGraphInstantiateWithFlags(&e[1], g, 0), CUDA_SUCCESS); /* 60 of 64 MiB */
    uint64_t calls = fakecuda_alloc_calls();
    CHECK_RC(cuGraphInstantiateWithFlags(&e[2], g, 0), CUDA_ERROR_OUT_OF_MEMORY);
    CHECK(fakecuda_alloc_calls() == calls, "the driver was asked for a refused graph");
    CHECK_RC(cuGraphLaunch(e[0], s), CUDA_SUCCESS);
    CHECK_RC(cuStreamSynchronize(s), CUDA_SUCCESS);
    for (int i = 0; i < 2; i++) CHECK_RC(cuGraphExecDestroy(e[i]), CUDA_SUCCESS);
    CHECK(vgt_used(r, 0) == 0 && fakecuda_used(0) == 0, "after the destroys: %llu counted, %llu held",
          (unsigned long long)vgt_used(r, 0), (unsigned long long)fakecuda_used(0));
    CHECK_RC(cuGraphDestroy(g), CUDA_SUCCESS);
    CHECK_RC(cuStreamDestroy_v2(s), CUDA_SUCCESS);
}

/* The primary context is charged once per process while retained, whatever the count. */
static void primary_context_charged_once_while_retained(void) {
    vgt_card c = {0, CAP_MIB, 100, "fixed-share"};
    const char *dir = vgt_limits_with(1, &c, "context_mib=40\n");
    CUcontext a = NULL, b = NULL;
    CHECK_RC(cuInit(0), CUDA_SUCCESS);
    const vg_region *r = vgt_region(dir);
    CHECK_RC(cuDevicePrimaryCtxRetain(&a, 0), CUDA_SUCCESS);
    CHECK(vgt_used(r, 0) == 40 * VGT_MIB, "after a retain %llu", (unsigned long long)vgt_used(r, 0));
    CHECK_RC(cuDevicePrimaryCtxRetain(&b, 0), CUDA_SUCCESS);
    CHECK(vgt_used(r, 0) == 40 * VGT_MIB, "a second retain charged again");
    CHECK_RC(cuCtxSetCurrent(a), CUDA_SUCCESS);
    CUdeviceptr p = 0;
    CHECK_RC(cuMemAlloc_v2(&p, 30 * VGT_MIB), CUDA_ERROR_OUT_OF_MEMORY); /* 40 + 30 > 64 */
    CHECK_RC(cuMemAlloc_v2(&p, 24 * VGT_MIB), CUDA_SUCCESS);
    CHECK_RC(cuMemFree_v2(p), CUDA_SUCCESS);
    CHECK_RC(cuDevicePrimaryCtxRelease_v2(0), CUDA_SUCCESS);
    CHECK(vgt_used(r, 0) == 40 * VGT_MIB, "released once of twice: still charged");
    CHECK_RC(cuDevicePrimaryCtxRelease_v2(0), CUDA_SUCCESS);
    CHECK(vgt_used(r, 0) == 0, "released: %llu left", (unsigned long long)vgt_used(r, 0));
    CHECK_RC(cuDevicePrimaryCtxRelease_v2(0), CUDA_ERROR_INVALID_CONTEXT); /* the driver's answer */
    CHECK_RC(cuDevicePrimaryCtxRetain(&a, 0), CUDA_SUCCESS);
    CHECK_RC(cuDevicePrimaryCtxReset_v2(0), CUDA_SUCCESS);
    CHECK(vgt_used(r, 0) == 0, "reset: %llu left", (unsigned long long)vgt_used(r, 0));
}

/* context_mib is checked like every key: out of range is a broken limits file, and every
 * call fails closed (each case runs in its own process: the library reads limits once). */
static void context_mib_out_of_range_fails_closed(void) {
    vgt_card c = {0, CAP_MIB, 100, "fixed-share"};
    vgt_limits_with(1, &c, "context_mib=2000000\n");
    CUcontext a = NULL;
    CHECK_RC(cuInit(0), CUDA_ERROR_NOT_INITIALIZED);
    CHECK_RC(cuDevicePrimaryCtxRetain(&a, 0), CUDA_ERROR_NOT_INITIALIZED);
}

VGT_MAIN(VGT_CASE(mipmapped_arrays), VGT_CASE(external_memory), VGT_CASE(created_contexts),
         VGT_CASE(green_contexts), VGT_CASE(graph_memory_nodes),
         VGT_CASE(captured_allocations_are_charged_to_the_executable_graph),
         VGT_CASE(primary_context_charged_once_while_retained),
         VGT_CASE(context_mib_out_of_range_fails_closed))
