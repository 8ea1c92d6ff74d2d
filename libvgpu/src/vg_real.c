/* vg_real.c - see vg_real.h. */
#define _GNU_SOURCE
#include "vg_real.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "vg_export.h"

#define VG_NAME(name, params, args) #name,
static const char *const vg_cu_names[VG_CU_COUNT] = {VG_CUDA_FUNCS(VG_NAME) VG_CUDA_USED(VG_NAME)};
static const char *const vg_nv_names[VG_NV_COUNT] = {VG_NVML_FUNCS(VG_NAME) VG_NVML_USED(VG_NAME)};
#undef VG_NAME

#define VG_HOOK(name, params, args) (void *)name,
static void *const vg_cu_hooks[] = {VG_CUDA_FUNCS(VG_HOOK)};
static void *const vg_nv_hooks[] = {VG_NVML_FUNCS(VG_HOOK)};
#undef VG_HOOK
#define VG_NHOOK(a) ((int)(sizeof(a) / sizeof((a)[0])))

static void *vg_cu_fn[VG_CU_COUNT];
static void *vg_nv_fn[VG_NV_COUNT];
static pthread_once_t vg_cu_once = PTHREAD_ONCE_INIT;
static pthread_once_t vg_nv_once = PTHREAD_ONCE_INIT;
typedef void *(*vg_dlsym_fn)(void *, const char *);
static vg_dlsym_fn vg_real_dlsym;

/* dlsym runs before anything else in the process is set up (a sanitizer runtime resolves
 * its interceptors with it before it initialises), so this path is kept free of
 * instrumentation and of locks: a racing second lookup of the same pointer is harmless. */
#define VG_NO_SANITIZE __attribute__((no_sanitize("address", "undefined")))

VG_NO_SANITIZE static void *vg_dlsym_real(void *handle, const char *name) {
    vg_dlsym_fn real = __atomic_load_n(&vg_real_dlsym, __ATOMIC_ACQUIRE);
    if (real == NULL) {
        real = (vg_dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
        if (real == NULL) real = (vg_dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
        __atomic_store_n(&vg_real_dlsym, real, __ATOMIC_RELEASE);
    }
    return real ? real(handle, name) : NULL;
}

static void vg_resolve(const char *lib, const char *const *names, void **out, int n) {
    void *h = dlopen(lib, RTLD_NOW | RTLD_GLOBAL);
    if (h == NULL) {
        fprintf(stderr, "[tessera libvgpu] dlopen(%s): %s\n", lib, dlerror());
        return;
    }
    for (int i = 0; i < n; i++) out[i] = vg_dlsym_real(h, names[i]);
}

static void vg_cu_init(void) { vg_resolve("libcuda.so.1", vg_cu_names, vg_cu_fn, VG_CU_COUNT); }
static void vg_nv_init(void) { vg_resolve("libnvidia-ml.so.1", vg_nv_names, vg_nv_fn, VG_NV_COUNT); }

void *vg_cuda_real(int sym) {
    pthread_once(&vg_cu_once, vg_cu_init);
    return vg_cu_fn[sym];
}

void *vg_nvml_real(int sym) {
    pthread_once(&vg_nv_once, vg_nv_init);
    return vg_nv_fn[sym];
}

/* strcmp == 0 without calling into libc (see VG_NO_SANITIZE). */
VG_NO_SANITIZE static int vg_streq(const char *a, const char *b) {
    while (*a && *a == *b) a++, b++;
    return *a == *b;
}

VG_NO_SANITIZE void *vg_hook_by_name(const char *name) {
    if (name[0] == 'c' && name[1] == 'u') {
        for (int i = 0; i < VG_NHOOK(vg_cu_hooks); i++)
            if (vg_streq(name, vg_cu_names[i])) return vg_cu_hooks[i];
    } else if (name[0] == 'n' && name[1] == 'v' && name[2] == 'm' && name[3] == 'l') {
        for (int i = 0; i < VG_NHOOK(vg_nv_hooks); i++)
            if (vg_streq(name, vg_nv_names[i])) return vg_nv_hooks[i];
    }
    return NULL;
}

void *vg_hook_for_proc(const char *sym, void *real, int cuda_version, cuuint64_t flags) {
    if (real == NULL || sym == NULL) return real;
    pthread_once(&vg_cu_once, vg_cu_init);
    /* The driver handed out one of its exported entry points: swap in the hook of the
     * same versioned name, whatever version rules the driver applied. */
    for (int i = 0; i < VG_NHOOK(vg_cu_hooks); i++)
        if (vg_cu_fn[i] == real) return vg_cu_hooks[i];
    /* An internal entry point: choose the versioned name the way the driver does. */
    char name[128];
    int v2_from = strcmp(sym, "cuGetProcAddress") == 0 ? 12000 : 3020;
    if (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) {
        snprintf(name, sizeof name, "%s_ptsz", sym);
        if (vg_hook_by_name(name)) return vg_hook_by_name(name);
    }
    if (cuda_version >= v2_from) {
        snprintf(name, sizeof name, "%s_v2", sym);
        if (vg_hook_by_name(name)) return vg_hook_by_name(name);
    }
    void *hook = vg_hook_by_name(sym);
    return hook ? hook : real;
}

/*
 * dlsym: an application (or the CUDA runtime, or nvidia-smi) that looks a driver function
 * up by name gets the hook. Other names resolve as before. Limitation: RTLD_NEXT resolves
 * relative to libvgpu, not to the caller (glibc offers no public way to pass the caller).
 */
VG_EXPORT VG_NO_SANITIZE void *dlsym(void *handle, const char *name) {
    void *real = vg_dlsym_real(handle, name);
    if (real != NULL) { /* glibc declares name nonnull */
        void *hook = vg_hook_by_name(name);
        if (hook != NULL) return hook;
    }
    return real;
}
