/* drv_multiproc.c - the processes of a container share one cap through the usage region;
 * the memory of a process that exits or dies is given back. */
#include <signal.h>

#include "vgt_drv.h"

#define CAP_MIB 256ull

static const char *setup(void) {
    vgt_card c = {0, CAP_MIB, 100, "fixed-share"};
    return vgt_limits(1, &c);
}

/* Fork a child that allocates mib on device 0, reports 'y'/'n' on the pipe, then waits
 * for the parent to close its end of hold (or to kill it). */
static pid_t holder(int mib, int report_fd, const int hold[2]) {
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        int wait_fd = hold[0];
        close(hold[1]);
        vgt_ctx(0);
        CUdeviceptr p = 0;
        char ok = cuMemAlloc_v2(&p, (size_t)mib * VGT_MIB) == CUDA_SUCCESS ? 'y' : 'n';
        CUfunction f = vgt_kernel(1000);
        for (int i = 0; i < 10; i++) cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
        if (write(report_fd, &ok, 1) != 1) _exit(3);
        char buf;
        while (read(wait_fd, &buf, 1) > 0) {
        }
        exit(0); /* a normal exit runs libvgpu's destructor, which retires the slot */
    }
    return pid;
}

static void several_processes_share_one_cap(void) {
    const char *dir = setup();
    int rep[2], hold[2];
    CHECK(pipe(rep) == 0 && pipe(hold) == 0, "pipe");
    pid_t kids[4];
    for (int i = 0; i < 4; i++) kids[i] = holder(64, rep[1], hold);
    close(hold[0]);
    for (int i = 0; i < 4; i++) {
        char ok = 0;
        CHECK(read(rep[0], &ok, 1) == 1 && ok == 'y', "child %d could not allocate its 64 MiB", i);
    }
    vgt_ctx(0);
    CUdeviceptr p = 0;
    CHECK_RC(cuMemAlloc_v2(&p, VGT_MIB), CUDA_ERROR_OUT_OF_MEMORY); /* 4 x 64 = the cap */
    size_t f = 0, t = 0;
    CHECK_RC(cuMemGetInfo_v2(&f, &t), CUDA_SUCCESS);
    CHECK(f == 0 && t == CAP_MIB * VGT_MIB, "free %zu total %zu", f, t);
    const vg_region *r = vgt_region(dir);
    int live = 0;
    for (int s = 0; s < VG_MAX_SLOTS; s++) live += r->slots[s].state == VG_SLOT_LIVE;
    CHECK(live == 5, "%d live slots", live);
    close(hold[1]); /* children exit normally */
    for (int i = 0; i < 4; i++) waitpid(kids[i], NULL, 0);
    CHECK_RC(cuMemAlloc_v2(&p, CAP_MIB * VGT_MIB), CUDA_SUCCESS);
    CHECK(r->hdr.cards[0].retired_launches == 40, "retired launches %llu",
          (unsigned long long)r->hdr.cards[0].retired_launches);
    CHECK(r->hdr.reclaimed_procs == 0, "a normal exit is not a reclaim");
}

static void killed_process_memory_is_reclaimed(void) {
    const char *dir = setup();
    int rep[2], hold[2];
    CHECK(pipe(rep) == 0 && pipe(hold) == 0, "pipe");
    pid_t a = holder(200, rep[1], hold);
    pid_t b = holder(50, rep[1], hold);
    char ok = 0;
    CHECK(read(rep[0], &ok, 1) == 1 && ok == 'y', "first child");
    CHECK(read(rep[0], &ok, 1) == 1 && ok == 'y', "second child");
    vgt_ctx(0);
    CUdeviceptr p = 0;
    CHECK_RC(cuMemAlloc_v2(&p, 10 * VGT_MIB), CUDA_ERROR_OUT_OF_MEMORY);
    kill(a, SIGKILL);
    kill(b, SIGKILL);
    waitpid(a, NULL, 0); /* a is reaped; b stays a zombie until later: both are dead */
    usleep(100000);
    CHECK_RC(cuMemAlloc_v2(&p, (CAP_MIB - 1) * VGT_MIB), CUDA_SUCCESS);
    const vg_region *r = vgt_region(dir);
    CHECK(r->hdr.reclaimed_procs == 2, "reclaimed %llu", (unsigned long long)r->hdr.reclaimed_procs);
    CHECK(r->hdr.cards[0].reclaimed_bytes == 250 * VGT_MIB, "reclaimed bytes %llu",
          (unsigned long long)r->hdr.cards[0].reclaimed_bytes);
    CHECK(r->hdr.cards[0].retired_launches == 20, "launches of the dead are kept");
    waitpid(b, NULL, 0);
}

static void fork_child_starts_with_nothing(void) {
    const char *dir = setup();
    vgt_ctx(0);
    CUdeviceptr p = 0, q = 0;
    CHECK_RC(cuMemAlloc_v2(&p, 100 * VGT_MIB), CUDA_SUCCESS);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        /* The child holds no memory of its own: freeing the parent's pointer gives nothing back. */
        const vg_region *r = vgt_region(dir);
        if (cuMemAlloc_v2(&q, 100 * VGT_MIB) != CUDA_SUCCESS) _exit(2);
        if (vgt_used(r, 0) != 200 * VGT_MIB) _exit(3);
        if (cuMemAlloc_v2(&q, 57 * VGT_MIB) != CUDA_ERROR_OUT_OF_MEMORY) _exit(4);
        exit(0); /* a normal exit: libvgpu gives the child's slot back */
    }
    int st = 0;
    waitpid(pid, &st, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child status %d", WEXITSTATUS(st));
    CHECK(vgt_used(vgt_region(dir), 0) == 100 * VGT_MIB, "parent's accounting after the child");
}

static uint64_t own_busy_ns(const vg_region *r) {
    for (int s = 0; s < VG_MAX_SLOTS; s++)
        if (r->slots[s].state == VG_SLOT_LIVE && r->slots[s].pid == getpid()) return r->slots[s].cards[0].busy_ns;
    return UINT64_MAX;
}

static void fork_child_opens_its_own_compute_window(void) {
    vgt_card c = {0, 1024, 50, "fixed-share"};
    const char *dir = vgt_limits(1, &c);
    vgt_ctx(0);
    CUfunction f = vgt_kernel(1000);
    CHECK_RC(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL), CUDA_SUCCESS); /* opens a window */
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        usleep(50000); /* the parent's window is now 50 ms old, past the 10 ms window */
        if (cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL) != CUDA_SUCCESS) _exit(2);
        /* Its own window opened just now: nothing to drain yet. Had it kept the parent's,
         * this launch would drain it and charge the child the parent's 50 ms. */
        uint64_t busy = own_busy_ns(vgt_region(dir));
        _exit(busy == 0 ? 0 : busy == UINT64_MAX ? 3 : 4);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child status %d (4: charged the parent's window)",
          WEXITSTATUS(st));
}

static void usage_is_readable_per_process(void) {
    const char *dir = setup();
    vgt_ctx(0);
    CUdeviceptr p = 0;
    CHECK_RC(cuMemAlloc_v2(&p, 30 * VGT_MIB), CUDA_SUCCESS);
    CHECK_RC(cuMemAlloc_v2(&p, 300 * VGT_MIB), CUDA_ERROR_OUT_OF_MEMORY);
    CUfunction f = vgt_kernel(1000);
    for (int i = 0; i < 7; i++) CHECK_RC(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL), CUDA_SUCCESS);
    const vg_region *r = vgt_region(dir);
    int found = 0;
    for (int s = 0; s < VG_MAX_SLOTS; s++) {
        const vg_slot *sl = &r->slots[s];
        if (sl->state != VG_SLOT_LIVE || sl->pid != getpid()) continue;
        found++;
        CHECK(sl->cards[0].mem_used == 30 * VGT_MIB && sl->cards[0].mem_peak == 30 * VGT_MIB, "memory");
        CHECK(sl->cards[0].launches == 7 && sl->cards[0].refused == 1, "launches %llu refused %llu",
              (unsigned long long)sl->cards[0].launches, (unsigned long long)sl->cards[0].refused);
        CHECK(sl->start_time > 0, "start time");
    }
    CHECK(found == 1, "own slot found %d times", found);
}

VGT_MAIN(VGT_CASE(several_processes_share_one_cap), VGT_CASE(killed_process_memory_is_reclaimed),
         VGT_CASE(fork_child_starts_with_nothing), VGT_CASE(fork_child_opens_its_own_compute_window),
         VGT_CASE(usage_is_readable_per_process))
