/* host_table.c - the allocation map, on the host. */
#include <pthread.h>

#include "vg_config.h"
#include "vg_table.h"
#include "vgt.h"

static void put_get_take(void) {
    vg_table t = VG_TABLE_INIT;
    uint64_t b = 0;
    int c = -1;
    CHECK(!vg_table_get(&t, 42, &b, &c), "empty table has no key");
    CHECK(!vg_table_take(&t, 42, &b, &c), "empty table take");
    CHECK_RC(vg_table_put(&t, 0, 1, 0), VG_ERR);
    CHECK_RC(vg_table_put(&t, 42, 100, 3), VG_OK);
    CHECK(vg_table_get(&t, 42, &b, &c) && b == 100 && c == 3, "get");
    CHECK_RC(vg_table_put(&t, 42, 200, 1), VG_OK); /* replaces */
    CHECK(vg_table_live(&t) == 1, "live %zu", vg_table_live(&t));
    CHECK(vg_table_take(&t, 42, &b, &c) && b == 200 && c == 1, "take");
    CHECK(!vg_table_take(&t, 42, &b, &c), "taken twice");
    vg_table_reset(&t);
}

static void many_keys_grow_and_tombstones(void) {
    vg_table t = VG_TABLE_INIT;
    uint64_t b = 0;
    int c = 0;
    for (int round = 0; round < 3; round++) {
        for (uint64_t k = 1; k <= 20000; k++) CHECK_RC(vg_table_put(&t, k * 4096, k, (int)(k % 16)), VG_OK);
        CHECK(vg_table_live(&t) == 20000, "live %zu", vg_table_live(&t));
        for (uint64_t k = 1; k <= 20000; k += 2) CHECK(vg_table_take(&t, k * 4096, &b, &c) && b == k, "take %llu", (unsigned long long)k);
        for (uint64_t k = 2; k <= 20000; k += 2) CHECK(vg_table_get(&t, k * 4096, &b, &c) && b == k && c == (int)(k % 16), "get %llu", (unsigned long long)k);
        for (uint64_t k = 2; k <= 20000; k += 2) CHECK(vg_table_take(&t, k * 4096, &b, &c), "take even");
        CHECK(vg_table_live(&t) == 0, "empty again");
    }
    vg_table_reset(&t);
}

static vg_table shared = VG_TABLE_INIT;
static void *worker(void *arg) {
    uint64_t base = (uint64_t)(uintptr_t)arg << 32, b = 0;
    int c = 0;
    for (uint64_t k = 1; k <= 5000; k++) {
        CHECK_RC(vg_table_put(&shared, base + k, k, 0), VG_OK);
        if (k % 3 == 0) CHECK(vg_table_take(&shared, base + k, &b, &c) && b == k, "take");
    }
    return NULL;
}

static void concurrent_threads(void) {
    pthread_t th[8];
    for (uintptr_t i = 0; i < 8; i++) pthread_create(&th[i], NULL, worker, (void *)(i + 1));
    for (int i = 0; i < 8; i++) pthread_join(th[i], NULL);
    CHECK(vg_table_live(&shared) == 8 * (5000 - 1666), "live %zu", vg_table_live(&shared));
    vg_table_reset(&shared);
}

VGT_MAIN(VGT_CASE(put_get_take), VGT_CASE(many_keys_grow_and_tombstones), VGT_CASE(concurrent_threads))
