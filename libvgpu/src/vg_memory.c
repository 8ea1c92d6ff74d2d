/*
 * vg_memory.c - the memory cap: every allocation path reserves quota in the usage region
 * before the driver is called (over the cap: CUDA_ERROR_OUT_OF_MEMORY, driver untouched);
 * a failed allocation gives the reservation back; a free gives back what its allocation
 * took. Queries (cuMemGetInfo, cuDeviceTotalMem) report the slice. Arguments the driver
 * would refuse (NULL out-pointers, size 0) go to the driver unaccounted, so the
 * application sees the driver's own answer.
 */
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "vg_export.h"
#include "vg_hold.h"
#include "vg_real.h"
#include "vg_state.h"

static uint64_t vg_mul(uint64_t a, uint64_t b) {
    if (a != 0 && b > UINT64_MAX / a) return UINT64_MAX;
    return a * b;
}

/* Reserve bytes on card before the driver is called. CUDA_SUCCESS: call the driver
 * (h->held says whether quota was taken); otherwise the answer to give the caller. */
CUresult vg_hold_card(int card, uint64_t bytes, vg_hold *h) {
    h->held = 0;
    h->card = card;
    h->bytes = bytes;
    vg_mode m = vg_init();
    if (m == VG_MODE_BROKEN) return CUDA_ERROR_NOT_INITIALIZED;
    if (m == VG_MODE_INERT || bytes == 0) return CUDA_SUCCESS;
    if (card < 0) return CUDA_ERROR_OUT_OF_MEMORY; /* not one of the container's cards */
    int s = vg_my_slot();
    if (s < 0) return CUDA_ERROR_OUT_OF_MEMORY;
    if (vg_region_reserve(vg_g.region, s, card, bytes, vg_g.limits.cards[card].memory_bytes) != VG_OK)
        return CUDA_ERROR_OUT_OF_MEMORY;
    h->held = 1;
    return CUDA_SUCCESS;
}

/* As vg_hold_card, on the card of the current context. Without a context the driver
 * answers (CUDA_ERROR_INVALID_CONTEXT), so nothing is reserved. */
CUresult vg_hold_current(uint64_t bytes, vg_hold *h) {
    int card = -1;
    vg_mode m = vg_init();
    h->held = 0;
    if (m == VG_MODE_BROKEN) return CUDA_ERROR_NOT_INITIALIZED;
    if (m == VG_MODE_INERT || bytes == 0 || vg_current_card(&card) != 0) return CUDA_SUCCESS;
    return vg_hold_card(card, bytes, h);
}

/* The driver returned actual > h->bytes (pitch padding): reserve the difference. */
static CUresult vg_hold_grow(vg_hold *h, uint64_t actual) {
    if (!h->held || actual <= h->bytes) return CUDA_SUCCESS;
    if (vg_region_reserve(vg_g.region, vg_g.slot, h->card, actual - h->bytes,
                          vg_g.limits.cards[h->card].memory_bytes) != VG_OK)
        return CUDA_ERROR_OUT_OF_MEMORY;
    h->bytes = actual;
    return CUDA_SUCCESS;
}

/* After the driver answered r: keep the reservation under key, or give it back. */
void vg_hold_done(vg_hold *h, CUresult r, vg_table *t, uint64_t key) {
    if (!h->held) return;
    if (r == CUDA_SUCCESS && vg_table_put(t, key, h->bytes, h->card) == VG_OK) return;
    vg_region_unreserve(vg_g.region, vg_g.slot, h->card, h->bytes);
}

/* Before a free: take key out of the table (so a racing allocation that gets the same
 * address back from the driver is not confused with it). */
void vg_forget_begin(vg_table *t, uint64_t key, vg_hold *h) {
    h->held = vg_init() == VG_MODE_ACTIVE && vg_table_take(t, key, &h->bytes, &h->card);
}

/* After the driver freed (r == CUDA_SUCCESS) give the quota back; else put key back. */
void vg_forget_end(vg_table *t, uint64_t key, vg_hold *h, CUresult r) {
    if (!h->held) return;
    if (r == CUDA_SUCCESS)
        vg_region_unreserve(vg_g.region, vg_g.slot, h->card, h->bytes);
    else
        vg_table_put(t, key, h->bytes, h->card);
}

/* ---- linear allocations ---- */

VG_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t size) {
    vg_hold h;
    CUresult r = vg_hold_current(dptr ? size : 0, &h);
    if (r != CUDA_SUCCESS) return r;
    r = VG_CALL(cuMemAlloc_v2, dptr, size);
    vg_hold_done(&h, r, &vg_ptrs, r == CUDA_SUCCESS ? *dptr : 0);
    return r;
}

VG_EXPORT CUresult cuMemAlloc(CUdeviceptr_v1 *dptr, unsigned int size) {
    vg_hold h;
    CUresult r = vg_hold_current(dptr ? size : 0, &h);
    if (r != CUDA_SUCCESS) return r;
    r = VG_CALL(cuMemAlloc, dptr, size);
    vg_hold_done(&h, r, &vg_ptrs, r == CUDA_SUCCESS ? *dptr : 0);
    return r;
}

VG_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t w, size_t h,
                                      unsigned int elem) {
    vg_hold hd;
    CUresult r = vg_hold_current(dptr && pitch ? vg_mul(w, h) : 0, &hd);
    if (r != CUDA_SUCCESS) return r;
    r = VG_CALL(cuMemAllocPitch_v2, dptr, pitch, w, h, elem);
    if (r == CUDA_SUCCESS && vg_hold_grow(&hd, vg_mul(*pitch, h)) != CUDA_SUCCESS) {
        VG_CALL(cuMemFree_v2, *dptr);
        r = CUDA_ERROR_OUT_OF_MEMORY;
    }
    vg_hold_done(&hd, r, &vg_ptrs, r == CUDA_SUCCESS ? *dptr : 0);
    return r;
}

VG_EXPORT CUresult cuMemAllocPitch(CUdeviceptr_v1 *dptr, unsigned int *pitch, unsigned int w,
                                   unsigned int h, unsigned int elem) {
    vg_hold hd;
    CUresult r = vg_hold_current(dptr && pitch ? vg_mul(w, h) : 0, &hd);
    if (r != CUDA_SUCCESS) return r;
    r = VG_CALL(cuMemAllocPitch, dptr, pitch, w, h, elem);
    if (r == CUDA_SUCCESS && vg_hold_grow(&hd, vg_mul(*pitch, h)) != CUDA_SUCCESS) {
        VG_CALL(cuMemFree, *dptr);
        r = CUDA_ERROR_OUT_OF_MEMORY;
    }
    vg_hold_done(&hd, r, &vg_ptrs, r == CUDA_SUCCESS ? *dptr : 0);
    return r;
}

VG_EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t size, unsigned int flags) {
    vg_hold h;
    CUresult r = vg_hold_current(dptr ? size : 0, &h);
    if (r != CUDA_SUCCESS) return r;
    r = VG_CALL(cuMemAllocManaged, dptr, size, flags);
    vg_hold_done(&h, r, &vg_ptrs, r == CUDA_SUCCESS ? *dptr : 0);
    return r;
}

static int vg_pool_free_begin(CUdeviceptr dptr, uint64_t *bytes, int *rec);
static void vg_pool_free_end(CUdeviceptr dptr, uint64_t bytes, int rec, CUresult r);

VG_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr) {
    vg_hold h;
    uint64_t bytes = 0;
    int rec = -1;
    VG_GUARD();
    if (vg_pool_free_begin(dptr, &bytes, &rec)) { /* stream-ordered memory, freed here */
        CUresult r = VG_CALL(cuMemFree_v2, dptr);
        vg_pool_free_end(dptr, bytes, rec, r);
        return r;
    }
    vg_forget_begin(&vg_ptrs, dptr, &h);
    CUresult r = VG_CALL(cuMemFree_v2, dptr);
    vg_forget_end(&vg_ptrs, dptr, &h, r);
    return r;
}

VG_EXPORT CUresult cuMemFree(CUdeviceptr_v1 dptr) {
    vg_hold h;
    VG_GUARD();
    vg_forget_begin(&vg_ptrs, dptr, &h);
    CUresult r = VG_CALL(cuMemFree, dptr);
    vg_forget_end(&vg_ptrs, dptr, &h, r);
    return r;
}

/* ---- stream-ordered allocations and pools ----
 *
 * A pool keeps up to its release threshold (CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, 0 by
 * default; PyTorch's cudaMallocAsync backend raises it to "keep everything") of freed
 * memory reserved on the card, and hands it out again before taking more. libvgpu counts
 * what pools reserve, not only what they hand out: a free keeps its bytes charged as the
 * pool's `retained` up to the threshold, an allocation from the pool uses the retained
 * charge first, and lowering the threshold, cuMemPoolTrimTo and destroying the pool give
 * the rest back. (Otherwise another allocation path could take the cap again beside a
 * full pool.) Each pool is recorded with its card the first time libvgpu sees it:
 * created (cuMemPoolCreate: the card its props name) or a device's pool (the current
 * pool of the current context's device, asked of the driver at each cuMemAllocAsync).
 */
#define VG_MAX_POOLS 64

typedef struct vg_pool {
    CUmemoryPool handle; /* NULL: free record */
    int card;
    uint64_t threshold, retained;
} vg_pool;

static vg_pool vg_pool_recs[VG_MAX_POOLS];
static pthread_mutex_t vg_pool_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t vg_pool_once = PTHREAD_ONCE_INIT;

/* A child of fork owns none of its parent's pools (nor their charge). */
static void vg_pool_atfork_child(void) {
    pthread_mutex_init(&vg_pool_mu, NULL);
    memset(vg_pool_recs, 0, sizeof vg_pool_recs);
}

static void vg_pool_register_atfork(void) { pthread_atfork(NULL, NULL, vg_pool_atfork_child); }

/* The record of pool (made with card if new); NULL when all records are taken (the pool
 * is then counted as before: what it hands out). vg_pool_mu held. */
static vg_pool *vg_pool_of(CUmemoryPool pool, int card) {
    vg_pool *free_rec = NULL;
    pthread_once(&vg_pool_once, vg_pool_register_atfork);
    for (int i = 0; i < VG_MAX_POOLS; i++) {
        if (vg_pool_recs[i].handle == pool) return &vg_pool_recs[i];
        if (vg_pool_recs[i].handle == NULL && free_rec == NULL) free_rec = &vg_pool_recs[i];
    }
    if (free_rec == NULL || card < 0) return NULL;
    *free_rec = (vg_pool){pool, card, 0, 0};
    return free_rec;
}

/* Give back what pool retains above keep. vg_pool_mu held. */
static void vg_pool_release_to(vg_pool *p, uint64_t keep) {
    if (p->retained <= keep) return;
    vg_region_unreserve(vg_g.region, vg_g.slot, p->card, p->retained - keep);
    p->retained = keep;
}

/* n bytes from pool (card: its card if new): the retained charge first, then a hold.
 * Returns the answer for the caller; on success *rec (may be NULL) and *h are set. */
static CUresult vg_pool_take(CUmemoryPool pool, int card, uint64_t n, vg_pool **rec, vg_hold *h,
                             uint64_t *reused) {
    *reused = 0;
    pthread_mutex_lock(&vg_pool_mu);
    vg_pool *p = vg_pool_of(pool, card);
    if (p != NULL) {
        *reused = p->retained < n ? p->retained : n;
        p->retained -= *reused;
        card = p->card;
    }
    pthread_mutex_unlock(&vg_pool_mu);
    *rec = p;
    CUresult r = vg_hold_card(card, n - *reused, h);
    if (r != CUDA_SUCCESS && *reused) {
        pthread_mutex_lock(&vg_pool_mu);
        p->retained += *reused;
        pthread_mutex_unlock(&vg_pool_mu);
    }
    return r;
}

/* After the driver answered r for an allocation from a pool. */
static void vg_pool_took(vg_pool *p, vg_hold *h, uint64_t reused, CUresult r, CUdeviceptr ptr) {
    if (r != CUDA_SUCCESS) {
        vg_hold_done(h, r, &vg_ptrs, 0);
        if (reused) {
            pthread_mutex_lock(&vg_pool_mu);
            p->retained += reused;
            pthread_mutex_unlock(&vg_pool_mu);
        }
        return;
    }
    if (p == NULL) {
        vg_hold_done(h, r, &vg_ptrs, ptr);
        return;
    }
    /* The pointer holds all it took (new hold and reused charge); its card field says
     * which pool record, so the free can give it back to the pool. */
    if (vg_table_put(&vg_pool_ptrs, ptr, h->bytes + reused, (int)(p - vg_pool_recs)) != VG_OK) {
        vg_hold_done(h, CUDA_ERROR_UNKNOWN, &vg_ptrs, 0);
        if (reused) vg_region_unreserve(vg_g.region, vg_g.slot, p->card, reused);
    }
}

/* The current context's card and its device's current pool; -1 without a context. */
static int vg_current_pool(CUmemoryPool *pool) {
    CUdevice dev = -1;
    int card = -1;
    *pool = NULL;
    if (vg_current_card(&card) != 0 || VG_CALL(cuCtxGetDevice, &dev) != CUDA_SUCCESS ||
        VG_CALL(cuDeviceGetMemPool, pool, dev) != CUDA_SUCCESS)
        return -1;
    return card;
}

/* On a capturing stream the allocation is a memory node of the graph: charged when the
 * graph is instantiated (vg_graph.c), not here. */
#define VG_ALLOC_ASYNC(name, ptsz)                                                           \
    VG_EXPORT CUresult name(CUdeviceptr *dptr, size_t size, CUstream s) {                    \
        vg_hold h;                                                                           \
        CUmemoryPool pool = NULL;                                                            \
        vg_pool *rec = NULL;                                                                 \
        uint64_t reused = 0;                                                                 \
        int card;                                                                            \
        if (vg_init() == VG_MODE_ACTIVE && dptr != NULL && size != 0 &&                      \
            vg_capturing(s != NULL ? s : (ptsz) ? CU_STREAM_PER_THREAD : CU_STREAM_LEGACY))  \
            return VG_CALL(name, dptr, size, s);                                             \
        if (vg_init() == VG_MODE_ACTIVE && dptr != NULL && size != 0 &&                      \
            (card = vg_current_pool(&pool)) >= 0) {                                          \
            CUresult r = vg_pool_take(pool, card, size, &rec, &h, &reused);                  \
            if (r != CUDA_SUCCESS) return r;                                                 \
            r = VG_CALL(name, dptr, size, s);                                                \
            vg_pool_took(rec, &h, reused, r, r == CUDA_SUCCESS ? *dptr : 0);                 \
            return r;                                                                        \
        }                                                                                    \
        CUresult r = vg_hold_current(dptr ? size : 0, &h);                                   \
        if (r != CUDA_SUCCESS) return r;                                                     \
        r = VG_CALL(name, dptr, size, s);                                                    \
        vg_hold_done(&h, r, &vg_ptrs, r == CUDA_SUCCESS ? *dptr : 0);                        \
        return r;                                                                            \
    }
VG_ALLOC_ASYNC(cuMemAllocAsync, 0)
VG_ALLOC_ASYNC(cuMemAllocAsync_ptsz, 1)

/* A pool made by cuMemPoolCreate is on the card its props name; any other pool (a
 * device's default pool) belongs to the current context's card. */
#define VG_ALLOC_POOL(name)                                                                  \
    VG_EXPORT CUresult name(CUdeviceptr *dptr, size_t size, CUmemoryPool pool, CUstream s) { \
        vg_hold h;                                                                           \
        vg_pool *rec = NULL;                                                                 \
        uint64_t reused = 0;                                                                 \
        int card = -1;                                                                       \
        if (vg_init() == VG_MODE_ACTIVE && dptr != NULL && size != 0 && pool != NULL &&      \
            vg_current_card(&card) == 0) {                                                   \
            CUresult r = vg_pool_take(pool, card, size, &rec, &h, &reused);                  \
            if (r != CUDA_SUCCESS) return r;                                                 \
            r = VG_CALL(name, dptr, size, pool, s);                                          \
            vg_pool_took(rec, &h, reused, r, r == CUDA_SUCCESS ? *dptr : 0);                 \
            return r;                                                                        \
        }                                                                                    \
        CUresult r = vg_hold_current(dptr && pool ? size : 0, &h);                           \
        if (r != CUDA_SUCCESS) return r;                                                     \
        r = VG_CALL(name, dptr, size, pool, s);                                              \
        vg_hold_done(&h, r, &vg_ptrs, r == CUDA_SUCCESS ? *dptr : 0);                        \
        return r;                                                                            \
    }
VG_ALLOC_POOL(cuMemAllocFromPoolAsync)
VG_ALLOC_POOL(cuMemAllocFromPoolAsync_ptsz)

/* A free of pool memory (cuMemFreeAsync, or cuMemFree, which may free it too): the pool
 * keeps it charged up to its threshold. */
static int vg_pool_free_begin(CUdeviceptr dptr, uint64_t *bytes, int *rec) {
    return vg_g.mode == VG_MODE_ACTIVE && vg_table_take(&vg_pool_ptrs, dptr, bytes, rec);
}

static void vg_pool_free_end(CUdeviceptr dptr, uint64_t bytes, int rec, CUresult r) {
    if (r != CUDA_SUCCESS) {
        vg_table_put(&vg_pool_ptrs, dptr, bytes, rec);
        return;
    }
    pthread_mutex_lock(&vg_pool_mu);
    vg_pool *p = &vg_pool_recs[rec];
    uint64_t room = p->threshold > p->retained ? p->threshold - p->retained : 0;
    uint64_t keep = bytes < room ? bytes : room;
    p->retained += keep;
    if (bytes > keep) vg_region_unreserve(vg_g.region, vg_g.slot, p->card, bytes - keep);
    pthread_mutex_unlock(&vg_pool_mu);
}

#define VG_FREE_ASYNC(name)                                                                  \
    VG_EXPORT CUresult name(CUdeviceptr dptr, CUstream s) {                                  \
        vg_hold h;                                                                           \
        uint64_t bytes = 0;                                                                  \
        int rec = -1;                                                                        \
        VG_GUARD();                                                                          \
        if (vg_pool_free_begin(dptr, &bytes, &rec)) {                                        \
            CUresult r = VG_CALL(name, dptr, s);                                             \
            vg_pool_free_end(dptr, bytes, rec, r);                                           \
            return r;                                                                        \
        }                                                                                    \
        vg_forget_begin(&vg_ptrs, dptr, &h);                                                 \
        CUresult r = VG_CALL(name, dptr, s);                                                 \
        vg_forget_end(&vg_ptrs, dptr, &h, r);                                                \
        return r;                                                                            \
    }
VG_FREE_ASYNC(cuMemFreeAsync)
VG_FREE_ASYNC(cuMemFreeAsync_ptsz)

VG_EXPORT CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props) {
    VG_GUARD();
    CUresult r = VG_CALL(cuMemPoolCreate, pool, props);
    if (r == CUDA_SUCCESS && vg_g.mode == VG_MODE_ACTIVE && props != NULL &&
        props->location.type == CU_MEM_LOCATION_TYPE_DEVICE) {
        pthread_mutex_lock(&vg_pool_mu);
        vg_pool_of(*pool, vg_card_of_dev(props->location.id));
        pthread_mutex_unlock(&vg_pool_mu);
    }
    return r;
}

VG_EXPORT CUresult cuMemPoolDestroy(CUmemoryPool pool) {
    VG_GUARD();
    CUresult r = VG_CALL(cuMemPoolDestroy, pool);
    if (r == CUDA_SUCCESS && vg_g.mode == VG_MODE_ACTIVE && pool != NULL) {
        pthread_mutex_lock(&vg_pool_mu);
        vg_pool *p = vg_pool_of(pool, -1);
        if (p != NULL) {
            vg_pool_release_to(p, 0);
            p->handle = NULL;
        }
        pthread_mutex_unlock(&vg_pool_mu);
    }
    return r;
}

VG_EXPORT CUresult cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value) {
    VG_GUARD();
    CUresult r = VG_CALL(cuMemPoolSetAttribute, pool, attr, value);
    if (r == CUDA_SUCCESS && vg_g.mode == VG_MODE_ACTIVE && attr == CU_MEMPOOL_ATTR_RELEASE_THRESHOLD &&
        value != NULL && pool != NULL) {
        int card = -1;
        vg_current_card(&card); /* a pool seen first here: a device's pool, this card */
        pthread_mutex_lock(&vg_pool_mu);
        vg_pool *p = vg_pool_of(pool, card);
        if (p != NULL) {
            p->threshold = *(const cuuint64_t *)value;
            vg_pool_release_to(p, p->threshold);
        }
        pthread_mutex_unlock(&vg_pool_mu);
    }
    return r;
}

VG_EXPORT CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t keep) {
    VG_GUARD();
    CUresult r = VG_CALL(cuMemPoolTrimTo, pool, keep);
    if (r == CUDA_SUCCESS && vg_g.mode == VG_MODE_ACTIVE && pool != NULL) {
        pthread_mutex_lock(&vg_pool_mu);
        vg_pool *p = vg_pool_of(pool, -1);
        if (p != NULL) vg_pool_release_to(p, keep);
        pthread_mutex_unlock(&vg_pool_mu);
    }
    return r;
}

/* ---- virtual memory management: physical memory is what cuMemCreate makes ---- */

VG_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                               const CUmemAllocationProp *prop, unsigned long long flags) {
    vg_hold h;
    int on_device = handle != NULL && prop != NULL && prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE;
    CUresult r;
    VG_GUARD();
    if (on_device && vg_g.mode == VG_MODE_ACTIVE)
        r = vg_hold_card(vg_card_of_dev(prop->location.id), size, &h);
    else
        r = vg_hold_card(-1, 0, &h);
    if (r != CUDA_SUCCESS) return r;
    r = VG_CALL(cuMemCreate, handle, size, prop, flags);
    vg_hold_done(&h, r, &vg_handles, r == CUDA_SUCCESS ? *handle : 0);
    return r;
}

VG_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
    vg_hold h;
    VG_GUARD();
    vg_forget_begin(&vg_handles, handle, &h);
    CUresult r = VG_CALL(cuMemRelease, handle);
    vg_forget_end(&vg_handles, handle, &h, r);
    return r;
}

/* ---- arrays (textures, surfaces): sized from the descriptor, a lower bound of what the
 * driver takes (it may pad) ---- */

static uint64_t vg_array_bytes(size_t w, size_t h, size_t d, CUarray_format fmt, unsigned ch) {
    uint64_t elem;
    switch (fmt) {
    case CU_AD_FORMAT_UNSIGNED_INT8:
    case CU_AD_FORMAT_SIGNED_INT8: elem = 1; break;
    case CU_AD_FORMAT_UNSIGNED_INT16:
    case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_HALF: elem = 2; break;
    default: elem = 4; break;
    }
    return vg_mul(vg_mul(vg_mul(w, h ? h : 1), d ? d : 1), vg_mul(ch, elem));
}

#define VG_ARRAY_CREATE(name, desc_t, depth)                                                 \
    VG_EXPORT CUresult name(CUarray *a, const desc_t *d) {                                   \
        vg_hold h;                                                                           \
        uint64_t bytes = a && d ? vg_array_bytes(d->Width, d->Height, depth, d->Format,      \
                                                 d->NumChannels)                             \
                                : 0;                                                         \
        CUresult r = vg_hold_current(bytes, &h);                                             \
        if (r != CUDA_SUCCESS) return r;                                                     \
        r = VG_CALL(name, a, d);                                                             \
        vg_hold_done(&h, r, &vg_arrays, r == CUDA_SUCCESS ? (uint64_t)(uintptr_t)*a : 0);    \
        return r;                                                                            \
    }
VG_ARRAY_CREATE(cuArrayCreate, CUDA_ARRAY_DESCRIPTOR, 1)
VG_ARRAY_CREATE(cuArrayCreate_v2, CUDA_ARRAY_DESCRIPTOR, 1)
VG_ARRAY_CREATE(cuArray3DCreate, CUDA_ARRAY3D_DESCRIPTOR, d->Depth)
VG_ARRAY_CREATE(cuArray3DCreate_v2, CUDA_ARRAY3D_DESCRIPTOR, d->Depth)

VG_EXPORT CUresult cuArrayDestroy(CUarray a) {
    vg_hold h;
    VG_GUARD();
    vg_forget_begin(&vg_arrays, (uint64_t)(uintptr_t)a, &h);
    CUresult r = VG_CALL(cuArrayDestroy, a);
    vg_forget_end(&vg_arrays, (uint64_t)(uintptr_t)a, &h, r);
    return r;
}

/* Every level of a mipmapped array, each half the one before in each dimension the
 * descriptor has (at least 1). */
static uint64_t vg_mipmap_bytes(const CUDA_ARRAY3D_DESCRIPTOR *d, unsigned levels) {
    uint64_t sum = 0;
    for (unsigned l = 0; l < levels && l < 64; l++) {
        size_t w = d->Width >> l, h = d->Height >> l, z = d->Depth >> l;
        uint64_t b = vg_array_bytes(w ? w : 1, d->Height ? (h ? h : 1) : 0, d->Depth ? (z ? z : 1) : 0,
                                    d->Format, d->NumChannels);
        sum = sum > UINT64_MAX - b ? UINT64_MAX : sum + b;
    }
    return sum;
}

VG_EXPORT CUresult cuMipmappedArrayCreate(CUmipmappedArray *m, const CUDA_ARRAY3D_DESCRIPTOR *d,
                                          unsigned int levels) {
    vg_hold h;
    CUresult r = vg_hold_current(m && d ? vg_mipmap_bytes(d, levels) : 0, &h);
    if (r != CUDA_SUCCESS) return r;
    r = VG_CALL(cuMipmappedArrayCreate, m, d, levels);
    vg_hold_done(&h, r, &vg_arrays, r == CUDA_SUCCESS ? (uint64_t)(uintptr_t)*m : 0);
    return r;
}

VG_EXPORT CUresult cuMipmappedArrayDestroy(CUmipmappedArray m) {
    vg_hold h;
    VG_GUARD();
    vg_forget_begin(&vg_arrays, (uint64_t)(uintptr_t)m, &h);
    CUresult r = VG_CALL(cuMipmappedArrayDestroy, m);
    vg_forget_end(&vg_arrays, (uint64_t)(uintptr_t)m, &h, r);
    return r;
}

/* ---- external memory (Vulkan, D3D, NvSciBuf): the size its descriptor names, on the
 * current context's card; it is device memory the container uses ---- */

VG_EXPORT CUresult cuImportExternalMemory(CUexternalMemory *m, const CUDA_EXTERNAL_MEMORY_HANDLE_DESC *d) {
    vg_hold h;
    CUresult r = vg_hold_current(m && d ? d->size : 0, &h);
    if (r != CUDA_SUCCESS) return r;
    r = VG_CALL(cuImportExternalMemory, m, d);
    vg_hold_done(&h, r, &vg_arrays, r == CUDA_SUCCESS ? (uint64_t)(uintptr_t)*m : 0);
    return r;
}

VG_EXPORT CUresult cuDestroyExternalMemory(CUexternalMemory m) {
    vg_hold h;
    VG_GUARD();
    vg_forget_begin(&vg_arrays, (uint64_t)(uintptr_t)m, &h);
    CUresult r = VG_CALL(cuDestroyExternalMemory, m);
    vg_forget_end(&vg_arrays, (uint64_t)(uintptr_t)m, &h, r);
    return r;
}

/* ---- what the application is told ---- */

/* Bytes of card free to the container: cap minus what its processes hold. */
static uint64_t vg_card_avail(int card, uint64_t *cap) {
    *cap = card >= 0 ? vg_g.limits.cards[card].memory_bytes : 0;
    uint64_t used = card >= 0 ? vg_region_card_used(vg_g.region, card) : 0;
    return used >= *cap ? 0 : *cap - used;
}

VG_EXPORT CUresult cuMemGetInfo_v2(size_t *free_b, size_t *total) {
    VG_GUARD();
    CUresult r = VG_CALL(cuMemGetInfo_v2, free_b, total);
    int card = -1;
    if (r != CUDA_SUCCESS || vg_g.mode != VG_MODE_ACTIVE || vg_current_card(&card) != 0) return r;
    uint64_t cap = 0, avail = vg_card_avail(card, &cap);
    if (free_b != NULL && *free_b > avail) *free_b = avail;
    if (total != NULL) *total = cap;
    return r;
}

VG_EXPORT CUresult cuMemGetInfo(unsigned int *free_b, unsigned int *total) {
    VG_GUARD();
    CUresult r = VG_CALL(cuMemGetInfo, free_b, total);
    int card = -1;
    if (r != CUDA_SUCCESS || vg_g.mode != VG_MODE_ACTIVE || vg_current_card(&card) != 0) return r;
    uint64_t cap = 0, avail = vg_card_avail(card, &cap);
    if (free_b != NULL && *free_b > avail) *free_b = (unsigned int)avail;
    if (total != NULL) *total = cap > UINT_MAX ? UINT_MAX : (unsigned int)cap;
    return r;
}

VG_EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev) {
    VG_GUARD();
    CUresult r = VG_CALL(cuDeviceTotalMem_v2, bytes, dev);
    if (r == CUDA_SUCCESS && vg_g.mode == VG_MODE_ACTIVE) {
        int card = vg_card_of_dev(dev);
        *bytes = card >= 0 ? vg_g.limits.cards[card].memory_bytes : 0;
    }
    return r;
}

VG_EXPORT CUresult cuDeviceTotalMem(unsigned int *bytes, CUdevice dev) {
    VG_GUARD();
    CUresult r = VG_CALL(cuDeviceTotalMem, bytes, dev);
    if (r == CUDA_SUCCESS && vg_g.mode == VG_MODE_ACTIVE) {
        int card = vg_card_of_dev(dev);
        uint64_t cap = card >= 0 ? vg_g.limits.cards[card].memory_bytes : 0;
        *bytes = cap > UINT_MAX ? UINT_MAX : (unsigned int)cap;
    }
    return r;
}
