/*
 * vg_compute.c - the compute share, on every launch path (VG_CUDA_LAUNCH_FUNCS).
 *
 * Closed loop, per card, shared by the container's processes through the region:
 *   1. Before a launch, refill the card's bucket at share% of wall time; while it is below
 *      zero, sleep (counted as throttled time).
 *   2. The first launch after a drain opens a measurement window and records a CUDA event
 *      on the legacy stream. The first launch that finds the window at least VG_WINDOW_NS
 *      old records a second event, waits for it (the drain) and charges the bucket with
 *      the GPU time between the two events: the window's GPU occupancy, timed by the GPU
 *      itself, so a late host wake-up is not charged. Without events (a driver that
 *      refuses them) the window is timed on the host around cuCtxSynchronize.
 *   3. Windows of several processes of the container that overlap in time are charged
 *      once (the union), through the card's charged_until in the region: on a real GPU
 *      overlapping work time-slices, so both processes saw the same wall time.
 * The charge is what the work really took on the GPU (measured, not estimated from grid
 * sizes), so the share holds whether or not other tenants are on the card; over time
 * the bucket's debt makes the sleeps exactly (1 - share) of the occupancy.
 *
 * fixed-share: share = cores_percent (100: nothing is done but counting launches).
 * burst-share: share = the coordinator's allowance for the card, clamped to
 *              [floor, 100]; the floor when the allowance is missing or older than 3 s.
 * best-effort: launches are only counted.
 */
#include <pthread.h>
#include <stdint.h>
#include <time.h>

#include "vg_bucket.h"
#include "vg_export.h"
#include "vg_real.h"
#include "vg_state.h"

#define VG_WINDOW_NS (10ull * 1000 * 1000)      /* measurement window */
#define VG_BURST_NS (50ll * 1000 * 1000)        /* bucket depth at share 100 */
#define VG_MAX_SLEEP_NS (5ull * 1000 * 1000)    /* re-check the allowance at least this often */
#define VG_ALLOWANCE_POLL_NS (50ull * 1000 * 1000)
#define VG_ALLOWANCE_MAX_AGE_MS 3000ull

#define LOAD(p) __atomic_load_n((p), __ATOMIC_ACQUIRE)
#define STORE(p, v) __atomic_store_n((p), (v), __ATOMIC_RELEASE)
#define ADD(p, v) __atomic_fetch_add((p), (v), __ATOMIC_RELAXED)

typedef struct vg_window {
    uint64_t start_ns; /* host time the window opened; 0: closed */
    int draining;
    int timed;         /* ev[0] was recorded when this window opened */
    CUevent ev[2];     /* created once per card; NULL: time on the host */
} vg_window;

static vg_window vg_win[VG_MAX_CARDS];

static struct {
    uint64_t last_read_ns;
    uint64_t written_ms; /* 0: no valid allowance */
    int pct[VG_MAX_CARDS];
} vg_allow;

/* A child of fork owns none of the parent's windows or events. Registered with the first
 * gated launch, before any window opens (the state's own fork handler is vg_state.c's). */
static void vg_compute_atfork_child(void) {
    for (int i = 0; i < VG_MAX_CARDS; i++) vg_win[i] = (vg_window){0, 0, 0, {NULL, NULL}};
}

static pthread_once_t vg_compute_once = PTHREAD_ONCE_INIT;

static void vg_compute_register_atfork(void) {
    pthread_atfork(NULL, NULL, vg_compute_atfork_child);
}

static void vg_allowance_refresh(uint64_t now) {
    uint64_t last = LOAD(&vg_allow.last_read_ns);
    if (last != 0 && now - last < VG_ALLOWANCE_POLL_NS) return;
    if (!__atomic_compare_exchange_n(&vg_allow.last_read_ns, &last, now, 0, __ATOMIC_ACQ_REL,
                                     __ATOMIC_ACQUIRE))
        return; /* another thread is reading it */
    char text[4096];
    int pct[VG_MAX_CARDS];
    uint64_t written = 0;
    long n = vg_read_file(vg_g.limits.allowance, text, sizeof text);
    if (n < 0 || vg_allowance_parse(text, (size_t)n, pct, &written, NULL, 0) != VG_OK) {
        STORE(&vg_allow.written_ms, 0);
        return;
    }
    for (int i = 0; i < VG_MAX_CARDS; i++) STORE(&vg_allow.pct[i], pct[i]);
    STORE(&vg_allow.written_ms, written);
}

/* The share (1..100) to hold card to now. */
static int vg_share(int card, const vg_card_limit *cl, uint64_t now) {
    int floor = cl->cores_percent;
    if (cl->policy != VG_POLICY_BURST) return floor;
    vg_allowance_refresh(now);
    uint64_t written = LOAD(&vg_allow.written_ms);
    int pct = LOAD(&vg_allow.pct[card]);
    if (written == 0 || pct < 0 || vg_unix_ms() > written + VG_ALLOWANCE_MAX_AGE_MS) return floor;
    return pct < floor ? floor : pct > 100 ? 100 : pct;
}

static void vg_sleep_ns(uint64_t ns) {
    struct timespec ts = {(time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull)};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

typedef struct vg_launch {
    int card;  /* -1: not accounted */
    int gated; /* inside a measurement window */
} vg_launch;

static CUresult vg_launch_begin(vg_launch *l) {
    l->card = -1;
    l->gated = 0;
    vg_mode m = vg_init();
    if (m == VG_MODE_BROKEN) return CUDA_ERROR_NOT_INITIALIZED;
    int card = -1, s;
    if (m == VG_MODE_INERT || vg_current_card(&card) != 0 || card < 0 || (s = vg_my_slot()) < 0)
        return CUDA_SUCCESS;
    vg_card_rec *rec = &vg_g.region->slots[s].cards[card];
    const vg_card_limit *cl = &vg_g.limits.cards[card];
    l->card = card;
    ADD(&rec->launches, 1);
    if (cl->policy == VG_POLICY_BEST_EFFORT) return CUDA_SUCCESS;
    if (cl->policy == VG_POLICY_FIXED && cl->cores_percent >= 100) return CUDA_SUCCESS;

    vg_card_state *cs = &vg_g.region->hdr.cards[card];
    uint64_t now = vg_now_ns(), waited_from = 0;
    for (;;) {
        int share = vg_share(card, cl, now);
        int64_t tokens = vg_bucket_refill(cs, now, share, VG_BURST_NS * share / 100);
        uint64_t wait = vg_bucket_wait_ns(tokens, share);
        if (wait == 0) break;
        if (waited_from == 0) waited_from = now;
        vg_sleep_ns(wait < VG_MAX_SLEEP_NS ? wait : VG_MAX_SLEEP_NS);
        now = vg_now_ns();
    }
    if (waited_from != 0) ADD(&rec->throttled_ns, now - waited_from);
    pthread_once(&vg_compute_once, vg_compute_register_atfork);
    vg_window *w = &vg_win[card];
    uint64_t closed = 0;
    if (__atomic_compare_exchange_n(&w->start_ns, &closed, now, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
        if (w->ev[0] == NULL && (VG_CALL(cuEventCreate, &w->ev[0], 0) != CUDA_SUCCESS ||
                                 VG_CALL(cuEventCreate, &w->ev[1], 0) != CUDA_SUCCESS))
            w->ev[0] = w->ev[1] = NULL;
        STORE(&w->timed, w->ev[0] != NULL && VG_CALL(cuEventRecord, w->ev[0], NULL) == CUDA_SUCCESS);
    }
    l->gated = 1;
    return CUDA_SUCCESS;
}

/* The part of a window [start, end] (host time, GPU time busy) not yet charged by another
 * process of the container: busy scaled by the share of the window after charged_until. */
static uint64_t vg_union_charge(vg_card_state *cs, uint64_t start, uint64_t end, uint64_t busy) {
    uint64_t until = LOAD(&cs->charged_until_ns);
    while (until < end &&
           !__atomic_compare_exchange_n(&cs->charged_until_ns, &until, end, 0, __ATOMIC_ACQ_REL,
                                        __ATOMIC_ACQUIRE)) {
    }
    if (until <= start || end <= start) return busy;
    if (until >= end) return 0;
    return (uint64_t)((double)busy * (double)(end - until) / (double)(end - start));
}

static void vg_launch_end(const vg_launch *l) {
    if (!l->gated) return;
    vg_window *w = &vg_win[l->card];
    uint64_t start = LOAD(&w->start_ns);
    if (start == 0 || vg_now_ns() - start < VG_WINDOW_NS) return;
    int idle = 0;
    if (!__atomic_compare_exchange_n(&w->draining, &idle, 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
        return; /* another thread is draining */
    uint64_t busy = 0;
    float ms = -1.0f;
    if (LOAD(&w->timed) && VG_CALL(cuEventRecord, w->ev[1], NULL) == CUDA_SUCCESS &&
        VG_CALL(cuEventSynchronize, w->ev[1]) == CUDA_SUCCESS &&
        VG_CALL(cuEventElapsedTime, &ms, w->ev[0], w->ev[1]) == CUDA_SUCCESS && ms >= 0.0f)
        busy = (uint64_t)((double)ms * 1e6);
    else
        VG_CALL(cuCtxSynchronize);
    uint64_t end = vg_now_ns();
    if (ms < 0.0f) busy = end - start;
    STORE(&w->start_ns, 0);
    vg_card_state *cs = &vg_g.region->hdr.cards[l->card];
    uint64_t charge = vg_union_charge(cs, start, end, busy);
    vg_bucket_charge(cs, charge);
    ADD(&vg_g.region->slots[vg_g.slot].cards[l->card].busy_ns, charge);
    STORE(&w->draining, 0);
}

#define VG_DEFINE_LAUNCH(name, params, args)                                                 \
    VG_EXPORT CUresult name params {                                                         \
        vg_launch l;                                                                         \
        CUresult r = vg_launch_begin(&l);                                                    \
        if (r != CUDA_SUCCESS) return r;                                                     \
        r = VG_CALL(name, VG_UNPAREN args);                                                  \
        vg_launch_end(&l);                                                                   \
        return r;                                                                            \
    }
#define VG_UNPAREN(...) __VA_ARGS__
VG_CUDA_LAUNCH_FUNCS(VG_DEFINE_LAUNCH)
