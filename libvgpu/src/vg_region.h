/*
 * vg_region.h - the container's shared usage region (layout: vg_protocol.h).
 *
 * Memory accounting is exact across the processes of a container: a reservation checks
 * the sum over live slots against the card's cap and adds to the caller's slot under
 * one process-shared robust mutex. Slots of processes that died are reclaimed.
 */
#ifndef VG_REGION_H
#define VG_REGION_H

#include <stdint.h>
#include <sys/types.h>

#include "vg_protocol.h"

/* Map (creating and initialising if needed) the region file at path. VG_OK and *out, or
 * VG_ERR with a message naming the call and strerror in err. */
int vg_region_open(const char *path, vg_region **out, char *err, size_t errlen);

/* Claim a slot for process pid. Returns the slot index, or -1 when all are live. Reclaims
 * slots of dead processes first. */
int vg_region_claim(vg_region *r, pid_t pid);

/* Retire slot s at a normal exit: counters go to the card totals, the slot is freed. */
void vg_region_release(vg_region *r, int s);

/* Reserve bytes on card for slot s if the container total stays <= cap. VG_OK, or VG_ERR
 * (counted as a refused allocation) when it would not. */
int vg_region_reserve(vg_region *r, int s, int card, uint64_t bytes, uint64_t cap);

/* Give back bytes that slot s reserved on card. */
void vg_region_unreserve(vg_region *r, int s, int card, uint64_t bytes);

/* Container-wide device memory in use on card (sum over live slots). */
uint64_t vg_region_card_used(vg_region *r, int card);

/* Reclaim slots of processes that are gone. Returns how many were reclaimed. */
int vg_region_reap(vg_region *r);

/* 1 if the process with this pid and start time still runs (not a zombie). */
int vg_proc_alive(pid_t pid, uint64_t start_time);

/* Start time (clock ticks after boot) of pid from /proc, or 0 if unknown. */
uint64_t vg_proc_start_time(pid_t pid);

#endif /* VG_REGION_H */
