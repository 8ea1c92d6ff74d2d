/*
 * fake_dev.h - the fake devices' state, shared by the fake libcuda (which runs kernels on
 * it) and the fake NVML (which reports utilisation from it). With FAKECUDA_SHARED=<file>
 * the array lives in that file, so every process naming it sees one timeline.
 */
#ifndef FAKE_DEV_H
#define FAKE_DEV_H

#include <pthread.h>
#include <stdint.h>

#define MAXDEV 8
#define LOG_CAP (1u << 14)

typedef struct { uint64_t start, end; int pid; } span; /* one kernel on the timeline */
typedef struct {
    pthread_mutex_t mu;
    uint64_t busy_until;
    uint64_t used, peak, total, launches;
    span log[LOG_CAP];
    uint64_t nlog;
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

#endif /* FAKE_DEV_H */
