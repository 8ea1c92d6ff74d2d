/*
 * vg_bucket.h - the container-wide compute bucket of one card, in ns of GPU time.
 *
 * It fills at share% of wall time (up to a burst) and is charged with the GPU time the
 * container's work measurably took (vg_compute.c). A launch waits while the bucket is
 * below zero. Pure functions over the shared card state; host-tested (test_bucket.c).
 */
#ifndef VG_BUCKET_H
#define VG_BUCKET_H

#include <stdint.h>

#include "vg_protocol.h"

/* Refill for the time since the last refill (none on the first call), clamp to burst_ns,
 * and return the tokens now. Safe against concurrent callers in any process. */
int64_t vg_bucket_refill(vg_card_state *cs, uint64_t now_ns, int share, int64_t burst_ns);

/* Take ns of GPU time out of the bucket. */
void vg_bucket_charge(vg_card_state *cs, uint64_t ns);

/* How long to wait before launching with this many tokens: 0 when tokens >= 0, else the
 * time the bucket needs at share% to get back to zero. share must be 1..100. */
uint64_t vg_bucket_wait_ns(int64_t tokens, int share);

#endif /* VG_BUCKET_H */
