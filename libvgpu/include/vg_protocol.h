/*
 * vg_protocol.h - the byte layouts libvgpu shares with the node agent (docs/protocol.md,
 * "## libvgpu"): the usage region and the fixed location of the limits file.
 * Python readers: src/tessera/node/usage.py. Offsets are checked at compile time below.
 */
#ifndef VG_PROTOCOL_H
#define VG_PROTOCOL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#define VG_MAX_CARDS 16
#define VG_MAX_SLOTS 64
#define VG_REGION_VERSION 1
#define VG_REGION_MAGIC "TSVGPU\0\1"
#define VG_HEADER_SIZE 4096
#define VG_SLOT_SIZE 1024

/* The one place the production library reads its limits from (mounted read-only). */
#ifndef VG_LIMITS_PATH
#define VG_LIMITS_PATH "/etc/tessera/limits"
#endif

enum { VG_SLOT_FREE = 0, VG_SLOT_LIVE = 1, VG_SLOT_RECLAIMING = 2 };

/* One process's usage of one card. */
typedef struct vg_card_rec {
    uint64_t mem_used;     /* bytes */
    uint64_t launches;
    uint64_t throttled_ns;
    uint64_t refused;      /* allocations refused by the cap */
    uint64_t busy_ns;      /* GPU time charged to the compute bucket */
    uint64_t mem_peak;     /* bytes */
} vg_card_rec;

typedef struct vg_slot {
    uint32_t state;
    int32_t pid;
    uint64_t start_time;
    uint64_t reserved[2];
    vg_card_rec cards[VG_MAX_CARDS];
    uint8_t pad[VG_SLOT_SIZE - 32 - VG_MAX_CARDS * sizeof(vg_card_rec)];
} vg_slot;

/* Container-wide state of one card. */
typedef struct vg_card_state {
    int64_t tokens_ns;
    uint64_t last_refill_ns;
    uint64_t reclaimed_bytes;
    uint64_t retired_launches;
    uint64_t retired_throttled_ns;
    uint64_t retired_refused;
    uint64_t retired_busy_ns;
    uint64_t charged_until_ns; /* end of the last window charged (union of windows) */
} vg_card_state;

typedef struct vg_header {
    char magic[8];
    uint32_t version;
    uint32_t header_size;
    uint32_t max_cards;
    uint32_t max_slots;
    uint32_t slot_size;
    uint32_t card_rec_size;
    uint64_t reclaimed_procs;
    uint8_t pad0[24];
    union {
        pthread_mutex_t m;
        uint8_t bytes[64];
    } lock;
    vg_card_state cards[VG_MAX_CARDS];
    uint8_t pad1[VG_HEADER_SIZE - 128 - VG_MAX_CARDS * sizeof(vg_card_state)];
} vg_header;

typedef struct vg_region {
    vg_header hdr;
    vg_slot slots[VG_MAX_SLOTS];
} vg_region;

_Static_assert(sizeof(vg_card_rec) == 48, "card record is 48 bytes");
_Static_assert(sizeof(vg_slot) == VG_SLOT_SIZE, "slot size");
_Static_assert(sizeof(vg_card_state) == 64, "card state is 64 bytes");
_Static_assert(offsetof(vg_header, reclaimed_procs) == 32, "reclaimed_procs offset");
_Static_assert(offsetof(vg_header, lock) == 64, "lock offset");
_Static_assert(sizeof(pthread_mutex_t) <= 64, "mutex fits");
_Static_assert(offsetof(vg_header, cards) == 128, "card state offset");
_Static_assert(sizeof(vg_header) == VG_HEADER_SIZE, "header size");
_Static_assert(offsetof(vg_slot, cards) == 32, "slot card records offset");
_Static_assert(sizeof(vg_region) == 69632, "region size");

#endif /* VG_PROTOCOL_H */
