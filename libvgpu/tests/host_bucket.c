/* host_bucket.c - the compute bucket's arithmetic, with explicit time. */
#include "vg_bucket.h"
#include "vgt.h"

#define MS 1000000ull

static void first_refill_adds_nothing(void) {
    vg_card_state cs = {0};
    CHECK(vg_bucket_refill(&cs, 1000 * MS, 30, 15 * (int64_t)MS) == 0, "first refill");
    CHECK(cs.last_refill_ns == 1000 * MS, "stamp");
}

static void refills_at_share_and_clamps_to_burst(void) {
    vg_card_state cs = {0};
    vg_bucket_refill(&cs, 1000 * MS, 30, 15 * (int64_t)MS);
    CHECK(vg_bucket_refill(&cs, 1010 * MS, 30, 15 * (int64_t)MS) == 3 * (int64_t)MS, "10 ms at 30%%");
    CHECK(vg_bucket_refill(&cs, 2000 * MS, 30, 15 * (int64_t)MS) == 15 * (int64_t)MS, "clamped");
    CHECK(vg_bucket_refill(&cs, 1990 * MS, 30, 15 * (int64_t)MS) == 15 * (int64_t)MS, "time going back adds nothing");
}

static void charge_and_wait(void) {
    vg_card_state cs = {0};
    vg_bucket_refill(&cs, 1000 * MS, 25, 100 * (int64_t)MS);
    vg_bucket_charge(&cs, 10 * MS);
    int64_t tok = vg_bucket_refill(&cs, 1000 * MS, 25, 100 * (int64_t)MS);
    CHECK(tok == -10 * (int64_t)MS, "tokens %lld", (long long)tok);
    CHECK(vg_bucket_wait_ns(tok, 25) == 40 * MS, "wait %llu", (unsigned long long)vg_bucket_wait_ns(tok, 25));
    CHECK(vg_bucket_refill(&cs, 1040 * MS, 25, 100 * (int64_t)MS) == 0, "paid back after the wait");
    CHECK(vg_bucket_wait_ns(0, 25) == 0 && vg_bucket_wait_ns(5, 25) == 0, "no wait with tokens");
    CHECK(vg_bucket_wait_ns(-5, 0) == 0, "share 0 never divides by zero");
}

static void long_run_share_is_exact(void) {
    /* A GPU-bound loop: 10 ms windows of work, then the wait the bucket asks for. */
    vg_card_state cs = {0};
    uint64_t t = 1000 * MS, busy = 0, start = t;
    for (int i = 0; i < 1000; i++) {
        int64_t tok = vg_bucket_refill(&cs, t, 37, 50 * (int64_t)MS * 37 / 100);
        t += vg_bucket_wait_ns(tok, 37);
        vg_bucket_refill(&cs, t, 37, 50 * (int64_t)MS * 37 / 100);
        t += 10 * MS;
        busy += 10 * MS;
        vg_bucket_charge(&cs, 10 * MS);
    }
    double share = 100.0 * (double)busy / (double)(t - start);
    CHECK(share > 36.9 && share < 37.1, "share %.3f", share);
}

VGT_MAIN(VGT_CASE(first_refill_adds_nothing), VGT_CASE(refills_at_share_and_clamps_to_burst),
         VGT_CASE(charge_and_wait), VGT_CASE(long_run_share_is_exact))
