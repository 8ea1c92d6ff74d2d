/*
 * fake_dev.h - the fake devices' state, shared by the fake libcuda (which runs kernels on
 * it) and the fake NVML (which reports utilisation from it). With FAKECUDA_SHARED=<file>
 * the array lives in that file, so every process naming it sees one timeline. With
 * FAKECUDA_DEVICE_DIR=<dir> and NVIDIA_VISIBLE_DEVICES=<uuid>,... each visible card is
 * the file <dir>/<uuid>, one per physical card, as /dev/nvidiaN is on a GPU node.
 */
#ifndef FAKE_DEV_H
#define FAKE_DEV_H

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAXDEV 8
#define LOG_CAP (1u << 14)
#define FPROC_MAX 64
#define FDEV_READY 0x5645444b41464154ull /* "TAFKADEV": the device is initialised */

typedef struct { uint64_t start, end; int pid; } span; /* one kernel on the timeline */
/* A process's device memory on one device, as NVML's running-processes query reports it:
 * the pid as the process sees itself and the inode of its pid namespace, so a reader in
 * another namespace (the node agent on the host) can translate it, and its start time
 * (clock ticks since boot, /proc/<pid>/stat field 22), so a killed process's entry is
 * never mistaken for a later process that got the same pid and namespace inode.
 * bytes == 0: free. */
typedef struct { int32_t pid; uint32_t pad; uint64_t pidns, start, bytes; } fproc;
/* The plain fields come first at fixed offsets (tessera.node.discovery_fake reads them
 * from the host: ready 0, total 8, used 16, procs 56); the mutex and the log follow. */
typedef struct {
    uint64_t ready;
    uint64_t total, used, peak, launches, busy_until, nlog;
    fproc procs[FPROC_MAX];
    pthread_mutex_t mu;
    span log[LOG_CAP];
} fdev;

/* Simulated busy time of d inside [t0, t1], counting only pid's kernels unless pid is 0.
 * Caller holds d->mu. */
static inline uint64_t fdev_busy(const fdev *d, uint64_t t0, uint64_t t1, int pid) {
    uint64_t sum = 0, first = d->nlog > LOG_CAP ? d->nlog - LOG_CAP : 0;
    for (uint64_t i = first; i < d->nlog; i++) {
        span s = d->log[i % LOG_CAP];
        if (pid != 0 && s.pid != pid) continue;
        uint64_t a = s.start > t0 ? s.start : t0, b = s.end < t1 ? s.end : t1;
        if (b > a) sum += b - a;
    }
    return sum;
}

/* The cards a process sees: NVIDIA_VISIBLE_DEVICES=<uuid>,... (what the container toolkit
 * honours) names them in order; returns how many (0: not set, so every card is seen, with
 * the UUIDs GPU-face0000-0000-0000-0000-0000000000NN, NN = ordinal in hex). */
static inline int fdev_parse_uuid(const char *s, unsigned char out[16]) {
    if (strncmp(s, "GPU-", 4) != 0) return -1;
    s += 4;
    int n = 0;
    for (; *s && *s != ',' && n < 32; s++) {
        if (*s == '-') continue;
        int v = *s >= '0' && *s <= '9' ? *s - '0' : *s >= 'a' && *s <= 'f' ? *s - 'a' + 10
              : *s >= 'A' && *s <= 'F' ? *s - 'A' + 10 : -1;
        if (v < 0) return -1;
        if (n % 2 == 0) out[n / 2] = (unsigned char)(v << 4);
        else out[n / 2] |= (unsigned char)v;
        n++;
    }
    return n == 32 && (*s == ',' || *s == 0) ? 0 : -1;
}

static inline int fdev_visible_cards(unsigned char uuids[MAXDEV][16], char text[MAXDEV][48]) {
    for (int i = 0; i < MAXDEV; i++) {
        memset(uuids[i], 0, 16);
        uuids[i][0] = 0xfa;
        uuids[i][1] = 0xce;
        uuids[i][15] = (unsigned char)i;
        snprintf(text[i], 48, "GPU-face0000-0000-0000-0000-0000000000%02x", i);
    }
    const char *e = getenv("NVIDIA_VISIBLE_DEVICES");
    int n = 0;
    while (e && *e && n < MAXDEV && fdev_parse_uuid(e, uuids[n]) == 0) {
        const char *comma = strchr(e, ',');
        size_t len = comma ? (size_t)(comma - e) : strlen(e);
        snprintf(text[n], 48, "%.*s", (int)len, e);
        n++;
        e = comma ? comma + 1 : NULL;
    }
    return n;
}

#endif /* FAKE_DEV_H */
