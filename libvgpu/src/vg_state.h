/*
 * vg_state.h - libvgpu's process state: its mode, the limits, the region and its slot,
 * and the map from driver devices to the container's cards.
 *
 * Everything is set up lazily on the first intercepted call (processes in the container
 * that never touch CUDA pay nothing), once, under pthread_once.
 */
#ifndef VG_STATE_H
#define VG_STATE_H

#include <stdint.h>
#include <sys/types.h>

#include "vg_config.h"
#include "vg_cuda.h"
#include "vg_region.h"
#include "vg_table.h"

typedef enum {
    VG_MODE_INERT = 0,  /* no limits file: pass everything through */
    VG_MODE_ACTIVE = 1, /* enforcing */
    VG_MODE_BROKEN = 2, /* limits present but unusable: fail closed */
} vg_mode;

#define VG_MAX_DEVS 64

typedef struct vg_state {
    vg_mode mode;
    vg_limits limits;
    vg_region *region;
    int slot;                 /* -1 until this process claims one */
    pid_t pid;
    int dev_card[VG_MAX_DEVS]; /* CUdevice -> card index; -2 not looked up, -1 none */
} vg_state;

extern vg_state vg_g;
/* Allocations by pointer, VMM handles, opaque driver objects (arrays, mipmapped arrays,
 * external memory), contexts (created and green), stream-ordered
 * allocations from a recorded pool (card field: the pool record, vg_memory.c), executable
 * graphs' memory (vg_graph.c). */
extern vg_table vg_ptrs, vg_handles, vg_arrays, vg_ctxs, vg_pool_ptrs, vg_execs;

/* Initialise once; returns the mode. */
vg_mode vg_init(void);

/* In a hook: answer CUDA_ERROR_NOT_INITIALIZED when the limits are unusable (fail closed). */
#define VG_GUARD()                                                                           \
    do {                                                                                     \
        if (vg_init() == VG_MODE_BROKEN) return CUDA_ERROR_NOT_INITIALIZED;                  \
    } while (0)

/* The argument list of an X-macro table entry, without its parentheses. */
#define VG_UNPAREN(...) __VA_ARGS__

/* This process's slot, claiming one on first use; -1 when every slot is taken. */
int vg_my_slot(void);

/* The container's card for a driver device: index into vg_g.limits.cards, or -1 when the
 * device is not one of the container's cards (its cap is then 0). */
int vg_card_of_dev(CUdevice dev);

/* The card of the calling thread's current context: 0 and *card, or -1 when there is no
 * current context (the caller then lets the driver answer). */
int vg_current_card(int *card);

/* Card for a UUID string as NVML prints it, or -1. */
int vg_card_of_uuid(const char *uuid);

/* CLOCK_MONOTONIC / CLOCK_REALTIME in ns. */
uint64_t vg_now_ns(void);
uint64_t vg_unix_ms(void);

/* Whether stream s is capturing into a graph (vg_compute.c): its work is recorded, not run. */
int vg_capturing(CUstream s);

/* One line to stderr, prefixed "[tessera libvgpu] ". */
void vg_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif /* VG_STATE_H */
