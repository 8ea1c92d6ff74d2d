/* vg_table.c - see vg_table.h. */
#include "vg_table.h"

#include <stdlib.h>

#include "vg_config.h"

#define VG_TOMB UINT64_MAX

static size_t vg_hash(uint64_t k, size_t mask) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    return (size_t)k & mask;
}

/* Index of key, or of the slot where it would go (first tombstone or empty). */
static size_t vg_find(const vg_table *t, uint64_t key, int *found) {
    size_t mask = t->cap - 1, i = vg_hash(key, mask), tomb = SIZE_MAX;
    for (;;) {
        uint64_t k = t->slots[i].key;
        if (k == key) {
            *found = 1;
            return i;
        }
        if (k == 0) {
            *found = 0;
            return tomb != SIZE_MAX ? tomb : i;
        }
        if (k == VG_TOMB && tomb == SIZE_MAX) tomb = i;
        i = (i + 1) & mask;
    }
}

static int vg_grow(vg_table *t) {
    size_t ncap = t->cap ? t->cap * 2 : 64;
    if (t->live * 4 < t->cap) ncap = t->cap; /* mostly tombstones: rehash in place size */
    vg_entry *ns = calloc(ncap, sizeof *ns);
    if (ns == NULL) return VG_ERR;
    vg_entry *old = t->slots;
    size_t ocap = t->cap;
    t->slots = ns;
    t->cap = ncap;
    t->used = t->live;
    for (size_t i = 0; i < ocap; i++) {
        if (old[i].key != 0 && old[i].key != VG_TOMB) {
            int found = 0;
            ns[vg_find(t, old[i].key, &found)] = old[i];
        }
    }
    free(old);
    return VG_OK;
}

int vg_table_put(vg_table *t, uint64_t key, uint64_t bytes, int card) {
    if (key == 0 || key == VG_TOMB) return VG_ERR;
    pthread_mutex_lock(&t->mu);
    if ((t->used + 1) * 10 >= t->cap * 7 && vg_grow(t) != VG_OK) {
        pthread_mutex_unlock(&t->mu);
        return VG_ERR;
    }
    int found = 0;
    size_t i = vg_find(t, key, &found);
    if (!found) {
        if (t->slots[i].key == 0) t->used++;
        t->live++;
    }
    t->slots[i] = (vg_entry){key, bytes, card};
    pthread_mutex_unlock(&t->mu);
    return VG_OK;
}

static int vg_lookup(vg_table *t, uint64_t key, uint64_t *bytes, int *card, int take) {
    int found = 0;
    pthread_mutex_lock(&t->mu);
    if (t->cap != 0 && key != 0 && key != VG_TOMB) {
        size_t i = vg_find(t, key, &found);
        if (found) {
            *bytes = t->slots[i].bytes;
            *card = t->slots[i].card;
            if (take) {
                t->slots[i].key = VG_TOMB;
                t->live--;
            }
        }
    }
    pthread_mutex_unlock(&t->mu);
    return found;
}

int vg_table_take(vg_table *t, uint64_t key, uint64_t *bytes, int *card) {
    return vg_lookup(t, key, bytes, card, 1);
}

int vg_table_get(vg_table *t, uint64_t key, uint64_t *bytes, int *card) {
    return vg_lookup(t, key, bytes, card, 0);
}

size_t vg_table_live(vg_table *t) {
    pthread_mutex_lock(&t->mu);
    size_t n = t->live;
    pthread_mutex_unlock(&t->mu);
    return n;
}

void vg_table_reset(vg_table *t) {
    pthread_mutex_init(&t->mu, NULL);
    free(t->slots);
    t->slots = NULL;
    t->cap = t->used = t->live = 0;
}
