// tierkit: kv-elastic's fused resolve / dedup / fetch kernels and the candidate prefetch. Contract,
// layouts and the production engine's steps: cuda-kernels/DESIGN.md; structs, error words, stats row
// and limits: kv_abi.cuh; primitives: kv_device.cuh; CLOCK: kv_clock.cuh. Resolution order: tail ->
// scratch -> borrowed page -> hot cache -> miss; misses deduplicated per session in order of first
// appearance; CLOCK victims skip slots pinned by the current call; every output element written.
// The hot-cache tables passed are one layer group's ([groups][max_slots][..] on the host side).

// Resident row (scratch, tail, page) of a valid position, -1 if it must come from the hot cache.
// kind: 1 scratch, 2 tail, 3 page. `fp`: the slot's fixed pages.
__device__ __forceinline__ int kv_resident_at(const KvDims& d, const KvTables& t, unsigned int slot,
                                              const KvSlotDesc& s, unsigned int p, int* kind, const int* fp) {
    if (p >= s.committed) {
        *kind = 1;
        return kv_fixed_row_at(d, fp, d.hot_rows + d.tail_rows + (p - s.committed));
    }
    if (p >= s.tail_start) {
        *kind = 2;
        return kv_fixed_row_at(d, fp, d.hot_rows + p % d.tail_rows);
    }
    const unsigned int j = p / d.page_rows;
    if (j < d.max_pages) {
        const int pg = t.page_tab[(unsigned long long)slot * d.max_pages + j];
        if (pg >= 0) {
            *kind = 3;
            return pg * (int)d.page_rows + (int)(p % d.page_rows);
        }
    }
    *kind = 0;
    return -1;
}

// Claims: the smallest flat index of each missing position (first appearance), touches hits.
// Returns via the caller's loop; `f` is the flat index of the pick in the request.
__device__ __forceinline__ void kv_claim(const KvDims& d, const KvTables& t, unsigned int slot,
                                         const KvSlotDesc& s, int p, int limit, int f, unsigned long long call,
                                         unsigned int* bad) {
    if (p < 0 || p >= limit) {
        if (p != -1) *bad += 1u;
        return;
    }
    int kind;
    if (kv_resident_at(d, t, slot, s, (unsigned int)p, &kind, kv_slot_fixed(d, t, slot)) >= 0) return;
    const unsigned long long hb = (unsigned long long)slot * d.hot_rows;
    const unsigned long long pb = (unsigned long long)slot * d.max_history;
    const int hs = t.pos_slot[pb + p];
    if (hs >= 0) {
        kv_touch(t, hb + hs, call);
    } else {
        atomicMin(&t.first[pb + p], f);
    }
}

// Owner test for the ordered compaction: a valid missing pick holding its position's claim. The
// owner releases the claim (later duplicates then see KV_UNCLAIMED, which never equals their index).
__device__ __forceinline__ bool kv_owner(const KvDims& d, const KvTables& t, unsigned int slot, const KvSlotDesc& s,
                                         int p, int limit, int f) {
    if (p < 0 || p >= limit) return false;
    int kind;
    if (kv_resident_at(d, t, slot, s, (unsigned int)p, &kind, kv_slot_fixed(d, t, slot)) >= 0) return false;
    const unsigned long long pb = (unsigned long long)slot * d.max_history;
    if (t.pos_slot[pb + p] >= 0) return false;
    if (t.first[pb + p] != f) return false;
    t.first[pb + p] = KV_UNCLAIMED;
    return true;
}

// Rows r0 .. r1 of the outputs: every index -1, valid count 0.
__device__ void kv_fill_rows(const KvCall& c, unsigned int r0, unsigned int r1) {
    for (unsigned long long i = (unsigned long long)r0 * c.k + threadIdx.x; i < (unsigned long long)r1 * c.k;
         i += blockDim.x)
        c.indices[i] = -1;
    for (unsigned int r = r0 + threadIdx.x; r < r1; r += blockDim.x) c.valid_count[r] = 0;
}

// Padding of oversized output buffers: indices[rows * k .. idx_len) = -1, valid_count[rows .. valid_len) = 0,
// plan_count[sessions .. pc_len) = 0 (a replay of more sessions than this call's copies nothing stale).
__device__ void kv_fill_pad(const KvCall& c) {
    for (unsigned long long i = (unsigned long long)c.sessions + threadIdx.x; i < c.pc_len; i += blockDim.x)
        c.plan_count[i] = 0u;
    for (unsigned long long i = (unsigned long long)c.rows * c.k + threadIdx.x; i < c.idx_len; i += blockDim.x)
        c.indices[i] = -1;
    for (unsigned long long r = (unsigned long long)c.rows + threadIdx.x; r < c.valid_len; r += blockDim.x)
        c.valid_count[r] = 0;
}

// A malformed query_start_loc: every row -1, every plan count and stats row 0, one bad_qsl (block 0).
__device__ void kv_refuse_call(const KvTables& t, const KvCall& c) {
    const unsigned int r = blockIdx.x;
    for (unsigned int row = r; row < c.rows; row += gridDim.x) kv_fill_rows(c, row, row + 1);
    if (r < c.sessions && threadIdx.x == 0) c.plan_count[r] = 0u;
    if (r < c.sessions && threadIdx.x < KV_STATS) c.stats[r * KV_STATS + threadIdx.x] = 0u;
    if (r == 0 && threadIdx.x == 0) atomicAdd(&t.err[KV_ERR_BAD_QSL], 1u);
}

// A refused entry (bad or repeated slot, seq_len out of range): its rows -1, plan count and stats 0,
// one bad_session.
__device__ void kv_refuse_entry(const KvTables& t, const KvCall& c, unsigned int r, unsigned int row0,
                                unsigned int row1) {
    kv_fill_rows(c, row0, row1);
    if (threadIdx.x == 0) {
        c.plan_count[r] = 0u;
        atomicAdd(&t.err[KV_ERR_BAD_SESSION], 1u);
    }
    if (threadIdx.x < KV_STATS) c.stats[r * KV_STATS + threadIdx.x] = 0u;
}

// Causal bound of one query row: the entry's seq_len, or min(query_seq_lens[row], seq_len).
__device__ __forceinline__ int kv_row_limit(const int* qseq, unsigned int row, int limit) {
    return qseq ? min(qseq[row], limit) : limit;
}

// Pick j of query row `row` (the classic path): the position, or with block ids (c.block > 1) the
// position j % block of the row's block id j / block; -1 for a block's position at or beyond the row's
// bound `rl` (not invalid), an id < 0 as it is (-1 padding, < -1 invalid).
__device__ __forceinline__ int kv_pick(const KvCall& c, unsigned int row, unsigned int j, int rl) {
    if (c.block <= 1u) return c.topk[(unsigned long long)row * c.k + j];
    const int id = c.topk[(unsigned long long)row * c.topk_k + j / c.block];
    if (id < 0) return id;
    const long long p = (long long)id * c.block + j % c.block;
    return p >= rl ? -1 : (int)p;
}

// A lean thread's picks f0 .. f0 + n of the query rows from `row` on (-1 beyond n): positions as they
// are; block ids (c.block > 1) expanded, pick f standing for position (id of f / block) x block +
// f % block of the rows' ids, an id < 0 kept (-1 padding, < -1 invalid), a position past INT_MAX
// clamped to it (beyond every bound: the classification writes -1 for it, not invalid).
__device__ __forceinline__ void kv_load_entry_picks(const KvCall& c, const KvDiv& blk, unsigned int row,
                                                    unsigned int f0, int (&p)[KV_FAST_PER], unsigned int n) {
    if (c.block <= 1u) {
        kv_load_picks(c.topk + (unsigned long long)row * c.k + f0, p, n);
        return;
    }
    const int* const g = c.topk + (unsigned long long)row * c.topk_k;
    unsigned int q = kv_quo(blk, f0), b = f0 - q * blk.d;
#pragma unroll
    for (unsigned int i = 0; i < KV_FAST_PER; ++i) {
        const int id = i < n ? g[q] : -1;
        p[i] = id < 0 ? id : (int)min((long long)id * blk.d + b, 2147483647ll);
        if (++b == blk.d) b = 0u, ++q;
    }
}

// The production (lean) engine: see DESIGN.md, "The resolve engine". Entries over KV_FAST_PER x
// blockDim picks or KV_FAST_MAX_ROWS rows, and every entry of tierkit_kv_resolve, take the classic
// entry (same results). Dynamic shared memory: the victim bitmaps (2 x ceil(hot_rows / 32) u32), the
// entry's fixed pages (int32), the victim table (u16, hot_rows <= KV_LEAN_VICTIM_MAX).
#define KV_OUT_PENDING (-2)
#define KV_OUT_OWNER (-3)  // lean placement: an owner of rank r holds KV_OUT_OWNER - r until step G

// Adds one thread's (or warp's) pick counters to the block's (shared) counters.
__device__ __forceinline__ void kv_add_counts(unsigned int* sh_count, unsigned int c_tail, unsigned int c_scr,
                                              unsigned int c_page, unsigned int c_hot, unsigned int bad) {
    atomicAdd(&sh_count[KV_STAT_TAIL], c_tail);
    atomicAdd(&sh_count[KV_STAT_SCRATCH], c_scr);
    atomicAdd(&sh_count[KV_STAT_PAGE], c_page);
    atomicAdd(&sh_count[KV_STAT_HOT], c_hot);
    atomicAdd(&sh_count[KV_STAT_INVALID], bad);
}

// The one writer of an entry's stats row (KV_STAT_* in kv_abi.cuh), by one thread: the counts of
// the picks served by the tail, scratch, borrowed pages and hot cache, the misses placed, whether
// it took the direct path, and the invalid picks (also added to the bad_position error word).
__device__ __forceinline__ void kv_store_stats(const KvTables& t, unsigned int* st, unsigned int tail,
                                               unsigned int scratch, unsigned int page, unsigned int hot,
                                               unsigned int placed, bool direct, unsigned int bad) {
    st[KV_STAT_PICKS] = tail + scratch + page + hot;
    st[KV_STAT_TAIL] = tail;
    st[KV_STAT_SCRATCH] = scratch;
    st[KV_STAT_PAGE] = page;
    st[KV_STAT_HOT] = hot;
    st[KV_STAT_MISSES] = placed;
    st[KV_STAT_DIRECT] = direct ? 1u : 0u;
    st[KV_STAT_INVALID] = bad;
    if (bad) atomicAdd(&t.err[KV_ERR_BAD_POSITION], bad);
}

// Thread 0 of an entry's block: its stats row from the block's counters (sh_count[KV_STAT_TAIL ..
// KV_STAT_HOT], [KV_STAT_INVALID]).
__device__ __forceinline__ void kv_write_stats(const KvTables& t, unsigned int* st, const unsigned int* sh_count,
                                               unsigned int taken, bool direct) {
    kv_store_stats(t, st, sh_count[KV_STAT_TAIL], sh_count[KV_STAT_SCRATCH], sh_count[KV_STAT_PAGE],
                   sh_count[KV_STAT_HOT], taken, direct, sh_count[KV_STAT_INVALID]);
}

// Packed outputs, step 1 (before a barrier): ranks the thread's valid outputs across the entry (one
// block scan; thread order is flat order) and records each row's first rank in sh_rows[rr],
// sh_rows[R] = the total. Returns the rank of the thread's first valid output.
__device__ __forceinline__ unsigned int kv_rank_valid(const int (&out)[KV_FAST_PER], unsigned int f0, unsigned int fe,
                                                      unsigned int k, unsigned int R, unsigned int* warp_sums,
                                                      unsigned int* sh_rows) {
    unsigned int nv = 0;
#pragma unroll
    for (unsigned int i = 0; i < KV_FAST_PER; ++i) nv += (f0 + i < fe && out[i] >= 0) ? 1u : 0u;
    unsigned int total;
    const unsigned int rank = kv_block_scan_u32(nv, &total, warp_sums);
    unsigned int loc = 0;
#pragma unroll
    for (unsigned int i = 0; i < KV_FAST_PER; ++i) {
        const unsigned int f = f0 + i;
        if (f < fe && f % k == 0u) sh_rows[f / k] = rank + loc;
        loc += (f < fe && out[i] >= 0) ? 1u : 0u;
    }
    if (threadIdx.x == 0) sh_rows[R] = total;
    return rank;
}

// Packed outputs, step 2 (after the barrier): valid entries at the front of their rows in column
// order, -1 after them. `base`: the entry's first row.
__device__ __forceinline__ void kv_write_packed(const int (&out)[KV_FAST_PER], unsigned int f0, unsigned int fe,
                                                unsigned int k, unsigned int R, unsigned int rank,
                                                const unsigned int* sh_rows, int* base) {
    unsigned int loc = 0;
#pragma unroll
    for (unsigned int i = 0; i < KV_FAST_PER; ++i) {
        const unsigned int f = f0 + i;
        if (f >= fe) continue;
        const unsigned int rr = f / k;
        if (out[i] >= 0) base[(unsigned long long)rr * k + rank + loc - sh_rows[rr]] = out[i];
        loc += out[i] >= 0 ? 1u : 0u;
    }
    for (unsigned int rr = 0; rr < R; ++rr) {
        int* const orow = base + (unsigned long long)rr * k;
        for (unsigned int j = sh_rows[rr + 1] - sh_rows[rr] + threadIdx.x; j < k; j += blockDim.x) orow[j] = -1;
    }
}

// Steps C-G of a lean entry: after the block barrier that follows the claims, orders the first
// appearances (the plan's positions), picks CLOCK victims with the whole block (installing them as
// it finds them), does the sweep bookkeeping and gives each pending pick (KV_OUT_PENDING) its placed
// row or -1 (unserved). Returns the distinct misses and placed rows; adds placed picks to *c_hot.
// `p`, `out`: the thread's picks and outputs (e.f0 + i: flat index in the entry).
__device__ __forceinline__ void kv_lean_place(const KvDims& d, const KvTables& t, const KvEntry& e,
                                              const int (&p)[KV_FAST_PER], int (&out)[KV_FAST_PER],
                                              const KvShared& sh, unsigned int* misses_out,
                                              unsigned int* taken_out, unsigned int* c_hot) {
    const unsigned long long pb = (unsigned long long)e.slot * d.max_history;
    KvCopy* __restrict__ const plan = e.plan;
    unsigned int misses = 0;
    // C. owners of the first appearances, ordered by one block scan (each thread's picks are
    //    consecutive, so thread order is flat order); owners release their claims. The victim
    //    candidate bitmaps are built while the claims' loads are in flight (the candidate state
    //    includes this call's pins, all made before the caller's barrier, and nothing before the
    //    victim search changes it); the barriers of the scan below publish them.
    int fr[KV_FAST_PER];
#pragma unroll
    for (unsigned int i = 0; i < KV_FAST_PER; ++i) fr[i] = out[i] == KV_OUT_PENDING ? t.first[pb + p[i]] : -1;
    kv_victim_bits(d, t, e.slot, e.call, sh.bits);
    bool own[KV_FAST_PER];
    unsigned int cnt = 0;
#pragma unroll
    for (unsigned int i = 0; i < KV_FAST_PER; ++i) {
        own[i] = out[i] == KV_OUT_PENDING && fr[i] == (int)(e.f0 + i);
        cnt += own[i];
    }
#pragma unroll
    for (unsigned int i = 0; i < KV_FAST_PER; ++i)
        if (own[i]) t.first[pb + p[i]] = KV_UNCLAIMED;
    unsigned int at = kv_block_scan_u32(cnt, &misses, sh.warp_sums);
    // With a victim table (hot_rows <= KV_LEAN_VICTIM_MAX): the victim slot of each rank in shared
    // memory (u16, after the fixed pages), and each owner's rank kept in its output as
    // KV_OUT_OWNER - rank, so that step G reads no global memory for owners.
    const bool vt = d.hot_rows <= KV_LEAN_VICTIM_MAX;
#pragma unroll
    for (unsigned int i = 0; i < KV_FAST_PER; ++i) {
        if (!own[i]) continue;
        if (at < d.hot_rows) plan[at].position = (unsigned int)p[i];
        if (vt) out[i] = KV_OUT_OWNER - (int)at;
        ++at;
    }
    const unsigned int want = min(misses, d.hot_rows);
    __syncthreads();
    // D. victims (whole block) and E. installs, together
    if (want > 0u)
        kv_pick_victims_block(d, t, e, plan, want, sh, vt ? kv_victim_table(d) : nullptr);
    else if (threadIdx.x == 0) {
        *sh.taken = 0u;
        *sh.last = -1;
    }
    __syncthreads();
    const unsigned int taken = *sh.taken;
    // G. rows of the misses: placed (fetched later) or -1 (overflow, unserved). These loads are
    // issued before the sweep (which writes only reference marks and the hand, never the position
    // table) so that they overlap its stores; no barrier after the sweep: nothing later in the
    // block reads what it writes or writes what it reads. An owner of rank `r` holds the victim of
    // that rank, vt[r], if placed (r < taken), else nothing (-1): what the position table holds for
    // it after the installs.
    int h[KV_FAST_PER];
#pragma unroll
    for (unsigned int i = 0; i < KV_FAST_PER; ++i) {
        h[i] = -1;
        if (out[i] == KV_OUT_PENDING) {
            h[i] = t.pos_slot[pb + p[i]];
        } else if (out[i] <= KV_OUT_OWNER) {
            const unsigned int r = (unsigned int)(KV_OUT_OWNER - out[i]);
            h[i] = r < taken ? (int)kv_victim_table(d)[r] : -1;
            out[i] = KV_OUT_PENDING;
        }
    }
    // F. sweep bookkeeping
    if (misses > 0u) kv_finish_sweep_bits(d, t, e.slot, e.call, misses, taken, *sh.last, e.hand, sh.bits);
#pragma unroll
    for (unsigned int i = 0; i < KV_FAST_PER; ++i) {
        if (out[i] != KV_OUT_PENDING) continue;
        out[i] = h[i] >= 0 ? kv_fixed_row_at(d, sh.fp, (unsigned int)h[i]) : -1;
        *c_hot += h[i] >= 0;
    }
    *misses_out = misses;
    *taken_out = taken;
}

// One entry of the classic path (slot validated, not shared with another entry of the call): three
// passes over the picks (claim, ordered compaction, output), victims by warp 0. The fallback of the
// lean kernels for entries over KV_FAST_PER x blockDim picks or KV_FAST_MAX_ROWS rows (speculative
// steps with many rows of a large top-k), and every entry of the classic kernel (tables over the
// lean kernels' shared-memory limits). Uses sh.warp_sums, count, taken, last.
__device__ __forceinline__ void kv_entry_classic(const KvDims& d, const KvTables& t, const KvCall& c, const KvEntry& e,
                                 const KvShared& sh) {
    const int* __restrict__ const qseq = c.qseq;
    const unsigned int k = c.k, slot = e.slot, row0 = e.row0, row1 = e.row0 + e.R;
    const KvSlotDesc& s = e.s;
    const int limit = e.limit;
    KvCopy* __restrict__ const plan = e.plan;
    unsigned int bad = 0, misses = 0, taken = 0;
    if (s.full == 0u) {  // else the direct path: the whole history is resident, nothing to place
        // 1. touch hits, claim misses
        for (unsigned int row = row0; row < row1; ++row) {
            const int rl = kv_row_limit(qseq, row, limit);
            for (unsigned int j = threadIdx.x; j < k; j += blockDim.x)
                kv_claim(d, t, slot, s, kv_pick(c, row, j, rl), rl, (int)((row - row0) * k + j),
                         e.call, &bad);
        }
        __syncthreads();
        // 2. ordered compaction of first appearances
        for (unsigned int row = row0; row < row1; ++row) {
            const int rl = kv_row_limit(qseq, row, limit);
            for (unsigned int j0 = 0; j0 < k; j0 += blockDim.x) {
                const unsigned int j = j0 + threadIdx.x;
                const int f = (int)((row - row0) * k + j);
                const int p = j < k ? kv_pick(c, row, j, rl) : -1;
                const bool own = j < k && kv_owner(d, t, slot, s, p, rl, f);
                unsigned int total;
                const unsigned int at = misses + kv_block_scan_u32(own ? 1u : 0u, &total, sh.warp_sums);
                if (own && at < d.hot_rows) plan[at].position = (unsigned int)p;
                misses += total;
            }
        }
        // 3. victims (warp 0), 4. installs, 5. sweep bookkeeping, 6. fetch from mapped host memory
        taken = kv_place_warp(d, t, slot, e.call, plan, misses, sh.taken, sh.last);
        __syncthreads();
        if (c.fetch) kv_fetch(d, t, plan, taken, c.layer, c.fetch);
    } else {
        // Direct path: only the invalid picks need counting (the output pass skips them).
        for (unsigned int row = row0; row < row1; ++row) {
            const int rl = kv_row_limit(qseq, row, limit);
            for (unsigned int j = threadIdx.x; j < k; j += blockDim.x) {
                const int p = kv_pick(c, row, j, rl);
                bad += (p < -1 || (p >= 0 && p >= rl)) ? 1u : 0u;
            }
        }
    }
    if (threadIdx.x == 0) {
        *e.plan_count = taken;
        if (taken < misses) atomicAdd(&t.err[KV_ERR_OVERFLOW], misses - taken);
    }
    // 7. outputs, every element written
    unsigned int c_tail = 0, c_scr = 0, c_page = 0, c_hot = 0;
    for (unsigned int row = row0; row < row1; ++row) {
        const int rl = kv_row_limit(qseq, row, limit);
        int* const orow = c.indices + (unsigned long long)row * k;
        unsigned int valid = 0;
        for (unsigned int j0 = 0; j0 < k; j0 += blockDim.x) {
            const unsigned int j = j0 + threadIdx.x;
            int out = -1;
            if (j < k) {
                const int p = kv_pick(c, row, j, rl);
                if (p >= 0 && p < rl) {
                    int kind;
                    out = kv_resident_at(d, t, slot, s, (unsigned int)p, &kind, kv_slot_fixed(d, t, slot));
                    if (out < 0) {
                        const int hs = t.pos_slot[(unsigned long long)slot * d.max_history + p];
                        if (hs >= 0) {
                            out = kv_fixed_row(d, t, slot, (unsigned int)hs);
                            c_hot++;
                        }
                    } else {
                        c_scr += kind == 1;
                        c_tail += kind == 2;
                        c_page += kind == 3;
                    }
                }
            }
            if (c.layout == KV_LAYOUT_PACKED) {  // valid entries at the front in column order
                unsigned int total;
                const unsigned int at = kv_block_scan_u32(out >= 0 ? 1u : 0u, &total, sh.warp_sums);
                if (out >= 0) orow[valid + at] = out;
                valid += total;
            } else {
                if (j < k) orow[j] = out;
                valid += (unsigned int)__syncthreads_count(out >= 0);
            }
        }
        if (c.layout == KV_LAYOUT_PACKED)  // -1 after the valid entries
            for (unsigned int j = valid + threadIdx.x; j < k; j += blockDim.x) orow[j] = -1;
        if (threadIdx.x == 0) c.valid_count[row] = (int)valid;
    }
    kv_add_counts(sh.count, c_tail, c_scr, c_page, c_hot, bad);
    __syncthreads();
    if (threadIdx.x == 0) kv_write_stats(t, e.stats, sh.count, taken, s.full != 0u && misses == 0u);
}

// The fused resolve kernels take (KvDims, KvTables, KvCall, KvDivs) by value (kv_abi.cuh documents the
// call's buffers). Grid: sessions + 1 blocks (block `sessions` writes the rows no entry owns and the
// padding of oversized buffers).
#define KV_RESOLVE_PARAMS KvDims d, KvTables t, KvCall c, KvDivs dv
#define KV_RESOLVE_ARGS d, t, c, dv

#define KV_NO_BOUND 0x7fffffff

// Per-warp partials of the lean engine, written before the validating barrier by lane 0 of every
// warp (no initialisation needed: each warp writes its own words): two u32 per warp, four 8-bit
// counts each (a warp holds at most 32 × KV_FAST_PER = 128 picks, so no field overflows):
// word 0 = valid outputs | tail << 8 | scratch << 16 | page << 24,
// word 1 = hot | bad << 8 | missed picks << 16 | slow lanes << 24 (slow: the warp's picks span two
// rows, or a fixed row could be negative or lie outside the slot's fixed rows).
#define KV_LEAN_PARTS 2
static_assert(32 * KV_FAST_PER < 256, "a warp's counts must fit the partials' 8-bit fields");

// Classes of a lean pick (3 bits per pick in a thread's class word), decided before the validating
// barrier from the speculative reads; the pick's value v beside it: the fixed local row (scratch,
// tail), the output row (page), the hot slot (hot), the position (miss).
#define KV_PICK_NONE 0u  // beyond the entry, -1, or a direct-path position found nowhere (-1 out)
#define KV_PICK_BAD 1u
#define KV_PICK_SCRATCH 2u
#define KV_PICK_TAIL 3u
#define KV_PICK_HOT 4u   // scratch, tail and hot are consecutive: the fixed-row classes
#define KV_PICK_PAGE 5u
#define KV_PICK_MISS 6u

// The lean engine's classification and preview (before the validating barrier, no side effect):
// classifies the thread's picks as steps A + B of the fast engine do (tail -> scratch -> page -> hot
// -> miss) into *cls (3 bits per pick) and v, and folds the counts and flags into the warp's
// partials. Valid outputs are counted by class: a tail, scratch or hot row is a fixed row
// (non-negative when no lane is slow, which the fixed-page loader checks), a page row is v itself.
// lk.pj: each pick's page (its page-table index, read in trip 2). Returns whether the warp has a
// pick of a fixed-row class (warp-uniform); *missed: whether it has a missed pick. All lanes call it.
__device__ __forceinline__ bool kv_lean_classify(const KvDims& d, const KvDivs& dv, const KvEntry& e,
                                                 const KvLookups& lk, bool slow, unsigned int* part,
                                                 unsigned int* cls, int (&v)[KV_FAST_PER], bool* missed) {
    const KvSlotDesc& s = e.s;
    const int(&p)[KV_FAST_PER] = lk.p;
    const bool full = s.full != 0u;
    unsigned int w0 = 0u, w1 = 0u, c = 0u;
#pragma unroll
    for (unsigned int i = 0; i < KV_FAST_PER; ++i) {
        v[i] = -1;
        // Picks past the thread's share were loaded as -1 (kv_load_picks), so -1 covers them.
        if (e.f0 + i >= e.fe || p[i] == -1) continue;
        if (p[i] < 0 || p[i] >= min(lk.rl[i], e.limit)) {
            if (p[i] >= 0 && dv.blk.d > 1u) continue;  // a block's position past the bound: -1, not invalid
            c |= KV_PICK_BAD << (3u * i);
            w1 += 1u << 8;
            continue;
        }
        const unsigned int q = (unsigned int)p[i];
        // The common class first: a borrowed page serves q only below the tail (tail_start <=
        // committed), so testing it before scratch and tail decides the same class.
        if (q < s.tail_start && lk.pg[i] >= 0) {
            c |= KV_PICK_PAGE << (3u * i);
            v[i] = lk.pg[i] * (int)d.page_rows + (int)(q - lk.pj[i] * d.page_rows);  // pj: q's page (trip 2)
            w0 += (1u << 24) + (v[i] >= 0 ? 1u : 0u);
        } else if (q >= s.committed) {
            c |= KV_PICK_SCRATCH << (3u * i);
            v[i] = (int)(d.hot_rows + d.tail_rows + (q - s.committed));
            w0 += 1u + (1u << 16);
            slow |= q - s.committed >= d.scratch_rows;
        } else if (q >= s.tail_start) {
            c |= KV_PICK_TAIL << (3u * i);
            v[i] = (int)(d.hot_rows + kv_rem(dv.tail, q));
            w0 += 1u + (1u << 8);
        } else if (lk.hs[i] >= 0) {
            c |= KV_PICK_HOT << (3u * i);
            v[i] = lk.hs[i];
            w0 += 1u;
            w1 += 1u;
            slow |= (unsigned int)lk.hs[i] >= d.hot_rows;
        } else if (!full) {
            c |= KV_PICK_MISS << (3u * i);
            v[i] = p[i];
            w1 += 1u << 16;
        }
    }
    *cls = c;
    const unsigned int a = (threadIdx.x & ~31u) * e.per, b = min(a + 32u * e.per, e.F);
    slow |= a < b && kv_quo(dv.k, a) != kv_quo(dv.k, b - 1u);
    w1 += slow ? 1u << 24 : 0u;
    w0 = kv_warp_sum(w0);
    w1 = kv_warp_sum(w1);
    if ((threadIdx.x & 31u) == 0u) {
        part[(threadIdx.x >> 5) * KV_LEAN_PARTS] = w0;
        part[(threadIdx.x >> 5) * KV_LEAN_PARTS + 1u] = w1;
    }
    *missed = ((w1 >> 16) & 0xffu) != 0u;
    return ((w0 >> 8) & 0xffffu) != 0u || (w1 & 0xffu) != 0u;  // the warp has a tail, scratch or hot pick
}

// After the validating barrier: whether no warp of the block raised a preview flag (block-uniform).
__device__ __forceinline__ bool kv_lean_quiet(const unsigned int* part) {
    const unsigned int lane = threadIdx.x & 31u;
    return !__any_sync(0xffffffffu, lane < (blockDim.x >> 5) && (part[lane * KV_LEAN_PARTS + 1u] >> 16) != 0u);
}

// The block's tail, scratch, page, hot and bad counts from the preview's partials, summed by one warp
// (all its lanes call it; `has`: the warp of this lane's index holds picks; every warp wrote partials):
// c[0 .. 5) in every lane, unpacked per lane first (a block's sums exceed 8 bits).
__device__ __forceinline__ void kv_lean_part_sums(const unsigned int* part, bool has, unsigned int (&c)[5]) {
    const unsigned int lane = threadIdx.x & 31u;
    const unsigned int a = has ? part[lane * KV_LEAN_PARTS] : 0u, b = has ? part[lane * KV_LEAN_PARTS + 1u] : 0u;
    c[0] = kv_warp_sum((a >> 8) & 0xffu);   // tail
    c[1] = kv_warp_sum((a >> 16) & 0xffu);  // scratch
    c[2] = kv_warp_sum(a >> 24);            // page
    c[3] = kv_warp_sum(b & 0xffu);          // hot
    c[4] = kv_warp_sum((b >> 8) & 0xffu);   // bad
}

// The preview's counts into the block's shared counters (sh_count[1 .. 5), [7]; one shared add each
// by the last warp), for an entry that finishes through kv_write_stats.
__device__ __forceinline__ void kv_lean_stat_counts(const unsigned int* part, unsigned int per, unsigned int F,
                                                    unsigned int* sh_count) {
    const unsigned int lane = threadIdx.x & 31u, nw = blockDim.x >> 5;
    if ((threadIdx.x >> 5) == nw - 1u) {
        unsigned int c[5];
        kv_lean_part_sums(part, lane < nw && lane * 32u * per < F, c);
        if (lane == 0u) kv_add_counts(sh_count, c[0], c[1], c[2], c[3], c[4]);
    }
}

// The quiet finish of a lean in-place entry (no miss, every warp within one row): valid counts and
// the stats row from the preview's partials, no block barrier. Warp w sums rows w, w + nw, ...; the
// last warp writes the stats row and the bad positions.
__device__ __forceinline__ void kv_lean_counts(const KvTables& t, const KvDivs& dv, const KvCall& c,
                                               const KvEntry& e, const unsigned int* part) {
    const unsigned int per = e.per, F = e.F, R = e.R, row0 = e.row0;
    const KvDiv& k = dv.k;
    int* __restrict__ const valid_count = c.valid_count;
    const unsigned int lane = threadIdx.x & 31u, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const unsigned int wp = 32u * per;
    const bool has = lane < nw && lane * wp < F;
    for (unsigned int row = warp; row < R; row += nw) {
        const unsigned int v =
            kv_warp_sum(has && kv_quo(k, lane * wp) == row ? part[lane * KV_LEAN_PARTS] & 0xffu : 0u);
        if (lane == 0u) valid_count[row0 + row] = (int)v;
    }
    if (warp == nw - 1u) {
        unsigned int n[5];  // tail, scratch, page, hot, bad
        kv_lean_part_sums(part, has, n);
        if (lane == 0u) {
            *e.plan_count = 0u;
            kv_store_stats(t, e.stats, n[0], n[1], n[2], n[3], 0u, e.s.full != 0u, n[4]);
        }
    }
}

// Step A + B of a lean entry from the preview's classes (its counts are in the partials): a page
// pick's output is v itself, a scratch, tail or hot pick's the fixed row of v (looked up only in
// warps that have one: `fixed_any`, warp-uniform), anything else -1 (a missed pick too: the caller
// claims it); hot hits are touched (pinned) unless the slot is full (block-uniform).
__device__ __forceinline__ void kv_lean_outputs(const KvDiv& pr, const KvTables& t, unsigned long long hb, bool full,
                                                bool fixed_any, unsigned int cls, const int (&v)[KV_FAST_PER],
                                                unsigned long long call, const int* fp, int (&out)[KV_FAST_PER]) {
#pragma unroll
    for (unsigned int i = 0; i < KV_FAST_PER; ++i) out[i] = ((cls >> (3u * i)) & 7u) == KV_PICK_PAGE ? v[i] : -1;
    if (fixed_any) {
#pragma unroll
        for (unsigned int i = 0; i < KV_FAST_PER; ++i)
            if (((cls >> (3u * i)) & 7u) - KV_PICK_SCRATCH <= KV_PICK_HOT - KV_PICK_SCRATCH)
                out[i] = kv_fixed_row_fd(pr, fp, (unsigned int)v[i]);
    }
    if (!full) {
#pragma unroll
        for (unsigned int i = 0; i < KV_FAST_PER; ++i)
            if (((cls >> (3u * i)) & 7u) == KV_PICK_HOT) kv_touch(t, hb + (unsigned int)v[i], call);
    }
}

// A quiet lean entry (the preview saw no miss and no flagged warp; in-place layout): steps A + B,
// one store per thread (unless the warp stored its outputs early), the counts from the preview's
// partials; no barrier.
__device__ __forceinline__ void kv_entry_lean_quiet(const KvDims& d, const KvDivs& dv, const KvTables& t,
                                                    const KvCall& c, const KvEntry& e, const KvShared& sh,
                                                    bool fixed_any, unsigned int cls, const int (&v)[KV_FAST_PER],
                                                    bool early) {
    if (!early) {
        int out[KV_FAST_PER];
        kv_lean_outputs(dv.page, t, (unsigned long long)e.slot * d.hot_rows, e.s.full != 0u, fixed_any, cls, v,
                        e.call, sh.fp, out);
        kv_store_picks(c.indices + (unsigned long long)e.row0 * c.k + e.f0, out, e.fe > e.f0 ? e.fe - e.f0 : 0u);
    }
    kv_lean_counts(t, dv, c, e, sh.part);
}

// One entry of the lean engine, after the validating barrier, when the quiet finish does not apply
// (a miss, the packed layout, or a flagged warp): steps A + B from the preview's classes
// (kv_lean_outputs; missed picks claimed on the slot's `first` table), C-G when something missed,
// then the outputs, valid counts and stats. cls, v: the preview's classes and values; fp: the
// slot's fixed pages (shared); part: the preview's per-warp partials, whose tail, scratch, page,
// hot and bad counts, plus the picks placed by C-G, make the stats row.
__device__ __forceinline__ void kv_entry_lean(const KvDims& d, const KvDivs& dv, const KvTables& t, const KvCall& c,
                                              const KvEntry& e, const KvShared& sh, bool fixed_any, unsigned int cls,
                                              const int (&v)[KV_FAST_PER]) {
    const unsigned int slot = e.slot, f0 = e.f0, fe = e.fe, per = e.per, F = e.F, R = e.R, row0 = e.row0;
    const unsigned int k = c.k;
    const bool full = e.s.full != 0u;
    unsigned int* const sh_rows = sh.rows;
    unsigned int* const sh_count = sh.count;
    int out[KV_FAST_PER];
    kv_lean_outputs(dv.page, t, (unsigned long long)slot * d.hot_rows, full, fixed_any, cls, v, e.call, sh.fp, out);
    // B. claims: each missed pick bids its flat index for its position's first appearance.
    const unsigned long long pb = (unsigned long long)slot * d.max_history;
    bool miss = false;
#pragma unroll
    for (unsigned int i = 0; i < KV_FAST_PER; ++i) {
        if (((cls >> (3u * i)) & 7u) != KV_PICK_MISS) continue;
        out[i] = KV_OUT_PENDING;
        atomicMin(&t.first[pb + v[i]], (int)(f0 + i));
        miss = true;
    }
    unsigned int c_hot = 0;  // picks placed by C-G (hot hits from this call's installs)
    // C-G only when some pick of the entry missed (`full` is block-uniform).
    unsigned int misses = 0, taken = 0;
    if (!full && __syncthreads_or(miss)) kv_lean_place(d, t, e, v, out, sh, &misses, &taken, &c_hot);
    // H. outputs. Packed: one scan ranks the valid entries; in place: per-row shared counters.
    const bool packed = c.layout == KV_LAYOUT_PACKED;
    int* const base = c.indices + (unsigned long long)row0 * k;
    unsigned int rank = 0;
    if (packed) {
        rank = kv_rank_valid(out, f0, fe, k, R, sh.warp_sums, sh_rows);
    } else {
#pragma unroll
        for (unsigned int i = 0; i < KV_FAST_PER; ++i)
            if (f0 + i < fe) base[f0 + i] = out[i];
        // The warp's picks f in [w0, w1): one row -> one warp sum, else per-pick adds (warp-uniform test).
        const unsigned int w0 = (threadIdx.x & ~31u) * per, w1 = min(w0 + 32u * per, F);
        if (w0 < w1 && kv_quo(dv.k, w0) == kv_quo(dv.k, w1 - 1u)) {
            unsigned int v = 0;
#pragma unroll
            for (unsigned int i = 0; i < KV_FAST_PER; ++i) v += (f0 + i < fe && out[i] >= 0) ? 1u : 0u;
            v = kv_warp_sum(v);
            if ((threadIdx.x & 31u) == 0u && v) atomicAdd(&sh_rows[kv_quo(dv.k, w0)], v);
        } else {
#pragma unroll
            for (unsigned int i = 0; i < KV_FAST_PER; ++i)
                if (f0 + i < fe && out[i] >= 0) atomicAdd(&sh_rows[kv_quo(dv.k, f0 + i)], 1u);
        }
    }
    // Stats: the preview's counts (the last warp sums the partials; sh_count was zeroed before the
    // validating barrier) plus the placed picks (one shared add per warp).
    kv_lean_stat_counts(sh.part, per, F, sh_count);
    c_hot = kv_warp_sum(c_hot);
    if ((threadIdx.x & 31u) == 0u && c_hot) atomicAdd(&sh_count[KV_STAT_HOT], c_hot);
    __syncthreads();
    if (packed) kv_write_packed(out, f0, fe, k, R, rank, sh_rows, base);
    if (threadIdx.x < R)
        c.valid_count[row0 + threadIdx.x] =
            (int)(packed ? sh_rows[threadIdx.x + 1] - sh_rows[threadIdx.x] : sh_rows[threadIdx.x]);
    // The copy last: the outputs above are plain stores that need nothing from it.
    if (c.fetch && taken > 0u) kv_fetch(d, t, e.plan, taken, c.layer, c.fetch);
    if (threadIdx.x == 0) {
        *e.plan_count = taken;
        if (taken < misses) atomicAdd(&t.err[KV_ERR_OVERFLOW], misses - taken);
        kv_write_stats(t, e.stats, sh_count, taken, full && misses == 0u);
    }
}

// CLASSIC: every entry through kv_entry_classic and no dynamic shared memory (`tierkit_kv_resolve`,
// for tables over the lean kernels' shared-memory limits: KV_LEAN_MAX_HOT_ROWS, _MAX_FIXED_PAGES).
template <bool CLASSIC>
__device__ __forceinline__ void kv_resolve_lean_body(KV_RESOLVE_PARAMS) {
    const int *__restrict__ const qsl = c.qsl, *__restrict__ const qseq = c.qseq;
    const int *__restrict__ const seq_lens = c.seq_lens, *__restrict__ const session_slot = c.session_slot;
    const unsigned int sessions = c.sessions, rows = c.rows, k = c.k;
    __shared__ unsigned int warp_sums[32];
    __shared__ unsigned int sh_taken, sh_count[KV_STATS];
    __shared__ int sh_last;
    __shared__ unsigned int sh_rows[KV_FAST_MAX_ROWS + 1];
    // Written by kv_lean_classify before the validating barrier, read after it (kv_lean_quiet,
    // kv_lean_counts, kv_lean_stat_counts): nothing else may write it in between.
    __shared__ unsigned int sh_part[32 * KV_LEAN_PARTS];
    __shared__ unsigned long long sh_call;
    const unsigned int r = blockIdx.x, tid = threadIdx.x;
    if (tid < KV_STATS) sh_count[tid] = 0u;
    if (tid <= KV_FAST_MAX_ROWS) sh_rows[tid] = 0u;
    // Round trip 1: loads that depend on no other load, all issued before any is used: the entry's
    // words, its picks (speculatively, below), and the call-wide checks' words.
    const bool entry = r < sessions;
    // A direct batch (the pool's word: every live slot's whole history is resident): no position-table
    // reads, no hot-cache path (DESIGN.md, "Direct batches").
    const bool direct = t.direct != nullptr && *t.direct != 0u;
    int q0 = 0, q1 = 0, sl = -1, limit = 0;
    if (entry) {
        q0 = qsl[r];
        q1 = qsl[r + 1];
        sl = session_slot[r];
        limit = seq_lens[r];
    }
    // Speculatively: in a uniform batch (rows = m x sessions: decode, m = 1, or a speculative step
    // with m query rows per entry; dv.m != 0, its shape computed at launch) entry r's picks start
    // at row r x m. They are loaded with the words above and kept when query_start_loc confirms
    // that layout; otherwise they are loaded again from the entry's own rows below (the picks of a
    // misguessed row are never used). Row r x m + m <= rows: in bounds of topk.
    const unsigned int m = dv.m;
    // The lean kernels' blocks are 512 or 1024 threads: ceil(x / blockDim) is a shift.
    const unsigned int lb = 31u - (unsigned int)__clz((int)blockDim.x);
    const bool guess = entry && m != 0u;
    KvLookups lk;
    int(&p)[KV_FAST_PER] = lk.p;
    {
        const unsigned int gF = guess ? m * k : 0u;
        const unsigned int g0 = tid * dv.gper, ge = min(g0 + dv.gper, gF);
        kv_load_entry_picks(c, dv.blk, guess ? r * m : 0u, g0, p, ge > g0 ? ge - g0 : 0u);
    }
    // The query_start_loc check and the repeated-slot scan: each thread's first words go to
    // registers with the loads above (a loop that compared as it loaded would wait for them first);
    // batches over blockDim entries loop for the rest.
    bool bad_qsl = false, dup = false;
    // Only warps with a session to check (and warp 0, which checks the ends) run the scans: a
    // warp-uniform branch, so the others issue none of it (predicated loads would still issue).
    if ((tid & ~31u) < sessions || tid < 32u) {
        const bool mine = tid < sessions;
        int a = 0, b = 0, o = -1, z0 = 0, zn = 0;
        if (mine) {
            a = qsl[tid];
            b = qsl[tid + 1];
            o = session_slot[tid];
        }
        if (tid == 0) {
            z0 = qsl[0];
            zn = qsl[sessions];
        }
        bad_qsl = (mine && b < a) || (tid == 0 && (z0 < 0 || (unsigned int)zn > rows));
        dup = entry && mine && tid != r && o == sl;
        for (unsigned int i = tid + blockDim.x; i < sessions; i += blockDim.x) {
            bad_qsl |= qsl[i + 1] < qsl[i];
            dup |= entry && i != r && session_slot[i] == sl;
        }
    }
    // Round trip 2: the slot's descriptor, call counter and fixed pages, and per pick the page-table
    // and position-table entries (their addresses depend only on the slot and the pick; used only
    // where the lookup order reaches them). Addresses are checked against the tables' extents here;
    // validity is decided after the barrier. Every load is issued before anything waits for one
    // (the fixed pages go to shared memory last).
    const bool slot_in = entry && sl >= 0 && (unsigned int)sl < d.max_slots;
    const bool rows_in = entry && q0 >= 0 && q0 <= q1 && (unsigned int)q1 <= rows;
    const unsigned int R = rows_in ? (unsigned int)(q1 - q0) : 0u;
    // R <= KV_FAST_MAX_ROWS and k <= KV_FAST_PER x blockDim: R x k fits 32 bits.
    const bool lean = !CLASSIC && rows_in && R <= KV_FAST_MAX_ROWS && k <= KV_FAST_PER * blockDim.x &&
                      R * k <= KV_FAST_PER * blockDim.x;
    const unsigned int F = lean ? R * k : 0u;
    const unsigned int per = min((unsigned int)KV_FAST_PER, (F + blockDim.x - 1u) >> lb);
    const unsigned int f0 = tid * per, fe = min(f0 + per, F);
    // Block-uniform: the guess holds iff this entry's rows are r x m .. r x m + m (then F, per, f0
    // and fe equal the guessed ones, `lean` and `guess` having the same bounds).
    if (!(guess && lean && (unsigned int)q0 == r * m && R == m))
        kv_load_entry_picks(c, dv.blk, lean ? (unsigned int)q0 : 0u, f0, p, fe > f0 ? fe - f0 : 0u);
    KvSlotDesc s = {};
    unsigned int hand = 0;
    if (slot_in) {
        s = t.desc[sl];
        hand = t.hand[sl];  // the CLOCK hand before the call (used only when something missed)
        // The slot's call counter, read by thread 0 and published by the validating barrier. Only
        // this block writes it during the call (a repeated slot is refused for every entry naming
        // it, before anything is written), so no other block's read can race with the write.
        if (tid == 0) sh_call = t.call[sl] + 1ull;
    } else if (tid == 0) {
        sh_call = 0ull;  // no slot: the entry is refused and the value unused
    }
    const int* const g = kv_slot_fixed(d, t, slot_in ? (unsigned int)sl : 0u);
    const bool fp_mine = slot_in && tid < d.fixed_pages;
    const int fp_first = fp_mine ? g[tid] : -1;
    // The slot's rows of the page and position tables: one 64-bit base each (the offsets pinned by
    // kv_pin, so each lookup is one 32-bit index scaled onto the base, not a 64-bit offset sum
    // re-formed per pick), then per pick two loads predicated on their bounds, no branch.
    const int* ptab = t.page_tab + (unsigned long long)(slot_in ? sl : 0) * d.max_pages;
    const int* pslot = t.pos_slot + (unsigned long long)(slot_in ? sl : 0) * d.max_history;
    kv_pin(ptab);
    kv_pin(pslot);
    int(&pg)[KV_FAST_PER] = lk.pg;
    int(&hs)[KV_FAST_PER] = lk.hs;
    unsigned int(&pj)[KV_FAST_PER] = lk.pj;  // each pick's page (reused by the classification)
#pragma unroll
    for (unsigned int i = 0; i < KV_FAST_PER; ++i) {
        const unsigned int q = (unsigned int)p[i];  // >= 2^31 for a negative pick
        const unsigned int j = kv_quo(dv.page, q);  // meaningful only for q < 2^31
        const bool look = slot_in && p[i] >= 0;
        pj[i] = j;
        pg[i] = look && j < d.max_pages ? ptab[j] : -1;
        hs[i] = look && !direct && q < d.max_history ? pslot[q] : -1;
    }
    int(&rl)[KV_FAST_PER] = lk.rl;
#pragma unroll
    for (unsigned int i = 0; i < KV_FAST_PER; ++i) rl[i] = KV_NO_BOUND;
    if (qseq != nullptr) {  // a launch-wide branch: without per-query bounds none of this issues
#pragma unroll
        for (unsigned int i = 0; i < KV_FAST_PER; ++i)
            if (f0 + i < fe) rl[i] = qseq[(unsigned int)q0 + kv_quo(dv.k, f0 + i)];
    }
    int* const fp = (int*)(kv_dyn + 2u * ((d.hot_rows + 31u) >> 5));
    bool fp_slow = false;  // a fixed row of this thread's pages could be negative
    if (slot_in && !CLASSIC) {
        for (unsigned int i = tid; i < d.fixed_pages; i += blockDim.x) {
            const int v = i == tid ? fp_first : g[i];
            fp[i] = v;
            fp_slow |= (unsigned int)v > dv.fp_max;  // negative, or its last row overflows an int
        }
    }
    // The entry as far as it is known before the validating barrier, and the block's scratch.
    if (direct) s.full = 1u;  // the pool's promise: nothing of this slot is on the hot-cache path
    KvEntry e = {slot_in ? (unsigned int)sl : 0u, s, limit, (unsigned int)q0, R, F, per, f0, fe, 0ull, hand};
    const KvShared sh = {kv_dyn, fp, warp_sums, sh_rows, sh_count, sh_part, &sh_taken, &sh_last};
    // Preview of the picks' classes into the warp partials (folded into the validating barrier).
    unsigned int cls;
    int v[KV_FAST_PER];
    bool missed;
    const bool fixed_any = kv_lean_classify(d, dv, e, lk, fp_slow, sh_part, &cls, v, &missed);
    // Early outputs (in place): a warp of a well-formed entry whose picks are all page rows, -1 or
    // invalid stores them now, before the validating barrier: every later path writes the same
    // values there, and a refusal after the barrier rewrites the entry's rows -1 (in this block,
    // ordered by the barrier). The warps holding tail, scratch or hot picks wait for the fixed pages.
    const bool may_early = lean && c.layout != KV_LAYOUT_PACKED && slot_in && s.live != 0u && limit >= 1 &&
                           (unsigned int)limit <= s.committed + s.scratch_len;
    const bool early = may_early && !fixed_any && !missed;  // warp-uniform
    if (early) {
        int out[KV_FAST_PER];
#pragma unroll
        for (unsigned int i = 0; i < KV_FAST_PER; ++i) out[i] = ((cls >> (3u * i)) & 7u) == KV_PICK_PAGE ? v[i] : -1;
        kv_store_picks(c.indices + (unsigned long long)q0 * k + f0, out, fe > f0 ? fe - f0 : 0u);
    }
    // The validating barrier (it also publishes sh_call).
    bool qsl_bad = false, dup_any = false;
    if (__syncthreads_or(bad_qsl | dup)) {
        qsl_bad = __syncthreads_or(bad_qsl);
        dup_any = __syncthreads_or(dup);
    }
    const unsigned long long call = sh_call;
    if (qsl_bad) {
        kv_refuse_call(t, c);
        if (may_early) kv_fill_rows(c, (unsigned int)q0, (unsigned int)q1);  // this block's early stores
    } else if (r == sessions) {
        kv_fill_rows(c, 0, (unsigned int)qsl[0]);
        kv_fill_rows(c, (unsigned int)qsl[sessions], rows);
    } else {
        const unsigned int row0 = (unsigned int)q0, row1 = (unsigned int)q1;
        const bool ok = slot_in && !dup_any && s.live != 0u && limit >= 1 &&
                        (unsigned int)limit <= s.committed + s.scratch_len;
        e.call = call;
        e.plan = c.plan + (unsigned long long)r * d.hot_rows;
        e.plan_count = c.plan_count + r;
        e.stats = c.stats + r * KV_STATS;
        // The slot's call number advances with each accepted entry (the kernel's end publishes it
        // to the next launch and to a prefetch that follows this resolve on the stream).
        if (ok && tid == 0) t.call[sl] = call;
        if (!ok) {
            kv_refuse_entry(t, c, r, row0, row1);
        } else if (lean && c.layout != KV_LAYOUT_PACKED && kv_lean_quiet(sh_part)) {
            kv_entry_lean_quiet(d, dv, t, c, e, sh, fixed_any, cls, v, early);
        } else if (lean) {
            kv_entry_lean(d, dv, t, c, e, sh, fixed_any, cls, v);
        } else {
            e.R = row1 - row0;  // the classic path takes any rows
            kv_entry_classic(d, t, c, e, sh);
        }
    }
    if (r == sessions) kv_fill_pad(c);
}

// ResolveEngine::Lean: 1024 threads (64 registers per thread at most).
extern "C" __global__ void __launch_bounds__(KV_LEAN_BLOCK) tierkit_kv_resolve_lean(KV_RESOLVE_PARAMS) {
    kv_resolve_lean_body<false>(KV_RESOLVE_ARGS);
}

// ResolveEngine::Lean512: the same body compiled for 512 threads (up to 128 registers: no spills).
extern "C" __global__ void __launch_bounds__(KV_LEAN512_BLOCK, 1) tierkit_kv_resolve_lean512(KV_RESOLVE_PARAMS) {
    kv_resolve_lean_body<false>(KV_RESOLVE_ARGS);
}

extern "C" __global__ void __launch_bounds__(KV_CLASSIC_BLOCK) tierkit_kv_resolve(KV_RESOLVE_PARAMS) {
    kv_resolve_lean_body<true>(KV_RESOLVE_ARGS);
}

// Candidate-pool prefetch (side stream). Block b: session slot slots[b], candidates
// cand[b * stride .. + cand_count[b]]; pins with the slot's current call (no increment), hits first, then
// misses in first-appearance order while victims last; copies into layers [l0, l0 + nl).
extern "C" __global__ void __launch_bounds__(1024) tierkit_kv_prefetch(
    KvDims d, KvTables t, const int* __restrict__ slots, const int* __restrict__ cand,
    const unsigned int* __restrict__ cand_count, unsigned int stride, unsigned int l0, unsigned int nl,
    KvCopy* __restrict__ plan_all, unsigned int* __restrict__ plan_count) {
    __shared__ unsigned int warp_sums[32];
    __shared__ unsigned int sh_taken;
    __shared__ int sh_last;
    const int sl = slots[blockIdx.x];
    KvCopy* plan = plan_all + (unsigned long long)blockIdx.x * d.hot_rows;
    if (sl < 0 || (unsigned int)sl >= d.max_slots || t.desc[sl].live == 0u) {
        if (threadIdx.x == 0) {
            plan_count[blockIdx.x] = 0u;
            atomicAdd(&t.err[KV_ERR_BAD_SESSION], 1u);
        }
        return;
    }
    const unsigned int slot = (unsigned int)sl;
    const KvSlotDesc s = t.desc[slot];
    const unsigned long long call = t.call[slot];  // the slot's last resolve (no increment)
    const int* c = cand + (unsigned long long)blockIdx.x * stride;
    const unsigned int n = min(cand_count[blockIdx.x], stride);
    const int limit = (int)s.committed;
    unsigned int bad = 0;
    for (unsigned int i = threadIdx.x; i < n; i += blockDim.x) kv_claim(d, t, slot, s, c[i], limit, (int)i, call, &bad);
    __syncthreads();
    unsigned int misses = 0;
    for (unsigned int i0 = 0; i0 < n; i0 += blockDim.x) {
        const unsigned int i = i0 + threadIdx.x;
        const int p = i < n ? c[i] : -1;
        const bool own = i < n && kv_owner(d, t, slot, s, p, limit, (int)i);
        unsigned int total;
        const unsigned int at = misses + kv_block_scan_u32(own ? 1u : 0u, &total, warp_sums);
        if (own && at < d.hot_rows) plan[at].position = (unsigned int)p;
        misses += total;
    }
    // The CPU reference stops at the first miss without a victim: one failing sweep.
    const unsigned int taken = kv_place_warp(d, t, slot, call, plan, misses, &sh_taken, &sh_last);
    if (threadIdx.x == 0) {
        plan_count[blockIdx.x] = taken;
        if (bad) atomicAdd(&t.err[KV_ERR_BAD_POSITION], bad);
    }
    __syncthreads();
    kv_fetch(d, t, plan, taken, l0, nl);
}

