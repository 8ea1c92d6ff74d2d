/* vg_region.c - see vg_region.h. */
#include "vg_region.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "vg_config.h"

#define LOAD(p) __atomic_load_n((p), __ATOMIC_RELAXED)
#define STORE(p, v) __atomic_store_n((p), (v), __ATOMIC_RELAXED)
#define ADD(p, v) __atomic_fetch_add((p), (v), __ATOMIC_RELAXED)

static void vg_init_header(vg_region *r) {
    vg_header *h = &r->hdr;
    h->version = VG_REGION_VERSION;
    h->header_size = VG_HEADER_SIZE;
    h->max_cards = VG_MAX_CARDS;
    h->max_slots = VG_MAX_SLOTS;
    h->slot_size = VG_SLOT_SIZE;
    h->card_rec_size = sizeof(vg_card_rec);
    pthread_mutexattr_t a;
    pthread_mutexattr_init(&a);
    pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
    pthread_mutex_init(&h->lock.m, &a);
    pthread_mutexattr_destroy(&a);
    __atomic_thread_fence(__ATOMIC_RELEASE);
    memcpy(h->magic, VG_REGION_MAGIC, 8);
}

int vg_region_open(const char *path, vg_region **out, char *err, size_t errlen) {
    /* Every process of the container shares the region, whatever its uid: the first one
     * (often root, e.g. nvidia-smi through the NVML hook) makes it 0666 despite its umask.
     * That gives nothing away: the folder is the container's own and already 0777. */
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd < 0) {
        snprintf(err, errlen, "open(%s): %s", path, strerror(errno));
        return VG_ERR;
    }
    int rc = VG_ERR;
    void *map = MAP_FAILED;
    struct stat st;
    if (flock(fd, LOCK_EX) != 0) {
        snprintf(err, errlen, "flock(%s): %s", path, strerror(errno));
        goto done;
    }
    if (fstat(fd, &st) != 0) {
        snprintf(err, errlen, "fstat(%s): %s", path, strerror(errno));
        goto done;
    }
    if ((st.st_mode & 0777) != 0666 && st.st_uid == geteuid() && fchmod(fd, 0666) != 0) {
        snprintf(err, errlen, "fchmod(%s, 0666): %s", path, strerror(errno));
        goto done;
    }
    if ((size_t)st.st_size < sizeof(vg_region) && ftruncate(fd, sizeof(vg_region)) != 0) {
        snprintf(err, errlen, "ftruncate(%s): %s", path, strerror(errno));
        goto done;
    }
    map = mmap(NULL, sizeof(vg_region), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) {
        snprintf(err, errlen, "mmap(%s): %s", path, strerror(errno));
        goto done;
    }
    vg_region *r = map;
    if (memcmp(r->hdr.magic, "\0\0\0\0\0\0\0\0", 8) == 0) {
        vg_init_header(r);
    } else if (memcmp(r->hdr.magic, VG_REGION_MAGIC, 8) != 0 || r->hdr.version != VG_REGION_VERSION) {
        snprintf(err, errlen, "%s: not a version %d usage region", path, VG_REGION_VERSION);
        munmap(map, sizeof(vg_region));
        goto done;
    }
    *out = r;
    rc = VG_OK;
done:
    flock(fd, LOCK_UN); /* explicitly: the mapping keeps the open file (and a lock) alive */
    close(fd);
    return rc;
}

static void vg_lock(vg_region *r) {
    if (pthread_mutex_lock(&r->hdr.lock.m) == EOWNERDEAD) {
        /* A process died holding the lock; its slot is reclaimed below like any other. */
        pthread_mutex_consistent(&r->hdr.lock.m);
    }
}

static void vg_unlock(vg_region *r) { pthread_mutex_unlock(&r->hdr.lock.m); }

uint64_t vg_proc_start_time(pid_t pid) {
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    if (vg_read_file(path, buf, sizeof buf) < 0) return 0;
    const char *p = strrchr(buf, ')'); /* the command name may contain spaces and ')' */
    if (p == NULL) return 0;
    /* After ") " come fields 3 (state) .. ; start time is field 22. */
    int field = 2;
    unsigned long long v = 0;
    for (p++; *p && field < 22; p++)
        if (*p == ' ') field++;
    if (field != 22 || sscanf(p, "%llu", &v) != 1) return 0;
    return v;
}

int vg_proc_alive(pid_t pid, uint64_t start_time) {
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    if (vg_read_file(path, buf, sizeof buf) < 0) {
        if (errno == ENOENT || errno == ESRCH) return 0;
        return kill(pid, 0) == 0 || errno == EPERM; /* /proc unreadable: ask the kernel */
    }
    const char *p = strrchr(buf, ')');
    if (p == NULL || p[1] != ' ') return 1;
    char state = p[2];
    if (state == 'Z' || state == 'X' || state == 'x') return 0;
    return start_time == 0 || vg_proc_start_time(pid) == start_time;
}

/* Move slot s's counters to the card totals and free it. Lock held. */
static void vg_retire(vg_region *r, int s, int died) {
    vg_slot *sl = &r->slots[s];
    for (int c = 0; c < VG_MAX_CARDS; c++) {
        vg_card_rec *rec = &sl->cards[c];
        vg_card_state *cs = &r->hdr.cards[c];
        ADD(&cs->retired_launches, LOAD(&rec->launches));
        ADD(&cs->retired_throttled_ns, LOAD(&rec->throttled_ns));
        ADD(&cs->retired_refused, LOAD(&rec->refused));
        ADD(&cs->retired_busy_ns, LOAD(&rec->busy_ns));
        if (died) ADD(&cs->reclaimed_bytes, LOAD(&rec->mem_used));
    }
    if (died) ADD(&r->hdr.reclaimed_procs, 1);
    memset(sl->cards, 0, sizeof sl->cards);
    STORE(&sl->pid, 0);
    STORE(&sl->start_time, 0);
    __atomic_store_n(&sl->state, VG_SLOT_FREE, __ATOMIC_RELEASE);
}

static int vg_reap_locked(vg_region *r) {
    int n = 0;
    pid_t self = getpid();
    for (int s = 0; s < VG_MAX_SLOTS; s++) {
        vg_slot *sl = &r->slots[s];
        if (LOAD(&sl->state) != VG_SLOT_LIVE || LOAD(&sl->pid) == self) continue;
        if (!vg_proc_alive(LOAD(&sl->pid), LOAD(&sl->start_time))) {
            STORE(&sl->state, VG_SLOT_RECLAIMING);
            vg_retire(r, s, 1);
            n++;
        }
    }
    return n;
}

int vg_region_reap(vg_region *r) {
    vg_lock(r);
    int n = vg_reap_locked(r);
    vg_unlock(r);
    return n;
}

int vg_region_claim(vg_region *r, pid_t pid) {
    uint64_t st = vg_proc_start_time(pid);
    vg_lock(r);
    vg_reap_locked(r);
    int got = -1;
    for (int s = 0; s < VG_MAX_SLOTS && got < 0; s++) {
        vg_slot *sl = &r->slots[s];
        if (LOAD(&sl->state) != VG_SLOT_FREE) continue;
        memset(sl->cards, 0, sizeof sl->cards);
        STORE(&sl->pid, (int32_t)pid);
        STORE(&sl->start_time, st);
        __atomic_store_n(&sl->state, VG_SLOT_LIVE, __ATOMIC_RELEASE);
        got = s;
    }
    vg_unlock(r);
    return got;
}

void vg_region_release(vg_region *r, int s) {
    if (s < 0 || s >= VG_MAX_SLOTS) return;
    vg_lock(r);
    if (LOAD(&r->slots[s].state) == VG_SLOT_LIVE) vg_retire(r, s, 0);
    vg_unlock(r);
}

static uint64_t vg_used_locked(vg_region *r, int card) {
    uint64_t sum = 0;
    for (int s = 0; s < VG_MAX_SLOTS; s++)
        if (LOAD(&r->slots[s].state) == VG_SLOT_LIVE) sum += LOAD(&r->slots[s].cards[card].mem_used);
    return sum;
}

uint64_t vg_region_card_used(vg_region *r, int card) {
    vg_lock(r);
    uint64_t u = vg_used_locked(r, card);
    vg_unlock(r);
    return u;
}

int vg_region_reserve(vg_region *r, int s, int card, uint64_t bytes, uint64_t cap) {
    vg_card_rec *rec = &r->slots[s].cards[card];
    vg_lock(r);
    uint64_t used = vg_used_locked(r, card);
    if (bytes > cap || used > cap - bytes) {
        if (vg_reap_locked(r) > 0) used = vg_used_locked(r, card);
        if (bytes > cap || used > cap - bytes) {
            vg_unlock(r);
            ADD(&rec->refused, 1);
            return VG_ERR;
        }
    }
    uint64_t mine = LOAD(&rec->mem_used) + bytes;
    STORE(&rec->mem_used, mine);
    if (mine > LOAD(&rec->mem_peak)) STORE(&rec->mem_peak, mine);
    vg_unlock(r);
    return VG_OK;
}

void vg_region_unreserve(vg_region *r, int s, int card, uint64_t bytes) {
    vg_card_rec *rec = &r->slots[s].cards[card];
    vg_lock(r);
    uint64_t mine = LOAD(&rec->mem_used);
    STORE(&rec->mem_used, mine >= bytes ? mine - bytes : 0);
    vg_unlock(r);
}
