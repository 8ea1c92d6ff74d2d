/*
 * vg_table.h - a thread-safe map from a 64-bit key (device pointer, VMM handle, array,
 * pool) to the bytes and card it was accounted to. Process-local; open addressing.
 */
#ifndef VG_TABLE_H
#define VG_TABLE_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

typedef struct vg_entry {
    uint64_t key;   /* 0 empty, VG_TOMB deleted */
    uint64_t bytes;
    int card;
} vg_entry;

typedef struct vg_table {
    pthread_mutex_t mu;
    vg_entry *slots;
    size_t cap;   /* power of two, or 0 before the first put */
    size_t used;  /* live + tombstones */
    size_t live;
} vg_table;

#define VG_TABLE_INIT {PTHREAD_MUTEX_INITIALIZER, NULL, 0, 0, 0}

/* Record key -> (bytes, card), replacing an existing entry. VG_OK, or VG_ERR when out of
 * host memory (nothing is changed). Key 0 is refused with VG_ERR. */
int vg_table_put(vg_table *t, uint64_t key, uint64_t bytes, int card);

/* Remove key. 1 and fills *bytes / *card when it was there; 0 otherwise. */
int vg_table_take(vg_table *t, uint64_t key, uint64_t *bytes, int *card);

/* Look key up without removing it. */
int vg_table_get(vg_table *t, uint64_t key, uint64_t *bytes, int *card);

size_t vg_table_live(vg_table *t);

/* Forget everything (after fork: the child owns none of the parent's allocations). Not
 * thread-safe by design: called where only one thread exists. */
void vg_table_reset(vg_table *t);

#endif /* VG_TABLE_H */
