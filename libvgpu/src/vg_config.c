/* vg_config.c - the limits and allowance file parsers. See vg_config.h. */
#include "vg_config.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

vg_num vg_parse_u64(const char *s, size_t n, uint64_t lo, uint64_t hi, uint64_t *out) {
    if (s == NULL || n == 0) return VG_NUM_UNSET;
    if (n > 18) return VG_NUM_INVALID;
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') return VG_NUM_INVALID;
        v = v * 10 + (uint64_t)(s[i] - '0');
    }
    if (v < lo || v > hi) return VG_NUM_RANGE;
    *out = v;
    return VG_NUM_OK;
}

static int vg_hex(char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

int vg_uuid_valid(const char *s, size_t n) {
    static const int groups[] = {8, 4, 4, 4, 12};
    if (n != 40 || strncmp(s, "GPU-", 4) != 0) return 0;
    size_t p = 4;
    for (int g = 0; g < 5; g++) {
        for (int i = 0; i < groups[g]; i++, p++)
            if (!vg_hex(s[p])) return 0;
        if (g < 4 && s[p++] != '-') return 0;
    }
    return 1;
}

static void vg_errf(char *err, size_t errlen, const char *fmt, ...) {
    if (err == NULL || errlen == 0) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

/* One line of the shared key=value syntax. */
typedef struct vg_kv {
    const char *key;
    size_t klen;
    const char *val;
    size_t vlen;
    int lineno;
} vg_kv;

typedef int (*vg_kv_fn)(const vg_kv *kv, void *ctx, char *err, size_t errlen);

static int vg_key_is(const vg_kv *kv, const char *name) {
    return kv->klen == strlen(name) && memcmp(kv->key, name, kv->klen) == 0;
}

/* Walk the lines of text, checking the syntax and that "version=1" comes first; call fn
 * for every key after it. */
static int vg_kv_walk(const char *text, size_t len, vg_kv_fn fn, void *ctx, char *err,
                      size_t errlen) {
    int lineno = 0, seen_version = 0;
    size_t pos = 0;
    while (pos < len) {
        const char *line = text + pos;
        const char *nl = memchr(line, '\n', len - pos);
        size_t n = nl ? (size_t)(nl - line) : len - pos;
        pos += n + (nl ? 1 : 0);
        lineno++;
        if (n == 0 || line[0] == '#') continue;
        if (memchr(line, '\r', n) || memchr(line, '\0', n)) {
            vg_errf(err, errlen, "line %d: carriage return or NUL; lines end with \\n only", lineno);
            return VG_ERR;
        }
        const char *eq = memchr(line, '=', n);
        if (eq == NULL || eq == line) {
            vg_errf(err, errlen, "line %d: expected key=value", lineno);
            return VG_ERR;
        }
        vg_kv kv = {line, (size_t)(eq - line), eq + 1, n - (size_t)(eq - line) - 1, lineno};
        if (!seen_version) {
            uint64_t v = 0;
            if (!vg_key_is(&kv, "version")) {
                vg_errf(err, errlen, "line %d: the first key must be 'version'", lineno);
                return VG_ERR;
            }
            if (vg_parse_u64(kv.val, kv.vlen, 1, 1, &v) != VG_NUM_OK) {
                vg_errf(err, errlen, "line %d: version: unknown version '%.*s'; this library reads v1",
                        lineno, (int)kv.vlen, kv.val);
                return VG_ERR;
            }
            seen_version = 1;
            continue;
        }
        if (vg_key_is(&kv, "version")) {
            vg_errf(err, errlen, "line %d: key 'version' given twice", lineno);
            return VG_ERR;
        }
        if (fn(&kv, ctx, err, errlen) != VG_OK) return VG_ERR;
    }
    if (!seen_version) {
        vg_errf(err, errlen, "empty: missing 'version'");
        return VG_ERR;
    }
    return VG_OK;
}

/* "card.<i>.<field>": 1 and sets *idx and *field when key has that shape, 0 otherwise. */
static int vg_card_key(const vg_kv *kv, int *idx, const char **field, size_t *flen) {
    if (kv->klen < 7 || memcmp(kv->key, "card.", 5) != 0) return 0;
    const char *p = kv->key + 5, *end = kv->key + kv->klen;
    const char *dot = memchr(p, '.', (size_t)(end - p));
    uint64_t i = 0;
    if (dot == NULL || vg_parse_u64(p, (size_t)(dot - p), 0, VG_MAX_CARDS - 1, &i) != VG_NUM_OK)
        return 0;
    *idx = (int)i;
    *field = dot + 1;
    *flen = (size_t)(end - dot - 1);
    return 1;
}

enum { F_UUID = 1, F_MEM = 2, F_CORES = 4, F_POLICY = 8, F_ALL = 15 };

typedef struct vg_limits_ctx {
    vg_limits *out;
    int have_region, have_allowance, have_cards, have_context;
    int card_fields[VG_MAX_CARDS];
} vg_limits_ctx;

static int vg_set_path(const vg_kv *kv, char *dst, size_t cap, int *have, char *err, size_t errlen) {
    if (*have) {
        vg_errf(err, errlen, "line %d: key '%.*s' given twice", kv->lineno, (int)kv->klen, kv->key);
        return VG_ERR;
    }
    if (kv->vlen == 0 || kv->val[0] != '/' || kv->vlen >= cap) {
        vg_errf(err, errlen, "line %d: %.*s: must be an absolute path shorter than %zu bytes",
                kv->lineno, (int)kv->klen, kv->key, cap);
        return VG_ERR;
    }
    memcpy(dst, kv->val, kv->vlen);
    dst[kv->vlen] = '\0';
    *have = 1;
    return VG_OK;
}

static int vg_num_err(const vg_kv *kv, vg_num r, uint64_t lo, uint64_t hi, char *err, size_t errlen) {
    if (r == VG_NUM_RANGE)
        vg_errf(err, errlen, "line %d: %.*s: outside %llu..%llu", kv->lineno, (int)kv->klen, kv->key,
                (unsigned long long)lo, (unsigned long long)hi);
    else
        vg_errf(err, errlen, "line %d: %.*s: not a decimal integer", kv->lineno, (int)kv->klen,
                kv->key);
    return VG_ERR;
}

static int vg_limits_kv(const vg_kv *kv, void *vctx, char *err, size_t errlen) {
    vg_limits_ctx *c = vctx;
    vg_limits *out = c->out;
    if (vg_key_is(kv, "region"))
        return vg_set_path(kv, out->region, sizeof out->region, &c->have_region, err, errlen);
    if (vg_key_is(kv, "allowance"))
        return vg_set_path(kv, out->allowance, sizeof out->allowance, &c->have_allowance, err,
                           errlen);
    if (vg_key_is(kv, "cards")) {
        uint64_t n = 0;
        vg_num r = vg_parse_u64(kv->val, kv->vlen, 1, VG_MAX_CARDS, &n);
        if (c->have_cards) {
            vg_errf(err, errlen, "line %d: key 'cards' given twice", kv->lineno);
            return VG_ERR;
        }
        if (r != VG_NUM_OK) return vg_num_err(kv, r, 1, VG_MAX_CARDS, err, errlen);
        out->ncards = (int)n;
        c->have_cards = 1;
        return VG_OK;
    }
    if (vg_key_is(kv, "context_mib")) {
        uint64_t mib = 0;
        vg_num r = vg_parse_u64(kv->val, kv->vlen, 0, 1ULL << 20, &mib);
        if (c->have_context) {
            vg_errf(err, errlen, "line %d: key 'context_mib' given twice", kv->lineno);
            return VG_ERR;
        }
        if (r != VG_NUM_OK) return vg_num_err(kv, r, 0, 1ULL << 20, err, errlen);
        out->context_bytes = mib << 20;
        c->have_context = 1;
        return VG_OK;
    }
    int i = 0;
    const char *f = NULL;
    size_t flen = 0;
    if (!vg_card_key(kv, &i, &f, &flen)) return VG_OK; /* unknown keys are ignored */
    vg_card_limit *card = &out->cards[i];
    int bit = 0;
    uint64_t v = 0;
    vg_num r;
    if (flen == 4 && memcmp(f, "uuid", 4) == 0) {
        bit = F_UUID;
        if (!vg_uuid_valid(kv->val, kv->vlen)) {
            vg_errf(err, errlen, "line %d: card.%d.uuid: not a GPU UUID", kv->lineno, i);
            return VG_ERR;
        }
        memcpy(card->uuid, kv->val, kv->vlen);
        card->uuid[kv->vlen] = '\0';
    } else if (flen == 10 && memcmp(f, "memory_mib", 10) == 0) {
        bit = F_MEM;
        if ((r = vg_parse_u64(kv->val, kv->vlen, 1, 1ULL << 40, &v)) != VG_NUM_OK)
            return vg_num_err(kv, r, 1, 1ULL << 40, err, errlen);
        card->memory_bytes = v << 20;
    } else if (flen == 13 && memcmp(f, "cores_percent", 13) == 0) {
        bit = F_CORES;
        if ((r = vg_parse_u64(kv->val, kv->vlen, 0, 100, &v)) != VG_NUM_OK)
            return vg_num_err(kv, r, 0, 100, err, errlen);
        card->cores_percent = (int)v;
    } else if (flen == 6 && memcmp(f, "policy", 6) == 0) {
        bit = F_POLICY;
        if (kv->vlen == 11 && memcmp(kv->val, "fixed-share", 11) == 0)
            card->policy = VG_POLICY_FIXED;
        else if (kv->vlen == 11 && memcmp(kv->val, "burst-share", 11) == 0)
            card->policy = VG_POLICY_BURST;
        else if (kv->vlen == 11 && memcmp(kv->val, "best-effort", 11) == 0)
            card->policy = VG_POLICY_BEST_EFFORT;
        else {
            vg_errf(err, errlen,
                    "line %d: card.%d.policy: not one of fixed-share, burst-share, best-effort",
                    kv->lineno, i);
            return VG_ERR;
        }
    } else {
        return VG_OK;
    }
    if (c->card_fields[i] & bit) {
        vg_errf(err, errlen, "line %d: key '%.*s' given twice", kv->lineno, (int)kv->klen, kv->key);
        return VG_ERR;
    }
    c->card_fields[i] |= bit;
    return VG_OK;
}

int vg_limits_parse(const char *text, size_t len, vg_limits *out, char *err, size_t errlen) {
    static const char *const names[] = {"uuid", "memory_mib", "cores_percent", "policy"};
    vg_limits_ctx c;
    memset(&c, 0, sizeof c);
    memset(out, 0, sizeof *out);
    c.out = out;
    if (vg_kv_walk(text, len, vg_limits_kv, &c, err, errlen) != VG_OK) return VG_ERR;
    if (!c.have_region) {
        vg_errf(err, errlen, "missing key 'region'");
        return VG_ERR;
    }
    if (!c.have_cards) {
        vg_errf(err, errlen, "missing key 'cards'");
        return VG_ERR;
    }
    for (int i = 0; i < out->ncards; i++) {
        for (int b = 0; b < 4; b++) {
            if (!(c.card_fields[i] & (1 << b))) {
                vg_errf(err, errlen, "missing key 'card.%d.%s'", i, names[b]);
                return VG_ERR;
            }
        }
        vg_card_limit *card = &out->cards[i];
        if (card->policy != VG_POLICY_BEST_EFFORT && card->cores_percent < 1) {
            vg_errf(err, errlen, "card.%d.cores_percent: %s needs 1..100, got 0", i,
                    card->policy == VG_POLICY_FIXED ? "fixed-share" : "burst-share");
            return VG_ERR;
        }
        if (card->policy == VG_POLICY_BURST && !c.have_allowance) {
            vg_errf(err, errlen, "missing key 'allowance' (card.%d is burst-share)", i);
            return VG_ERR;
        }
        for (int j = 0; j < i; j++) {
            if (strcasecmp(out->cards[j].uuid, card->uuid) == 0) {
                vg_errf(err, errlen, "card.%d.uuid: %s listed twice", i, card->uuid);
                return VG_ERR;
            }
        }
    }
    return VG_OK;
}

typedef struct vg_allow_ctx {
    int *pct;
    uint64_t *written_ms;
    int have_written;
} vg_allow_ctx;

static int vg_allow_kv(const vg_kv *kv, void *vctx, char *err, size_t errlen) {
    vg_allow_ctx *c = vctx;
    uint64_t v = 0;
    vg_num r;
    if (vg_key_is(kv, "written_unix_ms")) {
        if (c->have_written) {
            vg_errf(err, errlen, "line %d: key 'written_unix_ms' given twice", kv->lineno);
            return VG_ERR;
        }
        if ((r = vg_parse_u64(kv->val, kv->vlen, 0, UINT64_MAX, &v)) != VG_NUM_OK)
            return vg_num_err(kv, r, 0, UINT64_MAX, err, errlen);
        *c->written_ms = v;
        c->have_written = 1;
        return VG_OK;
    }
    int i = 0;
    const char *f = NULL;
    size_t flen = 0;
    if (!vg_card_key(kv, &i, &f, &flen) || flen != 7 || memcmp(f, "percent", 7) != 0) return VG_OK;
    if (c->pct[i] >= 0) {
        vg_errf(err, errlen, "line %d: key 'card.%d.percent' given twice", kv->lineno, i);
        return VG_ERR;
    }
    if ((r = vg_parse_u64(kv->val, kv->vlen, 0, 100, &v)) != VG_NUM_OK)
        return vg_num_err(kv, r, 0, 100, err, errlen);
    c->pct[i] = (int)v;
    return VG_OK;
}

int vg_allowance_parse(const char *text, size_t len, int pct[VG_MAX_CARDS], uint64_t *written_ms,
                       char *err, size_t errlen) {
    vg_allow_ctx c = {pct, written_ms, 0};
    for (int i = 0; i < VG_MAX_CARDS; i++) pct[i] = -1;
    if (vg_kv_walk(text, len, vg_allow_kv, &c, err, errlen) != VG_OK) return VG_ERR;
    if (!c.have_written) {
        vg_errf(err, errlen, "missing key 'written_unix_ms'");
        return VG_ERR;
    }
    return VG_OK;
}

long vg_read_file(const char *path, char *buf, size_t cap) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    size_t n = 0;
    for (;;) {
        ssize_t r = read(fd, buf + n, cap - 1 - n);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            int e = errno;
            close(fd);
            errno = e;
            return -1;
        }
        n += (size_t)r;
        if (r == 0) break;
        if (n == cap - 1) {
            char extra;
            ssize_t more = read(fd, &extra, 1);
            close(fd);
            if (more > 0) {
                errno = EFBIG;
                return -1;
            }
            buf[n] = '\0';
            return (long)n;
        }
    }
    close(fd);
    buf[n] = '\0';
    return (long)n;
}
