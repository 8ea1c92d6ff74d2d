/* vg_bucket.c - see vg_bucket.h. */
#include "vg_bucket.h"

int64_t vg_bucket_refill(vg_card_state *cs, uint64_t now_ns, int share, int64_t burst_ns) {
    uint64_t last = __atomic_load_n(&cs->last_refill_ns, __ATOMIC_ACQUIRE);
    int64_t add = 0;
    for (;;) {
        if (last >= now_ns) break; /* another caller already refilled up to now or later */
        if (__atomic_compare_exchange_n(&cs->last_refill_ns, &last, now_ns, 0, __ATOMIC_ACQ_REL,
                                        __ATOMIC_ACQUIRE)) {
            if (last != 0) add = (int64_t)((now_ns - last) * (uint64_t)share / 100);
            break;
        }
    }
    int64_t tok = __atomic_add_fetch(&cs->tokens_ns, add, __ATOMIC_ACQ_REL);
    while (tok > burst_ns) {
        if (__atomic_compare_exchange_n(&cs->tokens_ns, &tok, burst_ns, 0, __ATOMIC_ACQ_REL,
                                        __ATOMIC_ACQUIRE)) {
            tok = burst_ns;
            break;
        }
    }
    return tok;
}

void vg_bucket_charge(vg_card_state *cs, uint64_t ns) {
    __atomic_sub_fetch(&cs->tokens_ns, (int64_t)ns, __ATOMIC_ACQ_REL);
}

uint64_t vg_bucket_wait_ns(int64_t tokens, int share) {
    if (tokens >= 0 || share <= 0) return 0;
    return (uint64_t)(-tokens) * 100 / (uint64_t)share;
}
