/*
 * vg_hold.h - reserving memory quota around a driver call (vg_memory.c), for every path
 * that takes device memory: allocations, arrays, imports, contexts (vg_context.c).
 *
 *   vg_hold h;
 *   CUresult r = vg_hold_card(card, bytes, &h);      // over the cap: the answer to give
 *   if (r != CUDA_SUCCESS) return r;
 *   r = <driver call>;
 *   vg_hold_done(&h, r, &table, key);                // kept under key, or given back
 *
 * and for the free: vg_forget_begin(&table, key, &h); <driver call>; vg_forget_end(...).
 */
#ifndef VG_HOLD_H
#define VG_HOLD_H

#include <stdint.h>

#include "vg_cuda.h"
#include "vg_table.h"

typedef struct vg_hold {
    int card;
    uint64_t bytes;
    int held; /* quota reserved in the region */
} vg_hold;

/* Reserve bytes on card before the driver is called. CUDA_SUCCESS: call the driver
 * (h->held says whether quota was taken); otherwise the answer to give the caller. */
CUresult vg_hold_card(int card, uint64_t bytes, vg_hold *h);

/* As vg_hold_card, on the card of the current context (none: nothing reserved). */
CUresult vg_hold_current(uint64_t bytes, vg_hold *h);

/* After the driver answered r: keep the reservation under key in t, or give it back. */
void vg_hold_done(vg_hold *h, CUresult r, vg_table *t, uint64_t key);

/* Before a free: take key out of t. After it: give the quota back, or put key back. */
void vg_forget_begin(vg_table *t, uint64_t key, vg_hold *h);
void vg_forget_end(vg_table *t, uint64_t key, vg_hold *h, CUresult r);

#endif /* VG_HOLD_H */
