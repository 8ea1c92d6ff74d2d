/*
 * drv_share.c - the compute policies, measured on the fake device's timeline.
 *
 * A launch loop of 1 ms fake kernels keeps the device as busy as libvgpu lets it. The
 * achieved share is the simulated GPU busy time inside a measurement interval divided by
 * the interval (both CLOCK_MONOTONIC): it is what libvgpu's throttling allowed, not a
 * count of the loop's iterations, so a loaded host does not bias it upwards. Intervals
 * are long against the throttle period (tens of ms), so one partial period moves the
 * figure by well under a point.
 */
#include <pthread.h>

#include "vgt_drv.h"

#define MS 1000000ull
#define KERNEL_NS (1 * MS)

typedef enum { L_KERNEL, L_KERNEL_PTSZ, L_EX, L_COOP, L_GRAPH, L_GRID, L_ALL } launch_kind;

static void launch(CUfunction f, launch_kind kind, uint64_t i) {
    CUlaunchConfig cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.gridDimX = cfg.gridDimY = cfg.gridDimZ = cfg.blockDimX = cfg.blockDimY = cfg.blockDimZ = 1;
    if (kind == L_ALL) kind = (launch_kind)(i % L_ALL);
    switch (kind) {
    case L_KERNEL: CHECK_RC(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL), CUDA_SUCCESS); break;
    case L_KERNEL_PTSZ: CHECK_RC(cuLaunchKernel_ptsz(f, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL), CUDA_SUCCESS); break;
    case L_EX: CHECK_RC(cuLaunchKernelEx(&cfg, f, NULL, NULL), CUDA_SUCCESS); break;
    case L_COOP: CHECK_RC(cuLaunchCooperativeKernel(f, 1, 1, 1, 1, 1, 1, 0, NULL, NULL), CUDA_SUCCESS); break;
    case L_GRAPH: CHECK_RC(cuGraphLaunch((CUgraphExec)f, NULL), CUDA_SUCCESS); break;
    case L_GRID: CHECK_RC(cuLaunchGridAsync(f, 1, 1, NULL), CUDA_SUCCESS); break;
    case L_ALL: break;
    }
}

/* Launch until `until`; return nothing. The current context must be set. */
static void loop_until(CUfunction f, launch_kind kind, uint64_t until) {
    for (uint64_t i = 0; vgt_now_ns() < until; i++) launch(f, kind, i);
}

/* Run the loop for warm_ms, then measure for measure_ms; the achieved share in percent. */
static double measure(int dev, CUfunction f, launch_kind kind, uint64_t warm_ms, uint64_t measure_ms) {
    loop_until(f, kind, vgt_now_ns() + warm_ms * MS);
    uint64_t t0 = vgt_now_ns();
    loop_until(f, kind, t0 + measure_ms * MS);
    uint64_t t1 = vgt_now_ns();
    return 100.0 * (double)fakecuda_busy_between(dev, t0, t1) / (double)(t1 - t0);
}

static void fixed_share_holds(int share, launch_kind kind) {
    vgt_card c = {0, 1024, share, "fixed-share"};
    const char *dir = vgt_limits(1, &c);
    vgt_ctx(0);
    CUfunction f = vgt_kernel(KERNEL_NS);
    double got = measure(0, f, kind, 500, 3000);
    fprintf(stderr, "fixed-share %d%%: achieved %.2f%%\n", share, got);
    CHECK(got > share - 3.0 && got < share + 3.0, "fixed-share %d%% achieved %.2f%%, outside +-3 points", share, got);
    const vg_region *r = vgt_region(dir);
    uint64_t throttled = 0, busy = 0;
    for (int s = 0; s < VG_MAX_SLOTS; s++)
        if (r->slots[s].pid == getpid()) throttled = r->slots[s].cards[0].throttled_ns, busy = r->slots[s].cards[0].busy_ns;
    CHECK(throttled > 0 && busy > 0, "throttled %llu ns, busy %llu ns not reported", (unsigned long long)throttled,
          (unsigned long long)busy);
}

static void fixed_share_20(void) { fixed_share_holds(20, L_KERNEL); }
static void fixed_share_50(void) { fixed_share_holds(50, L_KERNEL); }
static void fixed_share_80(void) { fixed_share_holds(80, L_KERNEL); }
static void fixed_share_every_launch_path(void) { fixed_share_holds(30, L_ALL); }
static void fixed_share_graph_launches(void) { fixed_share_holds(40, L_GRAPH); }

static void unthrottled(const char *policy, int cores) {
    vgt_card c = {0, 1024, cores, policy};
    const char *dir = vgt_limits(1, &c);
    vgt_ctx(0);
    CUfunction f = vgt_kernel(KERNEL_NS);
    uint64_t syncs = fakecuda_sync_calls();
    double got = measure(0, f, L_ALL, 100, 1000);
    fprintf(stderr, "%s %d: achieved %.2f%%\n", policy, cores, got);
    /* Untouched: no drain, no wait; the share is whatever the (loaded) host sustains. */
    CHECK(fakecuda_sync_calls() == syncs, "%s: libvgpu synchronised the context", policy);
    const vg_region *r = vgt_region(dir);
    for (int s = 0; s < VG_MAX_SLOTS; s++) {
        if (r->slots[s].pid != getpid()) continue;
        CHECK(r->slots[s].cards[0].throttled_ns == 0, "%s was throttled", policy);
        CHECK(r->slots[s].cards[0].launches > 100, "launches not counted");
    }
    CHECK(got > 80.0, "%s achieved only %.2f%%", policy, got);
}

static void best_effort_is_untouched(void) { unthrottled("best-effort", 0); }
static void fixed_share_100_is_untouched(void) { unthrottled("fixed-share", 100); }

static void burst_share_uses_allowance_and_yields(void) {
    vgt_card c = {0, 1024, 20, "burst-share"};
    const char *dir = vgt_limits(1, &c);
    vgt_ctx(0);
    CUfunction f = vgt_kernel(KERNEL_NS);
    double alone = measure(0, f, L_KERNEL, 300, 2000);
    fprintf(stderr, "burst-share, no allowance: %.2f%%\n", alone);
    CHECK(alone > 17.0 && alone < 23.0, "without an allowance the floor (20%%) holds: %.2f%%", alone);
    int up = 90, down = 20;
    vgt_allowance(dir, vgt_unix_ms(), 1, &up);
    double burst = measure(0, f, L_KERNEL, 300, 2000);
    fprintf(stderr, "burst-share, allowance 90: %.2f%%\n", burst);
    CHECK(burst > 87.0 && burst < 93.0, "with allowance 90 it bursts to 90%%: %.2f%%", burst);
    /* Another tenant needs its share: the coordinator lowers the allowance. Within 300 ms
     * the tenant is back at its floor. */
    vgt_allowance(dir, vgt_unix_ms(), 1, &down);
    double yielded = measure(0, f, L_KERNEL, 300, 2000);
    fprintf(stderr, "burst-share, allowance back to 20: %.2f%%\n", yielded);
    CHECK(yielded > 17.0 && yielded < 23.0, "after the allowance drops it yields to 20%%: %.2f%%", yielded);
    /* A stale allowance (coordinator gone) never keeps borrowed compute. */
    vgt_allowance(dir, vgt_unix_ms() - 10000, 1, &up);
    double stale = measure(0, f, L_KERNEL, 300, 2000);
    CHECK(stale > 17.0 && stale < 23.0, "a stale allowance falls back to the floor: %.2f%%", stale);
}

typedef struct { int dev; double got; } card_run;
static void *run_card(void *arg) {
    card_run *cr = arg;
    CUcontext ctx = NULL;
    CHECK_RC(cuDevicePrimaryCtxRetain(&ctx, cr->dev), CUDA_SUCCESS);
    CHECK_RC(cuCtxSetCurrent(ctx), CUDA_SUCCESS);
    cr->got = measure(cr->dev, vgt_kernel(KERNEL_NS), L_KERNEL, 500, 3000);
    return NULL;
}

static void each_card_has_its_own_share(void) {
    vgt_card c[2] = {{0, 1024, 30, "fixed-share"}, {1, 1024, 60, "fixed-share"}};
    vgt_limits(2, c);
    CHECK_RC(cuInit(0), CUDA_SUCCESS);
    card_run runs[2] = {{0, 0}, {1, 0}};
    pthread_t th[2];
    for (int i = 0; i < 2; i++) pthread_create(&th[i], NULL, run_card, &runs[i]);
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
    fprintf(stderr, "card 0 (30%%): %.2f%%, card 1 (60%%): %.2f%%\n", runs[0].got, runs[1].got);
    CHECK(runs[0].got > 27.0 && runs[0].got < 33.0, "card 0 at 30%%: %.2f%%", runs[0].got);
    CHECK(runs[1].got > 57.0 && runs[1].got < 63.0, "card 1 at 60%%: %.2f%%", runs[1].got);
}

static void processes_share_one_card_share(void) {
    /* Two processes of one container on one card at fixed 40%: together they get 40%.
     * They share one fake device timeline, as on a real GPU. */
    vgt_card c = {0, 1024, 40, "fixed-share"};
    const char *dir = vgt_limits(1, &c);
    char shared[512];
    snprintf(shared, sizeof shared, "%s/fakegpu", dir);
    setenv("FAKECUDA_SHARED", shared, 1);
    uint64_t t0 = vgt_now_ns() + 700 * MS, t1 = t0 + 3000 * MS;
    pid_t kids[2];
    for (int i = 0; i < 2; i++) {
        fflush(NULL);
        kids[i] = fork();
        if (kids[i] == 0) {
            vgt_ctx(0);
            CUfunction f = vgt_kernel(KERNEL_NS);
            loop_until(f, L_KERNEL, t1);
            exit(0);
        }
    }
    for (int i = 0; i < 2; i++) {
        int st = 0;
        waitpid(kids[i], &st, 0);
        CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child %d status %d", i, st);
    }
    CHECK_RC(cuInit(0), CUDA_SUCCESS); /* maps the shared timeline here too */
    uint64_t total = fakecuda_busy_between(0, t0, t1);
    double got = 100.0 * (double)total / (double)(t1 - t0);
    fprintf(stderr, "two processes at a 40%% container share: %.2f%% together\n", got);
    CHECK(got > 37.0 && got < 43.0, "two processes together got %.2f%%, want 40 +- 3", got);
}

VGT_MAIN(VGT_CASE(fixed_share_20), VGT_CASE(fixed_share_50), VGT_CASE(fixed_share_80),
         VGT_CASE(fixed_share_every_launch_path), VGT_CASE(fixed_share_graph_launches),
         VGT_CASE(best_effort_is_untouched), VGT_CASE(fixed_share_100_is_untouched),
         VGT_CASE(burst_share_uses_allowance_and_yields), VGT_CASE(each_card_has_its_own_share),
         VGT_CASE(processes_share_one_card_share))
