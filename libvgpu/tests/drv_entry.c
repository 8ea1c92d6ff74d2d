/* drv_entry.c - the ways an application reaches the driver other than a direct call:
 * cuGetProcAddress(_v2) (the CUDA 12 runtime), dlsym, and a limits file it cannot replace. */
#include "vgt_drv.h" /* first: it defines _GNU_SOURCE (dladdr) */

#include <dlfcn.h>

#include "vg_nvml.h"

typedef CUresult (*alloc_t)(CUdeviceptr *, size_t);
typedef CUresult (*gpa_t)(const char *, void **, int, cuuint64_t);
typedef CUresult (*gpa2_t)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
typedef CUresult (*launch_t)(VG_LAUNCH_ARGS_DECL, void **, void **);

static void small_cap(void) {
    vgt_card c = {0, 8, 100, "fixed-share"};
    vgt_limits(1, &c);
    vgt_ctx(0);
}

/* The pointer behaves like the hook: 8 MiB cap. */
static void is_capped(alloc_t fn, const char *how) {
    CUdeviceptr p = 0;
    CHECK(fn(&p, 9 * VGT_MIB) == CUDA_ERROR_OUT_OF_MEMORY, "%s: allocation over the cap went through", how);
    CHECK(fn(&p, 8 * VGT_MIB) == CUDA_SUCCESS, "%s: allocation within the cap failed", how);
    CHECK_RC(cuMemFree_v2(p), CUDA_SUCCESS);
}

static void get_proc_address_returns_hooks(void) {
    small_cap();
    void *fn = NULL;
    CHECK_RC(cuGetProcAddress("cuMemAlloc", &fn, 12040, CU_GET_PROC_ADDRESS_DEFAULT), CUDA_SUCCESS);
    CHECK(fn == (void *)cuMemAlloc_v2, "cuMemAlloc at 12.4 should be the _v2 hook");
    is_capped((alloc_t)fn, "cuGetProcAddress(cuMemAlloc)");
    CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    CHECK_RC(cuGetProcAddress_v2("cuMemAlloc", &fn, 12040, 0, &st), CUDA_SUCCESS);
    CHECK(st == CU_GET_PROC_ADDRESS_SUCCESS, "status %d", (int)st);
    is_capped((alloc_t)fn, "cuGetProcAddress_v2(cuMemAlloc)");
    CHECK_RC(cuGetProcAddress("cuMemAlloc", &fn, 3000, 0), CUDA_SUCCESS);
    CHECK(fn == (void *)cuMemAlloc, "an old CUDA version gets the v1 hook");
    CHECK_RC(cuGetProcAddress("cuLaunchKernel", &fn, 12040, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM),
             CUDA_SUCCESS);
    CHECK(fn == (void *)cuLaunchKernel_ptsz, "per-thread stream gets the _ptsz hook");
    CHECK_RC(cuGetProcAddress("cuGraphLaunch", &fn, 12040, 0), CUDA_SUCCESS);
    CHECK(fn == (void *)cuGraphLaunch, "cuGraphLaunch");
    CHECK_RC(cuGetProcAddress("cuGetProcAddress", &fn, 12040, 0), CUDA_SUCCESS);
    CHECK(fn == (void *)cuGetProcAddress_v2, "the lookup itself is hooked too");
    CHECK_RC(cuGetProcAddress("cuCtxSynchronize", &fn, 12040, 0), CUDA_SUCCESS);
    CHECK(fn != NULL && fn != dlsym(RTLD_DEFAULT, "cuMemAlloc_v2"), "unhooked names pass through");
    CHECK_RC(cuGetProcAddress("cuNoSuchThing", &fn, 12040, 0), CUDA_ERROR_NOT_FOUND);
    CHECK(fn == NULL, "not found leaves NULL");
    CHECK_RC(cuGetProcAddress(NULL, &fn, 12040, 0), CUDA_ERROR_INVALID_VALUE);
    CHECK_RC(cuGetProcAddress("cuMemAlloc", NULL, 12040, 0), CUDA_ERROR_INVALID_VALUE);
}

static void get_proc_address_internal_pointers(void) {
    /* A driver may hand out internal entry points; libvgpu then chooses by name. */
    setenv("FAKECUDA_PROC_INTERNAL", "1", 1);
    small_cap();
    void *fn = NULL;
    CHECK_RC(cuGetProcAddress_v2("cuMemAlloc", &fn, 12040, 0, NULL), CUDA_SUCCESS);
    CHECK(fn == (void *)cuMemAlloc_v2, "internal pointer not replaced by the hook");
    is_capped((alloc_t)fn, "internal cuMemAlloc");
    CHECK_RC(cuGetProcAddress_v2("cuLaunchKernel", &fn, 12040, 2, NULL), CUDA_SUCCESS);
    CHECK(fn == (void *)cuLaunchKernel_ptsz, "internal launch pointer not replaced");
    /* Every hooked family, not just those two. */
    static const struct { const char *sym; int ver; cuuint64_t flags; void *hook; } want[] = {
        {"cuMemAllocAsync", 12040, 0, (void *)cuMemAllocAsync},
        {"cuMemFreeAsync", 12040, 2, (void *)cuMemFreeAsync_ptsz},
        {"cuGraphLaunch", 12040, 0, (void *)cuGraphLaunch},
        {"cuGraphInstantiateWithFlags", 12040, 0, (void *)cuGraphInstantiateWithFlags},
        {"cuMemPoolSetAttribute", 12040, 0, (void *)cuMemPoolSetAttribute},
        {"cuCtxCreate", 12040, 0, (void *)cuCtxCreate_v2},
        {"cuMipmappedArrayCreate", 12040, 0, (void *)cuMipmappedArrayCreate},
        {"cuMemGetInfo", 12040, 0, (void *)cuMemGetInfo_v2},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        CHECK_RC(cuGetProcAddress_v2(want[i].sym, &fn, want[i].ver, want[i].flags, NULL), CUDA_SUCCESS);
        CHECK(fn == want[i].hook, "internal %s not replaced by its hook", want[i].sym);
    }
}

static void get_proc_address_passes_the_drivers_version_rule(void) {
    /* An entry newer than the version asked for: the driver says VERSION_NOT_SUFFICIENT
     * and hands out nothing; libvgpu must not hand out its hook instead. */
    small_cap();
    void *fn = (void *)1;
    CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SUCCESS;
    CHECK_RC(cuGetProcAddress_v2("cuMemAllocAsync", &fn, 11000, 0, &st), CUDA_ERROR_NOT_FOUND);
    CHECK(fn == NULL && st == CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT, "fn %p status %d", fn, (int)st);
    CHECK_RC(cuGetProcAddress_v2("cuMemAllocAsync", &fn, 11020, 0, &st), CUDA_SUCCESS);
    CHECK(fn == (void *)cuMemAllocAsync && st == CU_GET_PROC_ADDRESS_SUCCESS, "at 11.2 it is there");
}

static void runtime_style_lookup_through_dlsym(void) {
    /* What the CUDA runtime does: dlopen the driver, dlsym cuGetProcAddress_v2, then ask it. */
    small_cap();
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    CHECK(h != NULL, "dlopen: %s", dlerror());
    gpa2_t gpa = (gpa2_t)dlsym(h, "cuGetProcAddress_v2");
    CHECK(gpa == cuGetProcAddress_v2, "dlsym(cuGetProcAddress_v2) is not the hook");
    void *fn = NULL;
    CHECK_RC(gpa("cuMemAlloc", &fn, 12040, 0, NULL), CUDA_SUCCESS);
    is_capped((alloc_t)fn, "runtime-style lookup");
    gpa_t gpa1 = (gpa_t)dlsym(h, "cuGetProcAddress");
    CHECK(gpa1 == cuGetProcAddress, "dlsym(cuGetProcAddress) is not the hook");
}

static void dlsym_returns_hooks(void) {
    small_cap();
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    CHECK(h != NULL, "dlopen: %s", dlerror());
    alloc_t fn = (alloc_t)dlsym(h, "cuMemAlloc_v2");
    CHECK(fn == cuMemAlloc_v2, "dlsym(handle, cuMemAlloc_v2)");
    is_capped(fn, "dlsym(handle)");
    is_capped((alloc_t)dlsym(RTLD_DEFAULT, "cuMemAlloc_v2"), "dlsym(RTLD_DEFAULT)");
    is_capped((alloc_t)dlsym(RTLD_NEXT, "cuMemAlloc_v2"), "dlsym(RTLD_NEXT)");
    CHECK(dlsym(h, "cuLaunchKernel") == (void *)cuLaunchKernel, "launch");
    CHECK(dlsym(h, "cuCtxSynchronize") != NULL, "unhooked symbol resolves");
    CHECK(dlsym(h, "cuMemAlloc_v9") == NULL, "missing symbol stays missing");
    void *libc = dlopen("libc.so.6", RTLD_NOW);
    CHECK(dlsym(libc, "cuMemAlloc_v2") == NULL, "a library without the symbol does not get a hook");
    CHECK(dlsym(libc, "malloc") != NULL, "other lookups unchanged");
    void *nv = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    CHECK(nv != NULL, "dlopen nvml");
    CHECK(dlsym(nv, "nvmlDeviceGetMemoryInfo_v2") == (void *)nvmlDeviceGetMemoryInfo_v2, "nvml hook");
}

static void production_library_ignores_the_test_variable(void) {
    /* The shipped libvgpu.so reads only /etc/tessera/limits: pointing TESSERA_TEST_LIMITS at
     * a file of the application's own changes nothing. Run a child with it preloaded. */
    const char *prod = getenv("VGT_PROD_LIB"), *prefix = getenv("VGT_PRELOAD_PREFIX");
    CHECK(prod != NULL, "VGT_PROD_LIB not set (run through tests/run.sh)");
    struct stat st;
    CHECK(stat("/etc/tessera/limits", &st) != 0, "this host has /etc/tessera/limits; test needs it absent");
    vgt_card c = {0, 8, 100, "fixed-share"};
    vgt_limits(1, &c); /* an 8 MiB cap in a file the "application" wrote */
    char preload[1024];
    snprintf(preload, sizeof preload, "%s%s%s", prefix && prefix[0] ? prefix : "", prefix && prefix[0] ? " " : "", prod);
    setenv("LD_PRELOAD", preload, 1);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        execl("/proc/self/exe", "drv_entry", "child_allocates_64mib", (char *)NULL);
        _exit(127);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0,
          "the production library honoured the test variable (child status %d)", status);
}

static void child_allocates_64mib(void) {
    CUdeviceptr p = 0;
    vgt_ctx(0);
    Dl_info info;
    CHECK(dladdr((void *)cuMemAlloc_v2, &info) && strstr(info.dli_fname, "libvgpu") != NULL,
          "libvgpu is not preloaded here");
    CHECK_RC(cuMemAlloc_v2(&p, 64 * VGT_MIB), CUDA_SUCCESS);
}

VGT_MAIN(VGT_CASE(get_proc_address_returns_hooks), VGT_CASE(get_proc_address_internal_pointers),
         VGT_CASE(get_proc_address_passes_the_drivers_version_rule),
         VGT_CASE(runtime_style_lookup_through_dlsym), VGT_CASE(dlsym_returns_hooks),
         VGT_CASE(production_library_ignores_the_test_variable), VGT_CASE(child_allocates_64mib))
