/* Bad input through the C ABI: every case is an error code with a message, never a crash.
 * Prints one line per case and closes with `c-abi: N passed, N failed`; exits 1 on a failure.
 *
 * Build (from the repository root, after `cargo build -p tierkit-c`):
 *   cc -std=c11 -Wall -Wextra -Werror -Ibindings/c/include bindings/c/tests/test_abi.c \
 *      -Ltarget/debug -ltierkit_c -Wl,-rpath,target/debug -o target/test_abi
 */
#define _DEFAULT_SOURCE /* fork, setrlimit under -std=c11 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tierkit.h"

#if defined(__linux__)
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>
#endif

static int passed, failed;

/* Checks that `code` is `want` and that the error carries the same code and a message
 * containing `needle` (NULL: any non-empty message); frees the error. */
static void expect(const char *name, tierkit_code code, tierkit_error *err, tierkit_code want,
                   const char *needle) {
    int good = code == want;
    const char *msg = "";
    if (want != TIERKIT_OK) {
        msg = tierkit_error_message(err);
        good = good && err != NULL && tierkit_error_code(err) == want && msg[0] != '\0' &&
               (needle == NULL || strstr(msg, needle) != NULL);
    } else {
        good = good && err == NULL;
    }
    printf("%s %s (code %d%s%s)\n", good ? "ok  " : "FAIL", name, (int)code, msg[0] ? ": " : "",
           msg);
    good ? passed++ : failed++;
    tierkit_error_free(err);
}

#define EXPECT(name, call, want, needle) \
    do { tierkit_error *err_ = NULL; tierkit_code c_ = (call); expect(name, c_, err_, want, needle); } while (0)

#if defined(__linux__)
/* Caps this process's address space at what it maps now plus `headroom` bytes (as a container's
 * memory limit would); 0 on success. */
static int limit_address_space(unsigned long long headroom) {
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long long pages = 0;
    int ok = f != NULL && fscanf(f, "%llu", &pages) == 1;
    if (f) fclose(f);
    if (!ok) return -1;
    struct rlimit old;
    if (getrlimit(RLIMIT_AS, &old) != 0) return -1;
    rlim_t cap = (rlim_t)(pages * (unsigned long long)sysconf(_SC_PAGESIZE) + headroom);
    if (old.rlim_max != RLIM_INFINITY && old.rlim_max < cap) return -1;
    struct rlimit lim = {cap, old.rlim_max};
    return setrlimit(RLIMIT_AS, &lim);
}

/* In a forked child under an address-space cap: an admission whose history the host cannot copy
 * and counters the geometry makes too large are TIERKIT_ERR_OUT_OF_MEMORY (before: an abort),
 * and the library goes on. The child's exit status is the number of failed cases. */
static void out_of_memory_cases(void) {
    fflush(stdout); /* nothing buffered is printed twice */
    pid_t pid = fork();
    if (pid == 0) {
        passed = failed = 0;
        size_t big = (size_t)256 << 20; /* the caller's history: calloc'd, never touched */
        uint8_t *history = calloc(big, 1);
        tierkit_kv_geometry kg;
        tierkit_kv_pool *pool = NULL;
        tierkit_kv_geometry_for_hbm_budget(64 * 16 * 64, 64, 1, 16, 16, 16, 0, &kg, NULL);
        if (history == NULL || tierkit_kv_pool_new(&kg, true, &pool, NULL) != TIERKIT_OK ||
            limit_address_space((unsigned long long)32 << 20) != 0) {
            printf("SKIP: out of memory cases (no address-space limit here)\n");
            fflush(stdout);
            _exit(0);
        }
        EXPECT("oom: admit a history the host cannot copy",
               tierkit_kv_pool_admit(pool, 1, history, big, NULL, &err_), TIERKIT_ERR_OUT_OF_MEMORY, "history");
        static uint8_t small[64 * 40];
        EXPECT("oom: the pool goes on", tierkit_kv_pool_admit(pool, 1, small, sizeof small, NULL, &err_),
               TIERKIT_OK, NULL);
        EXPECT("oom: append past the cap", tierkit_kv_pool_append(pool, 1, history, big, NULL, &err_),
               TIERKIT_ERR_OUT_OF_MEMORY, "history");
        tierkit_expert_geometry huge = {16, 1u << 20, 4, 1}; /* 64 MiB of counters */
        tierkit_pick_counters *c = NULL;
        EXPECT("oom: counters too large for the cap", tierkit_pick_counters_new(&huge, &c, &err_),
               TIERKIT_ERR_OUT_OF_MEMORY, "pick counters");
        tierkit_kv_pool_free(pool);
        fflush(stdout);
        _exit(failed);
    }
    int status = 0;
    int good = pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (pid > 0 && WIFSIGNALED(status))
        printf("FAIL out-of-memory child killed by signal %d (an allocation failure aborted it)\n",
               WTERMSIG(status));
    printf("%s out-of-memory cases under an address-space limit (forked child)\n", good ? "ok  " : "FAIL");
    good ? passed++ : failed++;
}
#else
static void out_of_memory_cases(void) {
    printf("SKIP: out-of-memory cases need Linux (setrlimit(RLIMIT_AS), /proc/self/statm)\n");
}
#endif

/* Disaggregation through the region store: a prefill pool exports a history, a decode pool
 * reserves rows for it, the "agent" (a memcpy here; NIXL and Mooncake in the Python tests)
 * writes them in place, the decode side commits and resolves the source's bytes. */
static void on_teardown(void *user, uint64_t addr, uint64_t len) {
    (void)addr;
    (void)len;
    (*(int *)user)++;
}

static void transfer_cases(void) {
    tierkit_kv_geometry kg;
    tierkit_kv_geometry_for_hbm_budget(32 * 4 * 32, 16, 2, 4, 8, 4, 0, &kg, NULL);
    tierkit_kv_pool *prefill = NULL, *decode = NULL, *plain = NULL;
    EXPECT("transfer: store pools", tierkit_kv_pool_new_with_store(&kg, true, 4, 64, false, &prefill, &err_) ||
                                        tierkit_kv_pool_new_with_store(&kg, true, 4, 64, false, &decode, &err_),
           TIERKIT_OK, NULL);
    {
        tierkit_kv_pool *huge = NULL;
        EXPECT("transfer: a store size overflowing 64 bits",
               tierkit_kv_pool_new_with_store(&kg, true, UINT32_MAX, UINT32_MAX, false, &huge, &err_),
               TIERKIT_ERR_INVALID_ARGUMENT, "overflows");
    }
    tierkit_kv_region region;
    EXPECT("transfer: region", tierkit_kv_pool_region(decode, &region, &err_), TIERKIT_OK, NULL);
    int layout = region.kind == TIERKIT_MEM_DRAM && region.item_len == 32 && region.len == 4 * 64 * 32 &&
                 region.max_slots == 4 && region.max_history == 64 && region.layers == 2 && region.row_bytes == 16;
    printf("%s transfer: region layout\n", layout ? "ok  " : "FAIL");
    layout ? passed++ : failed++;
    tierkit_kv_pool_new(&kg, true, &plain, NULL);
    EXPECT("transfer: no region in the default store", tierkit_kv_pool_region(plain, &region, &err_),
           TIERKIT_ERR_UNSUPPORTED, "region");
    tierkit_kv_pool_free(plain);
    uint8_t hist[24 * 32];
    for (size_t i = 0; i < sizeof hist; i++) hist[i] = (uint8_t)(i * 7 + i / 32);
    tierkit_kv_pool_admit(prefill, 9, hist, sizeof hist, NULL, NULL);
    tierkit_kv_row_span src, lo, hi, bad;
    EXPECT("transfer: export", tierkit_kv_pool_export(prefill, 9, &src, &err_), TIERKIT_OK, NULL);
    EXPECT("transfer: commit without reserve", tierkit_kv_pool_commit(decode, 9, NULL, &err_),
           TIERKIT_ERR_INVALID_ARGUMENT, "no import");
    EXPECT("transfer: reserve rows 12..24", tierkit_kv_pool_reserve(decode, 9, 12, 24, &hi, &err_), TIERKIT_OK, NULL);
    EXPECT("transfer: overlapping reserve", tierkit_kv_pool_reserve(decode, 9, 8, 16, &bad, &err_),
           TIERKIT_ERR_INVALID_ARGUMENT, "overlap");
    EXPECT("transfer: rows beyond the region", tierkit_kv_pool_reserve(decode, 9, 60, 65, &bad, &err_),
           TIERKIT_ERR_INVALID_ARGUMENT, "outside");
    EXPECT("transfer: reserve rows 0..12", tierkit_kv_pool_reserve(decode, 9, 0, 12, &lo, &err_), TIERKIT_OK, NULL);
    EXPECT("transfer: invisible until commit", tierkit_kv_pool_finish(decode, 9, &err_),
           TIERKIT_ERR_INVALID_ARGUMENT, "imported");
    memcpy((void *)(uintptr_t)lo.addr, (const void *)(uintptr_t)src.addr, (size_t)lo.len);
    memcpy((void *)(uintptr_t)hi.addr, (const void *)(uintptr_t)(src.addr + lo.len), (size_t)hi.len);
    tierkit_kv_admission a;
    EXPECT("transfer: commit", tierkit_kv_pool_commit(decode, 9, &a, &err_), TIERKIT_OK, NULL);
    EXPECT("transfer: export done", tierkit_kv_pool_export_done(prefill, 9, &err_), TIERKIT_OK, NULL);
    uint64_t sessions[1] = {9}, read = 0;
    int32_t qsl[2] = {0, 1}, seq[1] = {24}, topk[4] = {0, 7, 13, 23}, idx[4], valid[1];
    tierkit_kv_batch b = {sessions, 1, qsl, seq, topk, 1, 4, 4, NULL, 0, 0, 0};
    EXPECT("transfer: resolve the import", tierkit_kv_pool_resolve(decode, &b, idx, 4, valid, 1, NULL, &read, &err_),
           TIERKIT_OK, NULL);
    int exact = a.admitted && valid[0] == 4;
    for (int j = 0; j < 4 && exact; j++) {
        const uint8_t *row = NULL;
        uintptr_t len = 0;
        exact = tierkit_kv_pool_arena_row(decode, 0, idx[j], &row, &len, NULL) == TIERKIT_OK && len == 16 &&
                memcmp(row, hist + (size_t)topk[j] * 32, 16) == 0;
        uint8_t copy[16];
        uintptr_t copied = 0;
        exact = exact && tierkit_kv_pool_read_row(decode, 0, idx[j], copy, sizeof copy, &copied, NULL) == TIERKIT_OK &&
                copied == 16 && memcmp(copy, row, 16) == 0;
    }
    printf("%s transfer: attention reads the source's bytes\n", exact ? "ok  " : "FAIL");
    exact ? passed++ : failed++;
    tierkit_kv_pool_end_read(decode, read, NULL);
    EXPECT("transfer: timeout of 0", tierkit_kv_pool_set_import_timeout(decode, 0, &err_),
           TIERKIT_ERR_INVALID_ARGUMENT, "timeout");
    EXPECT("transfer: reserve with a NULL span", tierkit_kv_pool_reserve(decode, 10, 0, 4, NULL, &err_),
           TIERKIT_ERR_NULL_ARGUMENT, "span");
    EXPECT("transfer: reserve then abort", tierkit_kv_pool_reserve(decode, 10, 0, 4, &bad, &err_) ||
                                              tierkit_kv_pool_abort(decode, 10, &err_),
           TIERKIT_OK, NULL);
    int torn = 0;
    EXPECT("transfer: teardown callback", tierkit_kv_pool_on_teardown(decode, on_teardown, &torn, &err_),
           TIERKIT_OK, NULL);
    tierkit_kv_pool_free(decode);
    tierkit_kv_pool_free(prefill);
    printf("%s transfer: the callback ran at free\n", torn == 1 ? "ok  " : "FAIL");
    torn == 1 ? passed++ : failed++;
}

/* Sizing a paged split arena from a budget: the padded pages are what the budget holds (setting
 * the format on tierkit_kv_geometry_for_hbm_budget's contiguous result gave an arena over the
 * budget), and past 1 TiB the padded arena is capped, not refused. */
static void fit_budget_cases(void) {
    uint32_t groups[2] = {1, 1};
    tierkit_kv_geometry v4 = {.row_bytes = 584, .layers = 2, .page_rows = 64, .arena_pages = 0,
                              .hot_rows = 128, .tail_rows = 64, .group_count = 2, .group_sizes = groups,
                              .row_format = TIERKIT_KV_FMT_PAGED_SPLIT, .fmt_value_bytes = 576,
                              .fmt_scale_bytes = 8, .fmt_page_bytes = 37440};
    tierkit_kv_geometry out = {0};
    EXPECT("fit budget: 64 MiB of DeepSeek-V4 rows",
           tierkit_kv_geometry_fit_budget(64u << 20, &v4, &out, &err_), TIERKIT_OK, NULL);
    int good = out.arena_pages == (64u << 20) / (2 * 37440) && out.row_format == TIERKIT_KV_FMT_PAGED_SPLIT &&
               out.fmt_page_bytes == 37440 && out.group_sizes == groups &&
               (uint64_t)out.arena_pages * 2 * 37440 <= (64u << 20);
    tierkit_kv_pool *pool = NULL;
    EXPECT("fit budget: its geometry makes a pool", tierkit_kv_pool_new(&out, true, &pool, &err_), TIERKIT_OK, NULL);
    tierkit_kv_pool_free(pool);
    EXPECT("fit budget: 2 TiB is capped at 1 TiB of padded pages",
           tierkit_kv_geometry_fit_budget(2ull << 40, &v4, &out, &err_), TIERKIT_OK, NULL);
    good = good && out.arena_pages == (1ull << 40) / (2 * 37440);
    EXPECT("fit budget: UINT64_MAX is capped too",
           tierkit_kv_geometry_fit_budget(UINT64_MAX, &v4, &out, &err_), TIERKIT_OK, NULL);
    good = good && out.arena_pages == (1ull << 40) / (2 * 37440);
    printf("%s fit budget: padded pages counted and capped\n", good ? "ok  " : "FAIL");
    good ? passed++ : failed++;
    EXPECT("fit budget: below one session's padded pages",
           tierkit_kv_geometry_fit_budget(3 * 2 * 37440 - 1, &v4, &out, &err_), TIERKIT_ERR_INVALID_ARGUMENT,
           "224640");
    EXPECT("fit budget: NULL shape", tierkit_kv_geometry_fit_budget(1 << 26, NULL, &out, &err_),
           TIERKIT_ERR_NULL_ARGUMENT, "shape");
    EXPECT("fit budget: NULL out", tierkit_kv_geometry_fit_budget(1 << 26, &v4, NULL, &err_),
           TIERKIT_ERR_NULL_ARGUMENT, "out_geometry");
    tierkit_kv_geometry bad = v4;
    bad.fmt_page_bytes = 64 * 584 - 1;
    EXPECT("fit budget: a page that cannot hold its rows",
           tierkit_kv_geometry_fit_budget(1 << 26, &bad, &out, &err_), TIERKIT_ERR_INVALID_ARGUMENT, "page_bytes");
    bad = v4;
    bad.row_format = 2;
    EXPECT("fit budget: an unknown format", tierkit_kv_geometry_fit_budget(1 << 26, &bad, &out, &err_),
           TIERKIT_ERR_INVALID_ARGUMENT, "row_format");
    bad = v4;
    groups[1] = 2;
    EXPECT("fit budget: layer groups that do not sum to the layers",
           tierkit_kv_geometry_fit_budget(1 << 26, &bad, &out, &err_), TIERKIT_ERR_INVALID_ARGUMENT, NULL);
}

/* DeepSeek-V4's paged split row format, scaled down (24-byte value + 8-byte scale, pages of 4 rows
 * padded to 144 bytes): attention reads each row back as the token's value ‖ scale; a format
 * that does not add up is an error, not a pool. */
static void paged_split_cases(void) {
    tierkit_kv_geometry kg = {.row_bytes = 32, .layers = 2, .page_rows = 4, .arena_pages = 16,
                              .hot_rows = 8, .tail_rows = 4, .row_format = TIERKIT_KV_FMT_PAGED_SPLIT,
                              .fmt_value_bytes = 24, .fmt_scale_bytes = 8, .fmt_page_bytes = 144};
    tierkit_kv_pool *pool = NULL, *bad = NULL;
    EXPECT("paged split: pool", tierkit_kv_pool_new(&kg, true, &pool, &err_), TIERKIT_OK, NULL);
    uint8_t hist[24 * 64];
    for (size_t i = 0; i < sizeof hist; i++) hist[i] = (uint8_t)(i * 13 + i / 64);
    EXPECT("paged split: admit", tierkit_kv_pool_admit(pool, 5, hist, sizeof hist, NULL, &err_), TIERKIT_OK, NULL);
    uint64_t sessions[1] = {5}, read = 0;
    int32_t qsl[2] = {0, 1}, seq[1] = {24}, topk[4] = {0, 7, 13, 23}, idx[4], valid[1];
    tierkit_kv_batch b = {sessions, 1, qsl, seq, topk, 1, 4, 4, NULL, 1, 0, 0};
    EXPECT("paged split: resolve layer 1", tierkit_kv_pool_resolve(pool, &b, idx, 4, valid, 1, NULL, &read, &err_),
           TIERKIT_OK, NULL);
    int exact = valid[0] == 4;
    for (int j = 0; j < 4 && exact; j++) {
        uint8_t row[40];
        uintptr_t len = 0;
        exact = tierkit_kv_pool_read_row(pool, 1, idx[j], row, sizeof row, &len, NULL) == TIERKIT_OK && len == 32 &&
                memcmp(row, hist + (size_t)topk[j] * 64 + 32, 32) == 0;
    }
    printf("%s paged split: rows read back as value + scale\n", exact ? "ok  " : "FAIL");
    exact ? passed++ : failed++;
    {
        const uint8_t *span = NULL;
        uintptr_t len = 0;
        uint8_t small[31];
        EXPECT("paged split: arena_row refuses a two-segment row",
               tierkit_kv_pool_arena_row(pool, 1, idx[0], &span, &len, &err_), TIERKIT_ERR_INVALID_ARGUMENT,
               "tierkit_kv_pool_read_row");
        EXPECT("paged split: read_row into a buffer below the row",
               tierkit_kv_pool_read_row(pool, 1, idx[0], small, sizeof small, &len, &err_),
               TIERKIT_ERR_INVALID_ARGUMENT, "cap 31");
        EXPECT("paged split: read_row of a row out of range",
               tierkit_kv_pool_read_row(pool, 1, 1 << 30, small, sizeof small, &len, &err_),
               TIERKIT_ERR_INVALID_ARGUMENT, "no arena row");
        /* A NULL len is refused before the copy: the caller's buffer stays as it was. */
        uint8_t untouched[32];
        memset(untouched, 0xAB, sizeof untouched);
        EXPECT("paged split: read_row with a NULL len",
               tierkit_kv_pool_read_row(pool, 1, idx[0], untouched, sizeof untouched, NULL, &err_),
               TIERKIT_ERR_NULL_ARGUMENT, "len");
        int kept = 1;
        for (size_t i = 0; i < sizeof untouched; i++) kept = kept && untouched[i] == 0xAB;
        printf("%s paged split: a refused read_row writes nothing\n", kept ? "ok  " : "FAIL");
        kept ? passed++ : failed++;
    }
    tierkit_kv_pool_end_read(pool, read, NULL);
    tierkit_kv_pool_free(pool);
    fit_budget_cases();
    kg.fmt_scale_bytes = 4;
    EXPECT("paged split: value + scale != row_bytes", tierkit_kv_pool_new(&kg, true, &bad, &err_),
           TIERKIT_ERR_INVALID_ARGUMENT, "value + scale");
    kg.row_format = 7;
    EXPECT("paged split: an unknown format", tierkit_kv_pool_new(&kg, true, &bad, &err_),
           TIERKIT_ERR_INVALID_ARGUMENT, "row_format");
}

int main(void) {
    tierkit_expert_geometry g = {2, 8, 2, 64};
    tierkit_expert_geometry bad_g = {2, 8, 9, 64};
    tierkit_residency_map *map = NULL;
    tierkit_pick_counters *counters = NULL;
    tierkit_controller *ctl = NULL;
    tierkit_executor *exec = NULL;

    EXPECT("geometry: hot above experts", tierkit_expert_geometry_validate(&bad_g, &err_),
           TIERKIT_ERR_INVALID_ARGUMENT, "hot_per_layer");
    EXPECT("geometry: NULL", tierkit_pick_counters_new(NULL, &counters, &err_),
           TIERKIT_ERR_NULL_ARGUMENT, "geometry");
    EXPECT("counters: new", tierkit_pick_counters_new(&g, &counters, &err_), TIERKIT_OK, NULL);
    EXPECT("map: new", tierkit_residency_map_first_k("m", &g, &map, &err_), TIERKIT_OK, NULL);
    EXPECT("map: NULL model", tierkit_residency_map_first_k(NULL, &g, &map, &err_),
           TIERKIT_ERR_NULL_ARGUMENT, "model");
    EXPECT("map: bad JSON", tierkit_residency_map_from_json("{", &g, &map, &err_),
           TIERKIT_ERR_INVALID_ARGUMENT, NULL);
    EXPECT("controller: unknown config field",
           tierkit_controller_new(map, "{\"drain_evry\": 4}", &ctl, &err_),
           TIERKIT_ERR_INVALID_ARGUMENT, "drain_evry");
    /* Both config shapes: the policy object, and the flat shape of older configs (policy a
     * name, its knobs at the top level); mixing them is refused, naming the new shape. */
    {
        tierkit_controller *shaped = NULL;
        EXPECT("controller: policy object",
               tierkit_controller_new(map, "{\"policy\": {\"kind\": \"ratio\", \"ratio\": 1.25}}",
                                      &shaped, &err_),
               TIERKIT_OK, NULL);
        tierkit_controller_free(shaped);
        shaped = NULL;
        EXPECT("controller: flat config shape",
               tierkit_controller_new(map, "{\"policy\": \"ratio\", \"ratio\": 1.25}", &shaped,
                                      &err_),
               TIERKIT_OK, NULL);
        tierkit_controller_free(shaped);
        shaped = NULL;
        EXPECT("controller: both config shapes at once",
               tierkit_controller_new(map, "{\"policy\": {\"kind\": \"ratio\"}, \"ratio\": 1.25}",
                                      &shaped, &err_),
               TIERKIT_ERR_INVALID_ARGUMENT, "\"kind\"");
        EXPECT("controller: a policy knob out of range",
               tierkit_controller_new(map, "{\"policy\": {\"kind\": \"ratio\", \"ratio\": 0.5}}",
                                      &shaped, &err_),
               TIERKIT_ERR_INVALID_ARGUMENT, "ratio");
    }
    EXPECT("controller: empty config string", tierkit_controller_new(map, " ", &ctl, &err_),
           TIERKIT_ERR_INVALID_ARGUMENT, "empty");
    EXPECT("controller: new", tierkit_controller_new(map, NULL, &ctl, &err_), TIERKIT_OK, NULL);
    EXPECT("executor: new", tierkit_executor_new_memory(map, 64, 1, &exec, &err_), TIERKIT_OK, NULL);

    /* Strided ids: 2 tokens, top-2, row stride 3; the third column is not read. */
    int32_t ids[6] = {1, 2, 99, 3, 4, -7};
    EXPECT("record: strided view", tierkit_pick_counters_record_layer(counters, 0, ids, 2, 2, 3, &err_),
           TIERKIT_OK, NULL);
    int32_t bad_ids[4] = {1, 2, 3, 8};
    EXPECT("record: expert out of range",
           tierkit_pick_counters_record_layer(counters, 0, bad_ids, 2, 2, 2, &err_),
           TIERKIT_ERR_INVALID_ARGUMENT, "[1, 1]");
    int32_t neg_ids[2] = {1, -1};
    EXPECT("record: negative id", tierkit_pick_counters_record_layer(counters, 0, neg_ids, 1, 2, 2, &err_),
           TIERKIT_ERR_INVALID_ARGUMENT, "-1");
    EXPECT("record: layer out of range", tierkit_pick_counters_record_layer(counters, 5, ids, 1, 2, 2, &err_),
           TIERKIT_ERR_INVALID_ARGUMENT, "layer 5");
    EXPECT("record: stride below k", tierkit_pick_counters_record_layer(counters, 0, ids, 2, 2, 1, &err_),
           TIERKIT_ERR_LAYOUT, "row_stride");
    EXPECT("record: NULL ids", tierkit_pick_counters_record_layer(counters, 0, NULL, 2, 2, 2, &err_),
           TIERKIT_ERR_NULL_ARGUMENT, "ids");
    EXPECT("record: NULL ids, no tokens", tierkit_pick_counters_record_layer(counters, 0, NULL, 0, 2, 2, &err_),
           TIERKIT_OK, NULL);
    int64_t wide[3] = {0, 0, 0};
    const int32_t *misaligned = (const int32_t *)((const char *)wide + 1);
    EXPECT("record: misaligned ids", tierkit_pick_counters_record_layer(counters, 0, misaligned, 1, 2, 2, &err_),
           TIERKIT_ERR_LAYOUT, "aligned");
    int64_t ids64[2] = {7, 1LL << 40};
    EXPECT("record i64: id above u32", tierkit_pick_counters_record_layer_i64(counters, 0, ids64, 1, 2, 2, &err_),
           TIERKIT_ERR_INVALID_ARGUMENT, "out of range");
    uint32_t snap[16];
    EXPECT("snapshot", tierkit_pick_counters_snapshot(counters, snap, 16, &err_), TIERKIT_OK, NULL);
    int counted = snap[1] == 1 && snap[2] == 1 && snap[3] == 1 && snap[4] == 1 && snap[7] == 0;
    printf("%s failed records counted nothing\n", counted ? "ok  " : "FAIL");
    counted ? passed++ : failed++;
    EXPECT("snapshot: short buffer", tierkit_pick_counters_snapshot(counters, snap, 3, &err_),
           TIERKIT_ERR_INVALID_ARGUMENT, "length");

    uint32_t hot[1];
    size_t n = 0;
    EXPECT("hot experts: capacity too small",
           tierkit_residency_map_hot_experts(map, 0, hot, 1, &n, &err_), TIERKIT_ERR_INVALID_ARGUMENT, "capacity");
    EXPECT("step: a map where a controller is expected",
           tierkit_controller_step((const tierkit_controller *)map, counters, exec, NULL, &err_),
           TIERKIT_ERR_INVALID_HANDLE, "tierkit_controller");
    EXPECT("step", tierkit_controller_step(ctl, counters, exec, NULL, &err_), TIERKIT_OK, NULL);

    /* KV: bad batches. */
    tierkit_kv_geometry kg;
    EXPECT("kv: budget too small", tierkit_kv_geometry_for_hbm_budget(100, 16, 2, 4, 8, 4, 0, &kg, &err_),
           TIERKIT_ERR_INVALID_ARGUMENT, "budget");
    EXPECT("kv: geometry", tierkit_kv_geometry_for_hbm_budget(16 * 4 * 32, 16, 2, 4, 8, 4, 0, &kg, &err_),
           TIERKIT_OK, NULL);
    tierkit_kv_pool *pool = NULL;
    EXPECT("kv: pool", tierkit_kv_pool_new(&kg, true, &pool, &err_), TIERKIT_OK, NULL);
    uint8_t hist[20 * 32];
    for (size_t i = 0; i < sizeof hist; i++) hist[i] = (uint8_t)(i / 32);
    EXPECT("kv: ragged history", tierkit_kv_pool_admit(pool, 7, hist, 33, NULL, &err_),
           TIERKIT_ERR_INVALID_ARGUMENT, "whole number");
    EXPECT("kv: admit", tierkit_kv_pool_admit(pool, 7, hist, sizeof hist, NULL, &err_), TIERKIT_OK, NULL);
    uint64_t sessions[1] = {7};
    int32_t qsl[2] = {0, 1}, seq[1] = {20}, topk[4] = {0, 5, 19, -1}, idx[4], valid[1];
    uint64_t read = 0;
    tierkit_kv_batch b = {sessions, 1, qsl, seq, topk, 1, 4, 4, NULL, 0, 0, 0};
    int32_t past[4] = {0, 20, -1, -1};
    tierkit_kv_batch b_past = b;
    b_past.topk = past;
    EXPECT("resolve: position past seq_len",
           tierkit_kv_pool_resolve(pool, &b_past, idx, 4, valid, 1, NULL, &read, &err_),
           TIERKIT_ERR_INVALID_ARGUMENT, "position 20");
    EXPECT("resolve: output too short", tierkit_kv_pool_resolve(pool, &b, idx, 3, valid, 1, NULL, &read, &err_),
           TIERKIT_ERR_INVALID_ARGUMENT, "indices");
    tierkit_kv_batch b_unknown = b;
    uint64_t other[1] = {8};
    b_unknown.sessions = other;
    EXPECT("resolve: unknown session",
           tierkit_kv_pool_resolve(pool, &b_unknown, idx, 4, valid, 1, NULL, &read, &err_),
           TIERKIT_ERR_INVALID_ARGUMENT, "unknown session 8");
    tierkit_kv_batch b_flags = b;
    b_flags.flags = 8;
    EXPECT("resolve: unknown flag", tierkit_kv_pool_resolve(pool, &b_flags, idx, 4, valid, 1, NULL, &read, &err_),
           TIERKIT_ERR_INVALID_ARGUMENT, "flags");
    tierkit_kv_batch b_blocks = b; /* one block id of 4 positions: below -1 is refused */
    int32_t bad_block[1] = {-2};
    b_blocks.topk = bad_block;
    b_blocks.k = b_blocks.topk_row_stride = 1;
    b_blocks.block_positions = 4;
    EXPECT("resolve: block id below -1",
           tierkit_kv_pool_resolve(pool, &b_blocks, idx, 4, valid, 1, NULL, &read, &err_),
           TIERKIT_ERR_INVALID_ARGUMENT, "position -2");
    bad_block[0] = 1; /* a valid block: 4 columns, 3 given */
    EXPECT("resolve: block outputs too short",
           tierkit_kv_pool_resolve(pool, &b_blocks, idx, 3, valid, 1, NULL, &read, &err_),
           TIERKIT_ERR_INVALID_ARGUMENT, "indices");
    b_blocks.block_positions = TIERKIT_KV_MAX_BLOCK_POSITIONS + 1; /* a slip, not a block size */
    EXPECT("resolve: block_positions past its bound",
           tierkit_kv_pool_resolve(pool, &b_blocks, idx, 4, valid, 1, NULL, &read, &err_),
           TIERKIT_ERR_INVALID_ARGUMENT, "block_positions = 65537 is out of range");
    /* Outputs sharing memory with each other or with an input: refused before any write (two
     * views of one byte, one mutable, inside Rust). */
    EXPECT("resolve: indices overlap valid_count",
           tierkit_kv_pool_resolve(pool, &b, idx, 4, idx + 3, 1, NULL, &read, &err_),
           TIERKIT_ERR_INVALID_ARGUMENT, "overlaps");
    EXPECT("resolve: indices overlap topk",
           tierkit_kv_pool_resolve(pool, &b, topk, 4, valid, 1, NULL, &read, &err_),
           TIERKIT_ERR_INVALID_ARGUMENT, "batch.topk");
    /* A NULL read pointer is refused before the read opens (it used to open one nobody could
     * end): read ids count up by one per opened read. */
    uint64_t first = 0, second = 0;
    EXPECT("resolve", tierkit_kv_pool_resolve(pool, &b, idx, 4, valid, 1, NULL, &first, &err_), TIERKIT_OK, NULL);
    tierkit_kv_pool_end_read(pool, first, NULL);
    EXPECT("resolve: NULL read", tierkit_kv_pool_resolve(pool, &b, idx, 4, valid, 1, NULL, NULL, &err_),
           TIERKIT_ERR_NULL_ARGUMENT, "read");
    EXPECT("resolve", tierkit_kv_pool_resolve(pool, &b, idx, 4, valid, 1, NULL, &second, &err_), TIERKIT_OK, NULL);
    tierkit_kv_pool_end_read(pool, second, NULL);
    printf("%s a refused resolve opened no read\n", second == first + 1 ? "ok  " : "FAIL");
    second == first + 1 ? passed++ : failed++;
    EXPECT("resolve", tierkit_kv_pool_resolve(pool, &b, idx, 4, valid, 1, NULL, &read, &err_), TIERKIT_OK, NULL);
    EXPECT("end read", tierkit_kv_pool_end_read(pool, read, &err_), TIERKIT_OK, NULL);
    EXPECT("end read twice", tierkit_kv_pool_end_read(pool, read, &err_), TIERKIT_ERR_INVALID_HANDLE, "not open");
    EXPECT("replay an ended read", tierkit_kv_pool_replay(pool, read, 1, &err_), TIERKIT_ERR_INVALID_HANDLE,
           "not open");

    /* Handles used after free, double free, a panic inside Rust. */
    tierkit_pick_counters_free(counters);
    EXPECT("counters used after free", tierkit_pick_counters_record_layer(counters, 0, ids, 1, 2, 2, &err_),
           TIERKIT_ERR_INVALID_HANDLE, "freed");
    tierkit_pick_counters_free(counters); /* double free: ignored */
    tierkit_kv_pool_free(pool);
    EXPECT("pool used after free", tierkit_kv_pool_finish(pool, 7, &err_), TIERKIT_ERR_INVALID_HANDLE, "freed");
    EXPECT("panic inside Rust", tierkit_test_panic(&err_), TIERKIT_ERR_PANIC, "test panic");
    EXPECT("still working after the panic", tierkit_controller_step(ctl, NULL, exec, NULL, &err_),
           TIERKIT_ERR_NULL_ARGUMENT, "counters");
    int code_alone = tierkit_expert_geometry_validate(&bad_g, NULL) == TIERKIT_ERR_INVALID_ARGUMENT;
    printf("%s no err argument: the code alone\n", code_alone ? "ok  " : "FAIL");
    code_alone ? passed++ : failed++;

    transfer_cases();
    out_of_memory_cases();

    /* GPU entry points: in every header; a build without CUDA refuses them with a code. */
    if (!tierkit_has_cuda()) {
        int32_t dev_ids[4] = {0, 1, 2, 3};
        uint32_t dev_counts[8] = {0}, dev_rejected = 0;
        EXPECT("count on a CPU build", tierkit_count_topk_cuda(0, NULL, dev_ids, TIERKIT_IDS_INT32, 2, 2, 2, 0,
                                                               dev_counts, 2, 4, &dev_rejected, NULL, &err_),
               TIERKIT_ERR_UNSUPPORTED, "without CUDA");
        EXPECT("slot ids on a CPU build",
               tierkit_expert_slot_ids_cuda(0, NULL, NULL, NULL, 8, 4, 0, 256, 3, &err_), TIERKIT_ERR_UNSUPPORTED,
               "without CUDA");
    }

    paged_split_cases();
    tierkit_executor_free(exec);
    tierkit_controller_free(ctl);
    tierkit_residency_map_free(map);
    printf("c-abi: %d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
