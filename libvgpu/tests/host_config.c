/* host_config.c - the limits and allowance parsers, on the host (no driver, no preload). */
#include "vg_config.h"
#include "vgt.h"

static const char GOOD[] =
    "# comment\n"
    "version=1\n"
    "region=/var/run/tessera/usage/region\n"
    "allowance=/var/run/tessera/allowance/allowance\n"
    "cards=2\n"
    "card.0.uuid=GPU-3a1f0c52-9b7e-4c1d-8e2a-5f6b7c8d9e01\n"
    "card.0.memory_mib=8192\n"
    "card.0.cores_percent=30\n"
    "card.0.policy=fixed-share\n"
    "card.1.uuid=GPU-77c0ffee-0000-4000-8000-00000000beef\n"
    "card.1.memory_mib=4096\n"
    "card.1.cores_percent=20\n"
    "card.1.policy=burst-share\n"
    "future.key=ignored\n";

static void parses_the_documented_example(void) {
    vg_limits l;
    char err[256] = "";
    CHECK_RC(vg_limits_parse(GOOD, strlen(GOOD), &l, err, sizeof err), VG_OK);
    CHECK(l.ncards == 2, "ncards %d", l.ncards);
    CHECK(strcmp(l.region, "/var/run/tessera/usage/region") == 0, "region %s", l.region);
    CHECK(strcmp(l.allowance, "/var/run/tessera/allowance/allowance") == 0, "allowance %s", l.allowance);
    CHECK(l.cards[0].memory_bytes == 8192ull << 20, "mem0");
    CHECK(l.cards[0].cores_percent == 30 && l.cards[0].policy == VG_POLICY_FIXED, "card0");
    CHECK(l.cards[1].memory_bytes == 4096ull << 20, "mem1");
    CHECK(l.cards[1].cores_percent == 20 && l.cards[1].policy == VG_POLICY_BURST, "card1");
    CHECK(strcmp(l.cards[1].uuid, "GPU-77c0ffee-0000-4000-8000-00000000beef") == 0, "uuid1");
    CHECK(l.context_bytes == 0, "no context_mib: nothing charged per context");
}

static void context_mib_is_the_charge_per_context(void) {
    char text[4096], err[256] = "";
    snprintf(text, sizeof text, "%scontext_mib=300\n", GOOD);
    vg_limits l;
    CHECK_RC(vg_limits_parse(text, strlen(text), &l, err, sizeof err), VG_OK);
    CHECK(l.context_bytes == 300ull << 20, "context_bytes %llu", (unsigned long long)l.context_bytes);
}

/* Replace the first occurrence of from in GOOD with to, parse, and expect an error that
 * contains want. */
static void expect_error(const char *from, const char *to, const char *want) {
    char text[4096], err[256] = "";
    const char *at = strstr(GOOD, from);
    CHECK(at != NULL, "fixture lacks %s", from);
    snprintf(text, sizeof text, "%.*s%s%s", (int)(at - GOOD), GOOD, to, at + strlen(from));
    vg_limits l;
    CHECK_RC(vg_limits_parse(text, strlen(text), &l, err, sizeof err), VG_ERR);
    CHECK(strstr(err, want) != NULL, "error '%s' does not say '%s'", err, want);
}

static void refuses_bad_files_naming_the_rule(void) {
    expect_error("version=1", "version=2", "unknown version '2'");
    expect_error("version=1\n", "", "first key must be 'version'");
    expect_error("cards=2", "cards=17", "cards: outside 1..16");
    expect_error("cards=2", "cards=-1", "cards: not a decimal integer");
    expect_error("cards=2", "cards=", "cards: not a decimal integer");
    expect_error("cards=2", "cards=3", "missing key 'card.2.uuid'");
    expect_error("cards=2\n", "", "missing key 'cards'");
    expect_error("region=/var/run/tessera/usage/region\n", "", "missing key 'region'");
    expect_error("region=/var", "region=var", "region: must be an absolute path");
    expect_error("memory_mib=8192", "memory_mib=0", "card.0.memory_mib: outside");
    expect_error("memory_mib=8192", "memory_mib=8k", "card.0.memory_mib: not a decimal integer");
    expect_error("memory_mib=8192", "memory_mib=1234567890123456789", "not a decimal integer");
    expect_error("cores_percent=30", "cores_percent=101", "card.0.cores_percent: outside 0..100");
    expect_error("cores_percent=30", "cores_percent=0", "fixed-share needs 1..100");
    expect_error("=fixed-share", "=hard", "card.0.policy: not one of");
    expect_error("GPU-3a1f0c52", "GPU-3a1f0c5x", "card.0.uuid: not a GPU UUID");
    expect_error("GPU-77c0ffee-0000-4000-8000-00000000beef", "GPU-3A1F0C52-9b7e-4c1d-8e2a-5f6b7c8d9e01",
                 "listed twice");
    expect_error("allowance=/var/run/tessera/allowance/allowance\n", "", "missing key 'allowance'");
    expect_error("cards=2\n", "cards=2\ncards=2\n", "given twice");
    expect_error("card.0.policy=fixed-share\n", "card.0.policy=fixed-share\ncard.0.policy=fixed-share\n",
                 "given twice");
    expect_error("version=1\n", "version=1\r\n", "carriage return");
    expect_error("cards=2\n", "cards\n", "expected key=value");
    expect_error("cards=2\n", "cards=2\ncontext_mib=1048577\n", "context_mib: outside 0..1048576");
    expect_error("cards=2\n", "cards=2\ncontext_mib=300M\n", "context_mib: not a decimal integer");
    expect_error("cards=2\n", "cards=2\ncontext_mib=1\ncontext_mib=2\n", "'context_mib' given twice");
}

static void empty_and_odd_input(void) {
    vg_limits l;
    char err[256] = "";
    CHECK_RC(vg_limits_parse("", 0, &l, err, sizeof err), VG_ERR);
    CHECK(strstr(err, "missing 'version'"), "%s", err);
    CHECK_RC(vg_limits_parse("version=1\0cards=1", 17, &l, err, sizeof err), VG_ERR);
    CHECK_RC(vg_limits_parse("version=1", 9, &l, NULL, 0), VG_ERR); /* no err buffer: no crash */
}

static void numbers_keep_unset_apart_from_invalid(void) {
    uint64_t v = 7;
    CHECK_RC(vg_parse_u64("", 0, 0, 10, &v), VG_NUM_UNSET);
    CHECK_RC(vg_parse_u64(NULL, 3, 0, 10, &v), VG_NUM_UNSET);
    CHECK_RC(vg_parse_u64("1x", 2, 0, 10, &v), VG_NUM_INVALID);
    CHECK_RC(vg_parse_u64("-1", 2, 0, 10, &v), VG_NUM_INVALID);
    CHECK_RC(vg_parse_u64("+1", 2, 0, 10, &v), VG_NUM_INVALID);
    CHECK_RC(vg_parse_u64("1234567890123456789", 19, 0, UINT64_MAX, &v), VG_NUM_INVALID);
    CHECK_RC(vg_parse_u64("11", 2, 0, 10, &v), VG_NUM_RANGE);
    CHECK(v == 7, "value changed on error");
    CHECK_RC(vg_parse_u64("10", 2, 0, 10, &v), VG_NUM_OK);
    CHECK(v == 10, "v %llu", (unsigned long long)v);
    CHECK_RC(vg_parse_u64("999999999999999999", 18, 0, UINT64_MAX, &v), VG_NUM_OK);
}

static void uuids(void) {
    CHECK(vg_uuid_valid("GPU-3a1f0c52-9b7e-4c1d-8e2a-5f6b7c8d9e01", 40), "valid");
    CHECK(vg_uuid_valid("GPU-3A1F0C52-9B7E-4C1D-8E2A-5F6B7C8D9E01", 40), "upper");
    CHECK(!vg_uuid_valid("MIG-3a1f0c52-9b7e-4c1d-8e2a-5f6b7c8d9e01", 40), "prefix");
    CHECK(!vg_uuid_valid("GPU-3a1f0c52-9b7e-4c1d-8e2a-5f6b7c8d9e0", 39), "short");
    CHECK(!vg_uuid_valid("GPU-3a1f0c52x9b7e-4c1d-8e2a-5f6b7c8d9e01", 40), "dash");
}

static void allowance_file(void) {
    int pct[VG_MAX_CARDS];
    uint64_t ms = 0;
    char err[256] = "";
    const char *t = "version=1\nwritten_unix_ms=1732180000123\ncard.0.percent=45\ncard.3.percent=100\n";
    CHECK_RC(vg_allowance_parse(t, strlen(t), pct, &ms, err, sizeof err), VG_OK);
    CHECK(ms == 1732180000123ull, "ms");
    CHECK(pct[0] == 45 && pct[3] == 100 && pct[1] == -1 && pct[2] == -1, "pct %d %d %d", pct[0], pct[1], pct[3]);
    const char *bad[][2] = {
        {"version=1\ncard.0.percent=45\n", "missing key 'written_unix_ms'"},
        {"version=1\nwritten_unix_ms=1\ncard.0.percent=101\n", "outside 0..100"},
        {"version=1\nwritten_unix_ms=1\ncard.0.percent=4x\n", "not a decimal integer"},
        {"version=1\nwritten_unix_ms=1\ncard.0.percent=4\ncard.0.percent=5\n", "given twice"},
        {"version=3\n", "unknown version"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CHECK_RC(vg_allowance_parse(bad[i][0], strlen(bad[i][0]), pct, &ms, err, sizeof err), VG_ERR);
        CHECK(strstr(err, bad[i][1]), "case %zu: error '%s' does not say '%s'", i, err, bad[i][1]);
    }
}

static void read_file_sizes(void) {
    const char *dir = vgt_tmpdir();
    char path[512], buf[8];
    snprintf(path, sizeof path, "%s/f", dir);
    CHECK(vg_read_file(path, buf, sizeof buf) == -1 && errno == ENOENT, "missing file");
    vgt_write(path, "1234567");
    CHECK(vg_read_file(path, buf, sizeof buf) == 7 && strcmp(buf, "1234567") == 0, "fits");
    vgt_write(path, "12345678");
    CHECK(vg_read_file(path, buf, sizeof buf) == -1 && errno == EFBIG, "too big");
}

VGT_MAIN(VGT_CASE(parses_the_documented_example), VGT_CASE(context_mib_is_the_charge_per_context),
         VGT_CASE(refuses_bad_files_naming_the_rule),
         VGT_CASE(empty_and_odd_input), VGT_CASE(numbers_keep_unset_apart_from_invalid),
         VGT_CASE(uuids), VGT_CASE(allowance_file), VGT_CASE(read_file_sizes))
