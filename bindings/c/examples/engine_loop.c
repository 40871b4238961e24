/* The CPU integrations of both tiers from C, as the Rust examples experts_engine_loop.rs and
 * kv_engine_loop.rs do them:
 *  1. experts: a toy router picks top-2 experts per token and layer (a strided view, as
 *     llama.cpp's ffn_moe_topk), the engine reads every picked expert through the in-memory
 *     executor, the picks are counted, and the controller swaps busier experts in at step
 *     boundaries; every move is verified lossless.
 *  2. KV: size a pool from an HBM budget (both layers one layer group: they share the picks),
 *     admit sessions, resolve each step's top-k picks (filling both layers), check every resolved
 *     row of both layers against the host copy, append the new token, finish a session, hand
 *     pages back between steps.
 *
 * Build (from the repository root, after `cargo build -p tierkit-c`):
 *   cc -std=c11 -Wall -Wextra -Werror -Ibindings/c/include bindings/c/examples/engine_loop.c \
 *      -Ltarget/debug -ltierkit_c -Wl,-rpath,target/debug -o target/engine_loop
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tierkit.h"

/* Aborts with the error's message when a call fails. */
static void ok(tierkit_code code, tierkit_error *err, const char *what) {
    if (code != TIERKIT_OK) {
        fprintf(stderr, "%s failed: code %d: %s\n", what, (int)code, tierkit_error_message(err));
        tierkit_error_free(err);
        exit(1);
    }
}
#define OK(call) do { tierkit_error *err_ = NULL; tierkit_code c_ = (call); ok(c_, err_, #call); } while (0)
/* `err_` is declared in OK's scope: every call below passes `&err_` as its last argument. */

enum { LAYERS = 4, EXPERTS = 16, HOT = 4, TOP_K = 2, TOKENS = 8, STRIDE = 3 };

/* A toy router: three picks in four go to 4 busy experts (0..4, then 8..12 from step 200). */
static void route(uint64_t step, uint64_t token, uint32_t layer, int32_t *row) {
    uint64_t h = ((step * 31 + token * 17 + layer * 7) * 0x9E3779B9ull) >> 7;
    uint64_t busy = step < 200 ? 0 : 8;
    for (uint64_t j = 0; j < TOP_K; j++) {
        uint64_t e = ((h >> (j * 5)) % 4 != 0) ? busy + (h >> (j * 3)) % 4 : (h >> (j * 7)) % EXPERTS;
        if (j == 1 && (int32_t)e == row[0]) e = (e + 1) % EXPERTS; /* top-k ids are distinct */
        row[j] = (int32_t)e;
    }
    row[TOP_K] = -1; /* the column past k is not part of the view */
}

static void experts_loop(void) {
    tierkit_expert_geometry g = {LAYERS, EXPERTS, HOT, 4096};
    tierkit_residency_map *boot = NULL, *now = NULL;
    tierkit_controller *ctl = NULL;
    tierkit_pick_counters *counters = NULL;
    tierkit_executor *exec = NULL;
    OK(tierkit_residency_map_first_k("toy-moe", &g, &boot, &err_));
    OK(tierkit_executor_new_memory(boot, 4096, 7, &exec, &err_));
    OK(tierkit_pick_counters_new(&g, &counters, &err_));
    /* The published ratio recipe at a fast cadence: the default cost-aware policy prices swaps by
       the geometry's expert bytes and would (rightly) not move these toy experts. */
    OK(tierkit_controller_new(boot, "{\"policy\": \"ratio\", \"adaptive\": null, \"drain_every\": 8, \"half_life_steps\": 32}", &ctl, &err_));
    int32_t ids[TOKENS][STRIDE];
    tierkit_step_report rep;
    for (uint64_t step = 0; step < 400; step++) {
        for (uint32_t layer = 0; layer < LAYERS; layer++) {
            for (uint64_t t = 0; t < TOKENS; t++) route(step, t, layer, ids[t]);
            for (int t = 0; t < TOKENS; t++)
                for (int j = 0; j < TOP_K; j++) {
                    const uint8_t *w = NULL;
                    size_t n = 0;
                    OK(tierkit_executor_read(exec, layer, (uint32_t)ids[t][j], &w, &n, &err_));
                    (void)w; /* the expert GEMM reads these n bytes */
                }
            OK(tierkit_pick_counters_record_layer(counters, layer, &ids[0][0], TOKENS, TOP_K, STRIDE, &err_));
        }
        OK(tierkit_controller_step(ctl, counters, exec, &rep, &err_));
        if (rep.drained && rep.drain % 6 == 0)
            printf("step %3llu: cold share %.3f over the window, %llu swaps applied so far\n",
                   (unsigned long long)rep.step, rep.cold_share_window,
                   (unsigned long long)rep.applied_total);
    }
    uint64_t moves = 0;
    OK(tierkit_controller_map(ctl, &now, &err_));
    OK(tierkit_executor_verify(exec, now, &moves, &err_));
    uint32_t hot[HOT];
    size_t n_hot = 0;
    OK(tierkit_residency_map_hot_experts(now, 0, hot, HOT, &n_hot, &err_));
    printf("%llu moves verified lossless; layer 0 hot set now [%u, %u, %u, %u]\n",
           (unsigned long long)moves, hot[0], hot[1], hot[2], hot[3]);
    if (moves == 0 || rep.applied_total == 0) {
        fprintf(stderr, "the controller never swapped\n");
        exit(1);
    }
    tierkit_residency_map_free(now);
    tierkit_controller_free(ctl);
    tierkit_pick_counters_free(counters);
    tierkit_executor_free(exec);
    tierkit_residency_map_free(boot);
}

enum { ROW = 64, KV_LAYERS = 2, K = 16, SESSIONS = 4 };

/* Token t of session s: every layer's row filled with a byte derived from (s, t, layer). */
static void token(uint64_t s, uint64_t t, uint8_t *out) {
    for (size_t i = 0; i < KV_LAYERS * ROW; i++) out[i] = (uint8_t)(s * 31 + t * 7 + i / ROW);
}

static void kv_loop(void) {
    tierkit_kv_geometry g;
    OK(tierkit_kv_geometry_for_hbm_budget(128 << 10, ROW, KV_LAYERS, 16, 32, 16, 0, &g, &err_));
    /* Both layers read the indexer's picks of layer 0: one layer group, so every resolve fetches
       its misses into both layers (the default, 0, is one group per layer: per-layer indexers). */
    g.group_layers = KV_LAYERS;
    tierkit_kv_pool *pool = NULL;
    OK(tierkit_kv_pool_new(&g, true, &pool, &err_));
    printf("arena: %u pages of %u rows\n", g.arena_pages, g.page_rows);
    uint64_t sessions[SESSIONS];
    int32_t len[SESSIONS];
    size_t live = SESSIONS;
    for (uint64_t s = 1; s <= SESSIONS; s++) {
        size_t n = 400 + 100 * s;
        uint8_t *hist = malloc(n * KV_LAYERS * ROW);
        for (size_t t = 0; t < n; t++) token(s, t, hist + t * KV_LAYERS * ROW);
        tierkit_kv_admission adm;
        OK(tierkit_kv_pool_admit(pool, s, hist, n * KV_LAYERS * ROW, &adm, &err_));
        free(hist);
        sessions[s - 1] = s;
        len[s - 1] = (int32_t)n;
    }
    uint64_t picks = 0, misses = 0;
    uint8_t want[KV_LAYERS * ROW];
    for (int step = 0; step < 64; step++) {
        int32_t qsl[SESSIONS + 1], topk[SESSIONS * K], indices[SESSIONS * K], valid[SESSIONS];
        for (size_t r = 0; r <= live; r++) qsl[r] = (int32_t)r;
        for (size_t r = 0; r < live; r++)
            for (int j = 0; j < K; j++) {
                int32_t p = len[r] - 1 - 3 * j * j;
                topk[r * K + j] = j + 1 == K ? -1 : (p < 0 ? 0 : p);
            }
        tierkit_kv_batch b = {sessions, live, qsl, len, topk, live, K, K, NULL, 0, 0, 0};
        tierkit_kv_stats st;
        uint64_t read = 0;
        OK(tierkit_kv_pool_resolve(pool, &b, indices, live * K, valid, live, &st, &read, &err_));
        for (size_t i = 0; i < live * K; i++) {
            if (topk[i] < 0) continue;
            token(sessions[i / K], (uint64_t)topk[i], want);
            for (uint32_t l = 0; l < KV_LAYERS; l++) {
                const uint8_t *row = NULL;
                size_t n = 0;
                OK(tierkit_kv_pool_arena_row(pool, l, indices[i], &row, &n, &err_));
                if (n != ROW || memcmp(row, want + l * ROW, ROW) != 0) {
                    fprintf(stderr, "row %d of layer %u is not the host bytes\n", indices[i], l);
                    exit(1);
                }
            }
        }
        picks += st.picks;
        misses += st.misses;
        OK(tierkit_kv_pool_end_read(pool, read, &err_)); /* attention is done */
        for (size_t r = 0; r < live; r++) {
            token(sessions[r], (uint64_t)len[r], want);
            OK(tierkit_kv_pool_append(pool, sessions[r], want, sizeof want, NULL, &err_));
            len[r]++;
        }
        if (step == 31) { /* session 1 finishes; its pages go back in chunks below */
            OK(tierkit_kv_pool_finish(pool, sessions[0], &err_));
            memmove(sessions, sessions + 1, (live - 1) * sizeof sessions[0]);
            memmove(len, len + 1, (live - 1) * sizeof len[0]);
            live--;
        }
        tierkit_kv_maintenance m;
        OK(tierkit_kv_pool_between_steps(pool, 8, &m, &err_));
        if (m.handed_back + m.grown > 0)
            printf("step %d: handed back %u pages, lent %u to sessions missing history\n", step,
                   m.handed_back, m.grown);
    }
    printf("%llu picks resolved exactly, %llu rows fetched from host (%.1f%%)\n",
           (unsigned long long)picks, (unsigned long long)misses, 100.0 * (double)misses / (double)picks);
    OK(tierkit_kv_pool_check_invariants(pool, &err_));
    tierkit_kv_pool_free(pool);
}

int main(void) {
    printf("tierkit %s: expert engine loop\n", tierkit_version());
    experts_loop();
    printf("KV engine loop\n");
    kv_loop();
    return 0;
}
