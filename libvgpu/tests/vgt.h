/*
 * vgt.h - the tiny harness of libvgpu's C tests.
 *
 * A test program lists its cases with VGT_CASE(name) in a VGT_MAIN(...) table. Run with a
 * case name it runs that case (tests/integration/test_libvgpu.py runs each case as its own
 * pytest case); with --list it prints the names; with no argument it runs every case,
 * each in a child process, and prints one line per case. A failed CHECK prints file, line,
 * the condition and a message, and exits 1.
 */
#ifndef VGT_H
#define VGT_H

#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define CHECK(cond, ...)                                                                     \
    do {                                                                                     \
        if (!(cond)) {                                                                       \
            fprintf(stderr, "%s:%d: CHECK(%s) failed: ", __FILE__, __LINE__, #cond);          \
            fprintf(stderr, __VA_ARGS__);                                                    \
            fputc('\n', stderr);                                                             \
            exit(1);                                                                         \
        }                                                                                    \
    } while (0)

/* CHECK that a CUresult-like call returned want. */
#define CHECK_RC(call, want)                                                                 \
    do {                                                                                     \
        int rc_ = (int)(call);                                                               \
        CHECK(rc_ == (int)(want), "%s returned %d, want %d", #call, rc_, (int)(want));       \
    } while (0)

typedef struct vgt_case {
    const char *name;
    void (*fn)(void);
} vgt_case;

#define VGT_CASE(fn) {#fn, fn}
#define VGT_MAIN(...)                                                                        \
    static const vgt_case vgt_cases[] = {__VA_ARGS__, {NULL, NULL}};                         \
    int main(int argc, char **argv) { return vgt_main(vgt_cases, argc, argv); }

static inline int vgt_main(const vgt_case *cases, int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "--list") == 0) {
        for (const vgt_case *c = cases; c->name; c++) puts(c->name);
        return 0;
    }
    if (argc > 1) {
        for (const vgt_case *c = cases; c->name; c++) {
            if (strcmp(c->name, argv[1]) == 0) {
                c->fn();
                return 0;
            }
        }
        fprintf(stderr, "no case %s\n", argv[1]);
        return 2;
    }
    int failed = 0;
    for (const vgt_case *c = cases; c->name; c++) {
        fflush(NULL);
        pid_t pid = fork();
        if (pid == 0) {
            c->fn();
            exit(0);
        }
        int st = 0;
        waitpid(pid, &st, 0);
        int ok = WIFEXITED(st) && WEXITSTATUS(st) == 0;
        printf("%s %s\n", ok ? "ok  " : "FAIL", c->name);
        failed += !ok;
    }
    return failed ? 1 : 0;
}

static inline uint64_t vgt_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline uint64_t vgt_unix_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000ull + (uint64_t)ts.tv_nsec / 1000000ull;
}

/* A fresh private directory for one case's files. */
static inline const char *vgt_tmpdir(void) {
    static char dir[256];
    const char *base = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/vgt.XXXXXX", base && base[0] ? base : "/tmp");
    CHECK(mkdtemp(dir) != NULL, "mkdtemp: %s", strerror(errno));
    return dir;
}

static inline void vgt_write(const char *path, const char *text) {
    char tmp[600];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    CHECK(f != NULL, "fopen(%s): %s", tmp, strerror(errno));
    fputs(text, f);
    fclose(f);
    CHECK(rename(tmp, path) == 0, "rename: %s", strerror(errno));
}

#define VGT_MIB (1ull << 20)

/* UUID of fake device i (see fake/fakecuda.h). */
static inline const char *vgt_uuid(int i) {
    static char buf[8][48];
    snprintf(buf[i & 7], sizeof buf[0], "GPU-face0000-0000-0000-0000-0000000000%02x", i);
    return buf[i & 7];
}

/* One card line set for vgt_limits. */
typedef struct vgt_card {
    int dev; /* fake device whose UUID the card carries */
    unsigned long long mib;
    int cores;
    const char *policy;
} vgt_card;

/* Write a limits file for these cards (and the lines in extra, e.g. "context_mib=16\n")
 * in a fresh directory and point the test build of libvgpu at it (TESSERA_TEST_LIMITS).
 * Returns the directory (region, allowance inside). */
static inline const char *vgt_limits_with(int n, const vgt_card *cards, const char *extra) {
    const char *dir = vgt_tmpdir();
    char text[4096], path[512];
    int off = snprintf(text, sizeof text, "version=1\nregion=%s/region\nallowance=%s/allowance\ncards=%d\n%s",
                       dir, dir, n, extra);
    for (int i = 0; i < n; i++)
        off += snprintf(text + off, sizeof text - (size_t)off,
                        "card.%d.uuid=%s\ncard.%d.memory_mib=%llu\ncard.%d.cores_percent=%d\ncard.%d.policy=%s\n",
                        i, vgt_uuid(cards[i].dev), i, cards[i].mib, i, cards[i].cores, i, cards[i].policy);
    snprintf(path, sizeof path, "%s/limits", dir);
    vgt_write(path, text);
    setenv("TESSERA_TEST_LIMITS", path, 1);
    return dir;
}

static inline const char *vgt_limits(int n, const vgt_card *cards) { return vgt_limits_with(n, cards, ""); }

/* Write the allowance file of the container in dir. */
static inline void vgt_allowance(const char *dir, uint64_t written_ms, int n, const int *pct) {
    char text[1024], path[512];
    int off = snprintf(text, sizeof text, "version=1\nwritten_unix_ms=%llu\n", (unsigned long long)written_ms);
    for (int i = 0; i < n; i++)
        off += snprintf(text + off, sizeof text - (size_t)off, "card.%d.percent=%d\n", i, pct[i]);
    snprintf(path, sizeof path, "%s/allowance", dir);
    vgt_write(path, text);
}

#endif /* VGT_H */
