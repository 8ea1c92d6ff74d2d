/* host_region.c - the shared usage region across real processes, without any driver. */
#include <signal.h>

#include "vg_config.h"
#include "vg_region.h"
#include "vgt.h"

static vg_region *open_fresh(char *path, size_t n) {
    snprintf(path, n, "%s/region", vgt_tmpdir());
    vg_region *r = NULL;
    char err[256] = "";
    CHECK_RC(vg_region_open(path, &r, err, sizeof err), VG_OK);
    return r;
}

static void layout_and_magic(void) {
    char path[512];
    vg_region *r = open_fresh(path, sizeof path);
    CHECK(memcmp(r->hdr.magic, VG_REGION_MAGIC, 8) == 0, "magic");
    CHECK(r->hdr.version == 1 && r->hdr.header_size == 4096 && r->hdr.max_slots == 64, "header");
    struct stat st;
    CHECK(stat(path, &st) == 0 && st.st_size == 69632, "size %lld", (long long)st.st_size);
    vg_region *again = NULL;
    char err[256];
    CHECK_RC(vg_region_open(path, &again, err, sizeof err), VG_OK); /* reopen keeps it */
    vgt_write(path, "not a region");
    CHECK_RC(vg_region_open(path, &again, err, sizeof err), VG_ERR);
    CHECK(strstr(err, "not a version 1 usage region"), "%s", err);
    CHECK_RC(vg_region_open("/nonexistent/dir/region", &again, err, sizeof err), VG_ERR);
    CHECK(strstr(err, "open(/nonexistent/dir/region)"), "%s", err);
}

static void cap_is_exact(void) {
    char path[512];
    vg_region *r = open_fresh(path, sizeof path);
    int s = vg_region_claim(r, getpid());
    CHECK(s >= 0, "claim");
    uint64_t cap = 100 * VGT_MIB;
    CHECK_RC(vg_region_reserve(r, s, 3, cap - VGT_MIB, cap), VG_OK);
    CHECK_RC(vg_region_reserve(r, s, 3, VGT_MIB + 1, cap), VG_ERR);
    CHECK_RC(vg_region_reserve(r, s, 3, VGT_MIB, cap), VG_OK);
    CHECK_RC(vg_region_reserve(r, s, 3, 1, cap), VG_ERR);
    CHECK_RC(vg_region_reserve(r, s, 3, UINT64_MAX, cap), VG_ERR);
    CHECK(r->slots[s].cards[3].refused == 3, "refused %llu", (unsigned long long)r->slots[s].cards[3].refused);
    CHECK(vg_region_card_used(r, 3) == cap, "used");
    vg_region_unreserve(r, s, 3, cap);
    CHECK(vg_region_card_used(r, 3) == 0 && r->slots[s].cards[3].mem_peak == cap, "given back, peak kept");
    CHECK(vg_region_card_used(r, 2) == 0, "other card untouched");
}

static void processes_share_one_cap_and_the_dead_are_reaped(void) {
    char path[512];
    vg_region *r = open_fresh(path, sizeof path);
    uint64_t cap = 64 * VGT_MIB;
    int fds[2];
    CHECK(pipe(fds) == 0, "pipe");
    pid_t kids[4];
    for (int i = 0; i < 4; i++) {
        kids[i] = fork();
        if (kids[i] == 0) {
            vg_region *mine = NULL;
            char err[256];
            if (vg_region_open(path, &mine, err, sizeof err) != VG_OK) _exit(3);
            int s = vg_region_claim(mine, getpid());
            char ok = vg_region_reserve(mine, s, 0, 16 * VGT_MIB, cap) == VG_OK ? 'y' : 'n';
            if (write(fds[1], &ok, 1) != 1) _exit(4);
            pause(); /* hold the memory until killed */
            _exit(0);
        }
    }
    for (int i = 0; i < 4; i++) {
        char ok = 0;
        CHECK(read(fds[0], &ok, 1) == 1 && ok == 'y', "child %d could not reserve 16 MiB", i);
    }
    int s = vg_region_claim(r, getpid());
    CHECK(vg_region_card_used(r, 0) == cap, "4 x 16 MiB");
    CHECK_RC(vg_region_reserve(r, s, 0, 1, cap), VG_ERR); /* the cap is shared */
    kill(kids[0], SIGKILL);
    kill(kids[1], SIGKILL);
    waitpid(kids[0], NULL, 0); /* one reaped by its parent ... */
    usleep(50000);             /* ... the other left a zombie: both count as dead */
    CHECK_RC(vg_region_reserve(r, s, 0, 32 * VGT_MIB, cap), VG_OK);
    CHECK(r->hdr.reclaimed_procs == 2, "reclaimed %llu", (unsigned long long)r->hdr.reclaimed_procs);
    CHECK(r->hdr.cards[0].reclaimed_bytes == 32 * VGT_MIB, "reclaimed bytes");
    kill(kids[2], SIGKILL);
    kill(kids[3], SIGKILL);
    for (int i = 1; i < 4; i++) waitpid(kids[i], NULL, 0);
}

static void release_retires_counters(void) {
    char path[512];
    vg_region *r = open_fresh(path, sizeof path);
    int s = vg_region_claim(r, getpid());
    r->slots[s].cards[1].launches = 7;
    r->slots[s].cards[1].throttled_ns = 5;
    CHECK_RC(vg_region_reserve(r, s, 1, 10, 100), VG_OK);
    vg_region_release(r, s);
    CHECK(r->slots[s].state == VG_SLOT_FREE && r->slots[s].pid == 0, "slot freed");
    CHECK(r->hdr.cards[1].retired_launches == 7 && r->hdr.cards[1].retired_throttled_ns == 5, "retired");
    CHECK(r->hdr.cards[1].reclaimed_bytes == 0 && r->hdr.reclaimed_procs == 0, "a normal exit is not a reclaim");
}

static void slots_run_out_cleanly(void) {
    char path[512];
    vg_region *r = open_fresh(path, sizeof path);
    for (int i = 0; i < VG_MAX_SLOTS; i++) CHECK(vg_region_claim(r, getpid()) == i, "slot %d", i);
    CHECK(vg_region_claim(r, getpid()) == -1, "65th claim");
}

static void liveness(void) {
    CHECK(vg_proc_alive(getpid(), vg_proc_start_time(getpid())), "self alive");
    CHECK(!vg_proc_alive(getpid(), vg_proc_start_time(getpid()) + 1), "reused pid is not us");
    CHECK(vg_proc_start_time(getpid()) > 0, "start time");
    CHECK(!vg_proc_alive(0x3ffffff, 0), "no such pid");
}

VGT_MAIN(VGT_CASE(layout_and_magic), VGT_CASE(cap_is_exact),
         VGT_CASE(processes_share_one_cap_and_the_dead_are_reaped), VGT_CASE(release_retires_counters),
         VGT_CASE(slots_run_out_cleanly), VGT_CASE(liveness))
