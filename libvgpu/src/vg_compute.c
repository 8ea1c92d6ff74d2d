/*
 * vg_compute.c - the compute share, on every launch path (VG_CUDA_LAUNCH_FUNCS).
 *
 * Closed loop, per card, shared by the container's processes through the region:
 *   1. Before a launch, refill the card's bucket at share% of wall time; while it is below
 *      zero, sleep (counted as throttled time).
 *   2. The first launch after a drain opens a measurement window. The first launch on each
 *      stream inside the window records a start event on that stream, and every launch
 *      records the stream's end event after itself -- on the launch's own stream, never
 *      on the legacy stream, so work on non-blocking streams (NCCL, side streams) is
 *      timed and nothing waits on or joins a stream the application did not name. The
 *      first launch that finds the window at least VG_WINDOW_NS old waits for the end
 *      events (the drain) and charges the bucket with the union of the streams' spans:
 *      the window's GPU occupancy, timed by the GPU itself, so a late host wake-up is not
 *      charged. Without events (a driver that refuses them) the window is timed on the
 *      host around cuCtxSynchronize. A window tracks VG_WIN_STREAMS streams; a launch on
 *      one more closes it early (the drain) and opens the next, so no stream's work goes
 *      uncharged however many the application spreads its launches over.
 *   2b. Stream capture (CUDA graphs): a launch into a capturing stream is not run, so it
 *      is neither gated nor timed -- no event, no sleep, nothing the capture would
 *      record or refuse; the graph's work is charged when cuGraphLaunch runs it. The
 *      drain runs with this thread's capture mode RELAXED, so another thread's capture
 *      in GLOBAL mode neither refuses the drain's waits nor is invalidated by them.
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
#include <string.h>
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

/* Streams a window tracks before it closes early: PyTorch's stream pool alone has 32 a
 * priority, and each early close waits for the window's work. */
#define VG_WIN_STREAMS 64
#define VG_WIN_FULL (-2)

typedef struct vg_win_stream {
    CUstream s;
    CUevent start, end; /* created once per slot; kept for the next windows */
    int used;           /* s has work in this window */
} vg_win_stream;

typedef struct vg_window {
    pthread_mutex_t mu;
    uint64_t start_ns; /* host time the window opened; 0: closed */
    int host_timed;    /* the driver refused events: time windows on the host */
    int n;             /* streams used in this window: st[0..n) */
    vg_win_stream st[VG_WIN_STREAMS];
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
    memset(vg_win, 0, sizeof vg_win);
    for (int i = 0; i < VG_MAX_CARDS; i++) pthread_mutex_init(&vg_win[i].mu, NULL);
}

static pthread_once_t vg_compute_once = PTHREAD_ONCE_INIT;

static void vg_compute_register_atfork(void) {
    for (int i = 0; i < VG_MAX_CARDS; i++) pthread_mutex_init(&vg_win[i].mu, NULL);
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
    int card;   /* -1: not accounted */
    int gated;  /* inside a measurement window */
    int slot;   /* its stream's slot in the window; -1: untracked */
    CUstream s; /* the stream it runs on, as an explicit handle */
} vg_launch;

int vg_capturing(CUstream s) {
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
    return VG_CALL(cuStreamIsCapturing, s, &st) == CUDA_SUCCESS && st != CU_STREAM_CAPTURE_STATUS_NONE;
}

/* Open the window if closed, and the slot of stream s in it (start event recorded on s
 * when s is new to the window); VG_WIN_FULL when s is new and the window has no slot
 * left; -1 when s cannot be timed by events. w->mu held. */
static int vg_window_slot(vg_window *w, CUstream s, uint64_t now) {
    if (w->start_ns == 0) w->start_ns = now;
    if (w->host_timed) return -1;
    for (int i = 0; i < w->n; i++)
        if (w->st[i].s == s) return i;
    if (w->n == VG_WIN_STREAMS) return VG_WIN_FULL;
    vg_win_stream *ws = &w->st[w->n];
    if (ws->start == NULL && (VG_CALL(cuEventCreate, &ws->start, 0) != CUDA_SUCCESS ||
                              VG_CALL(cuEventCreate, &ws->end, 0) != CUDA_SUCCESS)) {
        ws->start = ws->end = NULL;
        w->host_timed = 1; /* no events from this driver: host timing from now on */
        return -1;
    }
    if (VG_CALL(cuEventRecord, ws->start, s) != CUDA_SUCCESS) return -1;
    ws->s = s;
    ws->used = 0;
    return w->n++;
}

static void vg_window_close(vg_window *w, int card);

static CUresult vg_launch_begin(vg_launch *l, CUstream s) {
    l->card = -1;
    l->gated = 0;
    l->slot = -1;
    l->s = s;
    vg_mode m = vg_init();
    if (m == VG_MODE_BROKEN) return CUDA_ERROR_NOT_INITIALIZED;
    int card = -1, slot;
    if (m == VG_MODE_INERT || vg_current_card(&card) != 0 || card < 0 || (slot = vg_my_slot()) < 0)
        return CUDA_SUCCESS;
    vg_card_rec *rec = &vg_g.region->slots[slot].cards[card];
    const vg_card_limit *cl = &vg_g.limits.cards[card];
    l->card = card;
    ADD(&rec->launches, 1);
    if (cl->policy == VG_POLICY_BEST_EFFORT) return CUDA_SUCCESS;
    if (cl->policy == VG_POLICY_FIXED && cl->cores_percent >= 100) return CUDA_SUCCESS;
    if (vg_capturing(s)) return CUDA_SUCCESS; /* charged when the graph is launched */

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
    pthread_mutex_lock(&w->mu);
    l->slot = vg_window_slot(w, s, now);
    if (l->slot == VG_WIN_FULL) {
        vg_window_close(w, card);
        l->slot = vg_window_slot(w, s, vg_now_ns());
    }
    pthread_mutex_unlock(&w->mu);
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

/* GPU time covered by the union of the window's stream spans [start_i, end_i], all
 * taken relative to stream 0's start; -1 when the driver cannot time them. */
static int64_t vg_window_busy(vg_window *w) {
    double lo[VG_WIN_STREAMS], hi[VG_WIN_STREAMS];
    int n = 0;
    for (int i = 0; i < w->n; i++) {
        vg_win_stream *ws = &w->st[i];
        float a = 0.0f, b = 0.0f;
        if (!ws->used) continue;
        if (VG_CALL(cuEventSynchronize, ws->end) != CUDA_SUCCESS ||
            VG_CALL(cuEventElapsedTime, &a, w->st[0].start, ws->start) != CUDA_SUCCESS ||
            VG_CALL(cuEventElapsedTime, &b, w->st[0].start, ws->end) != CUDA_SUCCESS)
            return -1;
        if (b <= a) continue;
        /* insertion by start: n is at most VG_WIN_STREAMS */
        int j = n++;
        for (; j > 0 && lo[j - 1] > a; j--) lo[j] = lo[j - 1], hi[j] = hi[j - 1];
        lo[j] = a;
        hi[j] = b;
    }
    double busy = 0.0, reach = -1e300;
    for (int i = 0; i < n; i++) {
        double from = lo[i] > reach ? lo[i] : reach;
        if (hi[i] > from) busy += hi[i] - from;
        if (hi[i] > reach) reach = hi[i];
    }
    return (int64_t)(busy * 1e6);
}

/* The drain: wait for the open window's work, charge the card's bucket with its GPU
 * time, and close it. Its waits are "potentially unsafe" calls under another thread's
 * capture in GLOBAL mode: this thread says RELAXED for their length (a driver without
 * the call has no capture either). w->mu held, the window open. */
static void vg_window_close(vg_window *w, int card) {
    uint64_t start = w->start_ns;
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    int relaxed = VG_CALL(cuThreadExchangeStreamCaptureMode, &mode) == CUDA_SUCCESS;
    int64_t busy = w->host_timed ? -1 : vg_window_busy(w);
    if (busy < 0) VG_CALL(cuCtxSynchronize);
    if (relaxed) VG_CALL(cuThreadExchangeStreamCaptureMode, &mode);
    uint64_t end = vg_now_ns();
    if (busy < 0) busy = (int64_t)(end - start);
    w->start_ns = 0;
    w->n = 0;
    vg_card_state *cs = &vg_g.region->hdr.cards[card];
    uint64_t charge = vg_union_charge(cs, start, end, (uint64_t)busy);
    vg_bucket_charge(cs, charge);
    ADD(&vg_g.region->slots[vg_g.slot].cards[card].busy_ns, charge);
}

static void vg_launch_end(const vg_launch *l, CUresult launched) {
    if (!l->gated) return;
    vg_window *w = &vg_win[l->card];
    pthread_mutex_lock(&w->mu);
    if (l->slot >= 0 && l->slot < w->n && w->st[l->slot].s == l->s && launched == CUDA_SUCCESS &&
        VG_CALL(cuEventRecord, w->st[l->slot].end, l->s) == CUDA_SUCCESS)
        w->st[l->slot].used = 1;
    if (w->start_ns != 0 && vg_now_ns() - w->start_ns >= VG_WINDOW_NS) vg_window_close(w, l->card);
    pthread_mutex_unlock(&w->mu);
}

/* The stream each launch entry runs on, as an explicit handle: NULL in a _ptsz entry is
 * the per-thread default stream, in the others the legacy stream. */
static CUstream vg_explicit(CUstream s, int ptsz) {
    return s != NULL ? s : ptsz ? CU_STREAM_PER_THREAD : CU_STREAM_LEGACY;
}
#define VG_STREAM_cuLaunchKernel vg_explicit(stream, 0)
#define VG_STREAM_cuLaunchKernel_ptsz vg_explicit(stream, 1)
#define VG_STREAM_cuLaunchKernelEx vg_explicit(cfg ? cfg->hStream : NULL, 0)
#define VG_STREAM_cuLaunchKernelEx_ptsz vg_explicit(cfg ? cfg->hStream : NULL, 1)
#define VG_STREAM_cuLaunchCooperativeKernel vg_explicit(stream, 0)
#define VG_STREAM_cuLaunchCooperativeKernel_ptsz vg_explicit(stream, 1)
#define VG_STREAM_cuLaunchCooperativeKernelMultiDevice vg_explicit(list && n ? list[0].hStream : NULL, 0)
#define VG_STREAM_cuGraphLaunch vg_explicit(s, 0)
#define VG_STREAM_cuGraphLaunch_ptsz vg_explicit(s, 1)
#define VG_STREAM_cuLaunch CU_STREAM_LEGACY
#define VG_STREAM_cuLaunchGrid CU_STREAM_LEGACY
#define VG_STREAM_cuLaunchGridAsync vg_explicit(s, 0)

#define VG_DEFINE_LAUNCH(name, params, args)                                                 \
    VG_EXPORT CUresult name params {                                                         \
        vg_launch l;                                                                         \
        CUresult r = vg_launch_begin(&l, VG_STREAM_##name);                                  \
        if (r != CUDA_SUCCESS) return r;                                                     \
        r = VG_CALL(name, VG_UNPAREN args);                                                  \
        vg_launch_end(&l, r);                                                                \
        return r;                                                                            \
    }
VG_CUDA_LAUNCH_FUNCS(VG_DEFINE_LAUNCH)
