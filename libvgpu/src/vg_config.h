/*
 * vg_config.h - parsing of the limits file and the allowance file (docs/protocol.md).
 *
 * Pure functions over text: no I/O except vg_read_file, no globals; unit-tested on the host
 * (tests/test_config.c). Every parser keeps "unset" apart from "invalid" and "out of range".
 */
#ifndef VG_CONFIG_H
#define VG_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "vg_protocol.h"

#define VG_OK 0
#define VG_ERR -1

typedef enum { VG_POLICY_FIXED = 0, VG_POLICY_BURST = 1, VG_POLICY_BEST_EFFORT = 2 } vg_policy;

typedef struct vg_card_limit {
    char uuid[48];
    uint64_t memory_bytes;
    int cores_percent;
    vg_policy policy;
} vg_card_limit;

typedef struct vg_limits {
    int ncards;
    vg_card_limit cards[VG_MAX_CARDS];
    char region[256];
    char allowance[256];
    uint64_t context_bytes; /* charged per CUDA context (context_mib=, default 0) */
} vg_limits;

/* Result of parsing one integer: absent and malformed are different answers. */
typedef enum { VG_NUM_OK = 0, VG_NUM_UNSET, VG_NUM_INVALID, VG_NUM_RANGE } vg_num;

/* Decimal digits only (1..18 of them), value in lo..hi. *out is set only on VG_NUM_OK. */
vg_num vg_parse_u64(const char *s, size_t n, uint64_t lo, uint64_t hi, uint64_t *out);

/* "GPU-" then 8-4-4-4-12 hex digits. */
int vg_uuid_valid(const char *s, size_t n);

/* Parse a limits file. VG_OK fills *out; VG_ERR fills err ("line N: key: rule") and
 * leaves *out unspecified. */
int vg_limits_parse(const char *text, size_t len, vg_limits *out, char *err, size_t errlen);

/* Parse an allowance file. VG_OK sets pct[i] (-1 where card i is not given) and
 * *written_ms; VG_ERR fills err. */
int vg_allowance_parse(const char *text, size_t len, int pct[VG_MAX_CARDS], uint64_t *written_ms,
                       char *err, size_t errlen);

/* Read at most cap-1 bytes of a file into buf (NUL-terminated). Returns the length, or -1
 * with errno set (ENOENT: the file does not exist; EFBIG: longer than cap-1). */
long vg_read_file(const char *path, char *buf, size_t cap);

#endif /* VG_CONFIG_H */
