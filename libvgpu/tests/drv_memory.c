/* drv_memory.c - the memory cap over every allocation path, and what the app is told. */
#include "vgt_drv.h"

#define CAP_MIB 256ull
#define CAP (CAP_MIB * VGT_MIB)

static const char *one_card(void) {
    vgt_card c = {0, CAP_MIB, 100, "fixed-share"};
    const char *dir = vgt_limits(1, &c);
    vgt_ctx(0);
    return dir;
}

static void cap_minus_1mib_fits_cap_plus_1mib_does_not(void) {
    const char *dir = one_card();
    CUdeviceptr a = 0, b = 0;
    CHECK_RC(cuMemAlloc_v2(&a, CAP - VGT_MIB), CUDA_SUCCESS);
    uint64_t calls = fakecuda_alloc_calls();
    CHECK_RC(cuMemAlloc_v2(&b, 2 * VGT_MIB), CUDA_ERROR_OUT_OF_MEMORY);
    CHECK(fakecuda_alloc_calls() == calls, "the driver was called for a refused allocation");
    CHECK_RC(cuMemAlloc_v2(&b, VGT_MIB), CUDA_SUCCESS); /* exactly to the cap */
    CHECK_RC(cuMemAlloc_v2(&b, 1), CUDA_ERROR_OUT_OF_MEMORY);
    CHECK_RC(cuMemFree_v2(a), CUDA_SUCCESS);
    CHECK_RC(cuMemAlloc_v2(&a, CAP + VGT_MIB), CUDA_ERROR_OUT_OF_MEMORY);
    const vg_region *r = vgt_region(dir);
    CHECK(vgt_used(r, 0) == VGT_MIB, "region says %llu", (unsigned long long)vgt_used(r, 0));
    CHECK(vgt_refused(r, 0) == 3, "refused %llu", (unsigned long long)vgt_refused(r, 0));
    CHECK(fakecuda_used(0) == VGT_MIB, "fake device holds %llu", (unsigned long long)fakecuda_used(0));
}

static void frees_return_quota(void) {
    const char *dir = one_card();
    const vg_region *r = vgt_region(dir);
    CUdeviceptr p[8];
    for (int round = 0; round < 5; round++) {
        for (int i = 0; i < 8; i++) CHECK_RC(cuMemAlloc_v2(&p[i], CAP / 8), CUDA_SUCCESS);
        CHECK(vgt_used(r, 0) == CAP, "full");
        for (int i = 0; i < 8; i++) CHECK_RC(cuMemFree_v2(p[i]), CUDA_SUCCESS);
        CHECK(vgt_used(r, 0) == 0, "round %d left %llu", round, (unsigned long long)vgt_used(r, 0));
    }
    CHECK_RC(cuMemFree_v2(p[0]), CUDA_ERROR_INVALID_VALUE); /* double free: the driver's answer */
    CHECK(vgt_used(r, 0) == 0, "double free changed the accounting");
}

/* Fill the cap through one path, check the next MiB is refused, free, check it is back. */
typedef CUresult (*alloc_fn)(uint64_t bytes, uint64_t *key);
typedef CUresult (*free_fn)(uint64_t key);

static void through(const char *name, alloc_fn al, free_fn fr, uint64_t first) {
    const char *dir = one_card();
    const vg_region *r = vgt_region(dir);
    uint64_t k1 = 0, k2 = 0;
    CHECK(al(first, &k1) == CUDA_SUCCESS, "%s: first allocation", name);
    uint64_t used = vgt_used(r, 0);
    CHECK(used >= first && used <= CAP, "%s: accounted %llu for %llu", name, (unsigned long long)used,
          (unsigned long long)first);
    CHECK(used == fakecuda_used(0), "%s: accounted %llu, device holds %llu", name,
          (unsigned long long)used, (unsigned long long)fakecuda_used(0));
    /* One MiB over: the pitch and array helpers round what they ask for to whole rows. */
    CHECK(al(CAP - used + VGT_MIB, &k2) == CUDA_ERROR_OUT_OF_MEMORY, "%s: over the cap", name);
    CHECK(fr(k1) == CUDA_SUCCESS, "%s: free", name);
    CHECK(vgt_used(r, 0) == 0, "%s: quota back", name);
    CHECK(al(CAP, &k2) == CUDA_SUCCESS, "%s: the whole cap again", name);
    CHECK(fr(k2) == CUDA_SUCCESS, "%s: free", name);
}

static CUresult al_pitch(uint64_t n, uint64_t *k) {
    size_t pitch = 0;
    CUdeviceptr p = 0;
    CUresult r = cuMemAllocPitch_v2(&p, &pitch, 1000, n / 1024 ? n / 1024 : 1, 4);
    *k = p;
    return r;
}
static CUresult al_managed(uint64_t n, uint64_t *k) {
    CUdeviceptr p = 0;
    CUresult r = cuMemAllocManaged(&p, n, 1);
    *k = p;
    return r;
}
static CUresult al_async(uint64_t n, uint64_t *k) {
    CUdeviceptr p = 0;
    CUresult r = cuMemAllocAsync(&p, n, NULL);
    *k = p;
    return r;
}
static CUresult al_async_ptsz(uint64_t n, uint64_t *k) {
    CUdeviceptr p = 0;
    CUresult r = cuMemAllocAsync_ptsz(&p, n, NULL);
    *k = p;
    return r;
}
static CUresult al_pool(uint64_t n, uint64_t *k) {
    static CUmemoryPool pool;
    CUmemPoolProps props;
    memset(&props, 0, sizeof props);
    props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    props.location.id = 0;
    if (!pool) CHECK_RC(cuMemPoolCreate(&pool, &props), CUDA_SUCCESS);
    CUdeviceptr p = 0;
    CUresult r = cuMemAllocFromPoolAsync(&p, n, pool, NULL);
    *k = p;
    return r;
}
static CUresult fr_async(uint64_t k) { return cuMemFreeAsync(k, NULL); }
static CUresult fr_ptr(uint64_t k) { return cuMemFree_v2(k); }
static CUresult al_vmm(uint64_t n, uint64_t *k) {
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    CUmemGenericAllocationHandle h = 0;
    CUresult r = cuMemCreate(&h, n, &prop, 0);
    *k = h;
    return r;
}
static CUresult fr_vmm(uint64_t k) { return cuMemRelease(k); }
static CUresult al_array(uint64_t n, uint64_t *k) {
    CUDA_ARRAY_DESCRIPTOR d = {n / 4 / 1024 ? n / 4 / 1024 : 1, 1024, CU_AD_FORMAT_FLOAT, 1};
    if (n < 4096) d = (CUDA_ARRAY_DESCRIPTOR){n, 1, CU_AD_FORMAT_UNSIGNED_INT8, 1};
    CUarray a = NULL;
    CUresult r = cuArrayCreate_v2(&a, &d);
    *k = (uint64_t)(uintptr_t)a;
    return r;
}
static CUresult al_array3d(uint64_t n, uint64_t *k) {
    CUDA_ARRAY3D_DESCRIPTOR d = {n / 2 / 64 / 64 ? n / 2 / 64 / 64 : 1, 64, 64, CU_AD_FORMAT_HALF, 1, 0};
    if (n < 8192) d = (CUDA_ARRAY3D_DESCRIPTOR){n, 1, 1, CU_AD_FORMAT_UNSIGNED_INT8, 1, 0};
    CUarray a = NULL;
    CUresult r = cuArray3DCreate_v2(&a, &d);
    *k = (uint64_t)(uintptr_t)a;
    return r;
}
static CUresult fr_array(uint64_t k) { return cuArrayDestroy((CUarray)(uintptr_t)k); }
static CUresult al_v1(uint64_t n, uint64_t *k) {
    CUdeviceptr_v1 p = 0;
    CUresult r = cuMemAlloc(&p, (unsigned int)n);
    *k = p;
    return r;
}
static CUresult fr_v1(uint64_t k) { return cuMemFree((CUdeviceptr_v1)k); }

static void pitch_path(void) { through("cuMemAllocPitch_v2", al_pitch, fr_ptr, 100 * VGT_MIB); }
static void managed_path(void) { through("cuMemAllocManaged", al_managed, fr_ptr, 100 * VGT_MIB); }
static void async_path(void) { through("cuMemAllocAsync", al_async, fr_async, 100 * VGT_MIB); }
static void async_ptsz_path(void) { through("cuMemAllocAsync_ptsz", al_async_ptsz, fr_async, 100 * VGT_MIB); }
static void pool_path(void) { through("cuMemAllocFromPoolAsync", al_pool, fr_async, 100 * VGT_MIB); }
static void vmm_path(void) { through("cuMemCreate", al_vmm, fr_vmm, 100 * VGT_MIB); }
static void array_path(void) { through("cuArrayCreate_v2", al_array, fr_array, 100 * VGT_MIB); }
static void array3d_path(void) { through("cuArray3DCreate_v2", al_array3d, fr_array, 100 * VGT_MIB); }
static void v1_path(void) { through("cuMemAlloc (v1)", al_v1, fr_v1, 100 * VGT_MIB); }

static void host_vmm_is_not_device_memory(void) {
    const char *dir = one_card();
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.location.type = CU_MEM_LOCATION_TYPE_HOST;
    CUmemGenericAllocationHandle h = 0;
    CHECK_RC(cuMemCreate(&h, CAP * 2, &prop, 0), CUDA_SUCCESS);
    CHECK(vgt_used(vgt_region(dir), 0) == 0, "host memory counted");
    CHECK_RC(cuMemRelease(h), CUDA_SUCCESS);
}

static void mem_get_info_and_total_show_the_slice(void) {
    one_card();
    size_t free_b = 0, total = 0;
    CUdeviceptr p = 0;
    CHECK_RC(cuMemGetInfo_v2(&free_b, &total), CUDA_SUCCESS);
    CHECK(total == CAP && free_b == CAP, "total %zu free %zu", total, free_b);
    CHECK_RC(cuMemAlloc_v2(&p, 100 * VGT_MIB), CUDA_SUCCESS);
    CHECK_RC(cuMemGetInfo_v2(&free_b, &total), CUDA_SUCCESS);
    CHECK(total == CAP && free_b == CAP - 100 * VGT_MIB, "after 100 MiB: free %zu", free_b);
    unsigned int f32 = 0, t32 = 0;
    CHECK_RC(cuMemGetInfo(&f32, &t32), CUDA_SUCCESS);
    CHECK(t32 == CAP && f32 == CAP - 100 * VGT_MIB, "v1: total %u free %u", t32, f32);
    size_t tm = 0;
    CHECK_RC(cuDeviceTotalMem_v2(&tm, 0), CUDA_SUCCESS);
    CHECK(tm == CAP, "cuDeviceTotalMem_v2 %zu", tm);
    CHECK_RC(cuDeviceTotalMem_v2(&tm, 1), CUDA_SUCCESS); /* not the container's card */
    CHECK(tm == 0, "foreign card total %zu", tm);
}

static void null_and_odd_arguments_get_the_drivers_answer(void) {
    one_card();
    CUdeviceptr p = 0;
    size_t pitch = 0, f = 0;
    CHECK_RC(cuMemAlloc_v2(NULL, VGT_MIB), CUDA_ERROR_INVALID_VALUE);
    CHECK_RC(cuMemAlloc_v2(&p, 0), CUDA_ERROR_INVALID_VALUE);
    CHECK_RC(cuMemAllocPitch_v2(&p, NULL, 100, 100, 4), CUDA_ERROR_INVALID_VALUE);
    CHECK_RC(cuMemAllocPitch_v2(&p, &pitch, 100, 100, 3), CUDA_ERROR_INVALID_VALUE);
    CHECK_RC(cuMemAllocPitch_v2(&p, &pitch, SIZE_MAX / 2, 4, 4), CUDA_ERROR_OUT_OF_MEMORY);
    CHECK_RC(cuMemAllocManaged(&p, VGT_MIB, 7), CUDA_ERROR_INVALID_VALUE);
    CHECK_RC(cuMemAllocManaged(NULL, VGT_MIB, 1), CUDA_ERROR_INVALID_VALUE);
    CHECK_RC(cuMemAllocAsync(NULL, VGT_MIB, NULL), CUDA_ERROR_INVALID_VALUE);
    CHECK_RC(cuMemAllocFromPoolAsync(&p, VGT_MIB, NULL, NULL), CUDA_ERROR_INVALID_VALUE);
    CHECK_RC(cuMemPoolCreate(NULL, NULL), CUDA_ERROR_INVALID_VALUE);
    CHECK_RC(cuMemCreate(NULL, VGT_MIB, NULL, 0), CUDA_ERROR_INVALID_VALUE);
    CHECK_RC(cuMemRelease(0), CUDA_ERROR_INVALID_VALUE);
    CHECK_RC(cuArrayCreate_v2(NULL, NULL), CUDA_ERROR_INVALID_VALUE);
    CHECK_RC(cuArray3DCreate_v2(NULL, NULL), CUDA_ERROR_INVALID_VALUE);
    CHECK_RC(cuArrayDestroy(NULL), CUDA_ERROR_INVALID_HANDLE);
    CHECK_RC(cuMemFree_v2(0), CUDA_SUCCESS);
    CHECK_RC(cuMemFree_v2(12345), CUDA_ERROR_INVALID_VALUE);
    CHECK_RC(cuMemGetInfo_v2(NULL, &f), CUDA_ERROR_INVALID_VALUE);
    CHECK_RC(cuMemGetInfo_v2(&f, NULL), CUDA_ERROR_INVALID_VALUE);
    CHECK_RC(cuDeviceTotalMem_v2(NULL, 0), CUDA_ERROR_INVALID_VALUE);
    CHECK_RC(cuDeviceTotalMem_v2(&f, 99), CUDA_ERROR_INVALID_DEVICE);
    CHECK_RC(cuLaunchKernelEx(NULL, NULL, NULL, NULL), CUDA_ERROR_INVALID_VALUE);
    CHECK_RC(cuLaunchKernel(NULL, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL), CUDA_ERROR_INVALID_HANDLE);
    CHECK(fakecuda_used(0) == 0, "odd calls left memory allocated");
}

static void no_context_gets_the_drivers_answer(void) {
    vgt_card c = {0, CAP_MIB, 100, "fixed-share"};
    vgt_limits(1, &c);
    CHECK_RC(cuInit(0), CUDA_SUCCESS);
    CUdeviceptr p = 0;
    size_t f = 0, t = 0;
    CHECK_RC(cuMemAlloc_v2(&p, VGT_MIB), CUDA_ERROR_INVALID_CONTEXT);
    CHECK_RC(cuMemGetInfo_v2(&f, &t), CUDA_ERROR_INVALID_CONTEXT);
}

static void each_card_has_its_own_cap_matched_by_uuid(void) {
    /* Ordinals in the file are the reverse of the driver's: only UUIDs can match them. */
    vgt_card cards[2] = {{1, 64, 100, "fixed-share"}, {0, 128, 100, "fixed-share"}};
    const char *dir = vgt_limits(2, cards);
    CUdeviceptr p = 0;
    vgt_ctx(0); /* device 0 = card 1: 128 MiB */
    CHECK_RC(cuMemAlloc_v2(&p, 100 * VGT_MIB), CUDA_SUCCESS);
    CHECK_RC(cuMemAlloc_v2(&p, 29 * VGT_MIB), CUDA_ERROR_OUT_OF_MEMORY);
    vgt_ctx(1); /* device 1 = card 0: 64 MiB */
    CHECK_RC(cuMemAlloc_v2(&p, 65 * VGT_MIB), CUDA_ERROR_OUT_OF_MEMORY);
    CHECK_RC(cuMemAlloc_v2(&p, 64 * VGT_MIB), CUDA_SUCCESS);
    const vg_region *r = vgt_region(dir);
    CHECK(vgt_used(r, 0) == 64 * VGT_MIB && vgt_used(r, 1) == 100 * VGT_MIB, "per-card accounting");
    size_t f = 0, t = 0;
    CHECK_RC(cuMemGetInfo_v2(&f, &t), CUDA_SUCCESS);
    CHECK(t == 64 * VGT_MIB && f == 0, "device 1 sees card 0's slice: %zu/%zu", f, t);
}

static void device_outside_the_container_gets_nothing(void) {
    vgt_card c = {0, CAP_MIB, 100, "fixed-share"};
    vgt_limits(1, &c);
    vgt_ctx(1); /* the fake has 2 devices; the container only card 0 */
    CUdeviceptr p = 0;
    CHECK_RC(cuMemAlloc_v2(&p, VGT_MIB), CUDA_ERROR_OUT_OF_MEMORY);
}

static void without_limits_file_everything_passes(void) {
    setenv("TESSERA_TEST_LIMITS", "/nonexistent/tessera/limits", 1);
    vgt_ctx(0);
    CUdeviceptr p = 0;
    size_t f = 0, t = 0;
    CHECK_RC(cuMemAlloc_v2(&p, 4096 * VGT_MIB), CUDA_SUCCESS);
    CHECK_RC(cuMemGetInfo_v2(&f, &t), CUDA_SUCCESS);
    CHECK(t == 16384 * VGT_MIB, "the driver's own total: %zu", t);
}

static void invalid_limits_fail_closed(void) {
    const char *dir = vgt_tmpdir();
    char path[512];
    snprintf(path, sizeof path, "%s/limits", dir);
    vgt_write(path, "version=1\ncards=1\ncard.0.memory_mib=lots\n");
    setenv("TESSERA_TEST_LIMITS", path, 1);
    CUdeviceptr p = 0;
    CHECK_RC(cuInit(0), CUDA_ERROR_NOT_INITIALIZED);
    CHECK_RC(cuMemAlloc_v2(&p, VGT_MIB), CUDA_ERROR_NOT_INITIALIZED);
    CHECK_RC(cuLaunchKernel(NULL, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL), CUDA_ERROR_NOT_INITIALIZED);
}

/* A pool that keeps freed memory (PyTorch's cudaMallocAsync backend raises the default
 * pool's release threshold to "everything") holds it on the card: it counts against the
 * cap until the pool reuses it, trims it, lowers its threshold or is destroyed. */
static void pool_retention_counts_against_the_cap(int explicit_pool) {
    const char *dir = one_card();
    const vg_region *r = vgt_region(dir);
    CUmemoryPool pool = NULL;
    if (explicit_pool) {
        CUmemPoolProps props;
        memset(&props, 0, sizeof props);
        props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
        props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        CHECK_RC(cuMemPoolCreate(&pool, &props), CUDA_SUCCESS);
    } else {
        CHECK_RC(cuDeviceGetDefaultMemPool(&pool, 0), CUDA_SUCCESS);
    }
    cuuint64_t keep_all = UINT64_MAX;
    CHECK_RC(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep_all), CUDA_SUCCESS);
    CUdeviceptr a = 0, b = 0;
    CHECK_RC(explicit_pool ? cuMemAllocFromPoolAsync(&a, 200 * VGT_MIB, pool, NULL)
                           : cuMemAllocAsync(&a, 200 * VGT_MIB, NULL), CUDA_SUCCESS);
    CHECK_RC(cuMemFreeAsync(a, NULL), CUDA_SUCCESS);
    CHECK(fakecuda_used(0) == 200 * VGT_MIB, "the fake pool keeps %llu", (unsigned long long)fakecuda_used(0));
    CHECK(vgt_used(r, 0) == 200 * VGT_MIB, "retained memory counted: %llu", (unsigned long long)vgt_used(r, 0));
    /* Another path cannot take the cap again beside the full pool. */
    CHECK_RC(cuMemAlloc_v2(&b, 100 * VGT_MIB), CUDA_ERROR_OUT_OF_MEMORY);
    CHECK(fakecuda_used(0) <= CAP, "the card holds %llu past the cap", (unsigned long long)fakecuda_used(0));
    /* The pool hands its retained memory out again without a new charge. */
    CHECK_RC(explicit_pool ? cuMemAllocFromPoolAsync(&a, 150 * VGT_MIB, pool, NULL)
                           : cuMemAllocAsync(&a, 150 * VGT_MIB, NULL), CUDA_SUCCESS);
    CHECK(vgt_used(r, 0) == 200 * VGT_MIB, "reuse charged again: %llu", (unsigned long long)vgt_used(r, 0));
    CHECK_RC(cuMemFreeAsync(a, NULL), CUDA_SUCCESS);
    /* Lowering the threshold releases the excess; trimming releases the rest. */
    cuuint64_t keep_50 = 50 * VGT_MIB;
    CHECK_RC(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep_50), CUDA_SUCCESS);
    CHECK(vgt_used(r, 0) == 50 * VGT_MIB, "threshold 50 MiB: %llu", (unsigned long long)vgt_used(r, 0));
    CHECK_RC(cuMemPoolTrimTo(pool, 0), CUDA_SUCCESS);
    CHECK(vgt_used(r, 0) == 0 && fakecuda_used(0) == 0, "trimmed: %llu counted, %llu on the card",
          (unsigned long long)vgt_used(r, 0), (unsigned long long)fakecuda_used(0));
    CHECK_RC(cuMemAlloc_v2(&b, CAP), CUDA_SUCCESS);
    CHECK_RC(cuMemFree_v2(b), CUDA_SUCCESS);
    if (explicit_pool) {
        CHECK_RC(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep_all), CUDA_SUCCESS);
        CHECK_RC(cuMemAllocFromPoolAsync(&a, 100 * VGT_MIB, pool, NULL), CUDA_SUCCESS);
        CHECK_RC(cuMemFreeAsync(a, NULL), CUDA_SUCCESS);
        CHECK(vgt_used(r, 0) == 100 * VGT_MIB, "kept %llu", (unsigned long long)vgt_used(r, 0));
        CHECK_RC(cuMemPoolDestroy(pool), CUDA_SUCCESS);
        CHECK(vgt_used(r, 0) == 0, "a destroyed pool left %llu", (unsigned long long)vgt_used(r, 0));
    }
}
static void default_pool_retention(void) { pool_retention_counts_against_the_cap(0); }
static void created_pool_retention(void) { pool_retention_counts_against_the_cap(1); }

VGT_MAIN(VGT_CASE(cap_minus_1mib_fits_cap_plus_1mib_does_not), VGT_CASE(frees_return_quota),
         VGT_CASE(default_pool_retention), VGT_CASE(created_pool_retention),
         VGT_CASE(pitch_path), VGT_CASE(managed_path), VGT_CASE(async_path), VGT_CASE(async_ptsz_path),
         VGT_CASE(pool_path), VGT_CASE(vmm_path), VGT_CASE(array_path), VGT_CASE(array3d_path),
         VGT_CASE(v1_path), VGT_CASE(host_vmm_is_not_device_memory),
         VGT_CASE(mem_get_info_and_total_show_the_slice),
         VGT_CASE(null_and_odd_arguments_get_the_drivers_answer),
         VGT_CASE(no_context_gets_the_drivers_answer), VGT_CASE(each_card_has_its_own_cap_matched_by_uuid),
         VGT_CASE(device_outside_the_container_gets_nothing),
         VGT_CASE(without_limits_file_everything_passes), VGT_CASE(invalid_limits_fail_closed))
