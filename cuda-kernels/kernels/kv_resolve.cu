// tierkit: kv-elastic fused resolve / dedup / fetch kernels, plan replay, candidate prefetch,
// and write-back. The contract these kernels implement is written once in cuda-kernels/DESIGN.md
// ("KV resolve kernel contract"); the stand-ins of the decode-step benchmark live in tierkit-testkit.
//
// Semantics (kv-elastic's CPU reference implements the same contract):
// tail -> scratch -> borrowed page -> hot cache -> miss; misses deduplicated per session in order of
// first appearance over the request's rows; CLOCK (second chance) victims that skip slots pinned by
// the current call; every output element written on every call.
//
// Layouts (all row-major):
//   arena  [layers][arena_rows][row_bytes]                         (device, one allocation)
//   host   [max_slots][max_history][layers][row_bytes]             (mapped pinned host memory)
//   per slot b: fixed_pages[b][fixed_pages], page_tab[b][max_pages], pos_slot[b][max_history],
//               slot_pos/mark/stamp[b][hot_rows], hand[b], first[b][max_history], call[b]
// The hot-cache tables (pos_slot, slot_pos, mark, stamp, hand, call) are one layer group's: the host passes
// the group's tables of the layer it resolves (kv-elastic lays them out [groups][max_slots][...]).

#define KV_NONE (-1)
#define KV_UNCLAIMED 0x7fffffff

// Error counters (err[i], u32, cumulative until the host clears them).
#define KV_ERR_BAD_SESSION 0   // session slot out of range / not live / named twice, or seq_len out of range
#define KV_ERR_BAD_POSITION 1  // pick < -1 or >= its row's bound (written as -1)
#define KV_ERR_OVERFLOW 2      // distinct misses without an evictable hot row (written as -1; served as far as rows last)
#define KV_ERR_BAD_QSL 3       // query_start_loc malformed (every row written as -1)
#define KV_ERR_STALE_PLAN 4    // replay check: destination row no longer holds the position; fetch: plan entry out of range (skipped)

struct KvDims {
    unsigned int row_bytes, layers, page_rows, hot_rows;
    unsigned int tail_rows, scratch_rows, fixed_pages, max_slots;
    unsigned int max_history, max_pages, arena_rows, pad0;
};

// A divisor with its multiplier and shift (cuda-kernels/src/kv/fastdiv.rs computes them per
// launch; Granlund and Montgomery's 33-bit multiplier 2^32 + mul): x / d == (umulhi(x, mul) + x) >> shr
// for 0 <= x < 2^31 (the sum cannot overflow there), d == 1 included (mul = 1, shr = 0). Three
// instructions, no select, where a division by a runtime value takes ~12.
struct KvDiv {
    unsigned int d, mul, shr, pad;
};
struct KvDivs {
    KvDiv page, tail, k;  // page_rows, tail_rows, the call's top-k width
    // The lean engines' launch-time batch shape (cuda-kernels/src/kv/fastdiv.rs): m = query rows
    // per entry of a uniform batch (rows = m x sessions, 1 <= m <= KV_FAST_MAX_ROWS, m x k <=
    // KV_FAST_PER x blockDim), 0 when the batch is not uniform; gper = picks per thread of such an
    // entry (min(KV_FAST_PER, ceil(m x k / blockDim))); fp_max = the largest fixed page whose last
    // row fits an int ((2^31 - 1 - (page_rows - 1)) / page_rows).
    unsigned int m, gper, fp_max, pad;
};
__device__ __forceinline__ unsigned int kv_quo(const KvDiv& v, unsigned int x) {
    return (__umulhi(x, v.mul) + x) >> v.shr;
}
__device__ __forceinline__ unsigned int kv_rem(const KvDiv& v, unsigned int x) { return x - kv_quo(v, x) * v.d; }

// Keeps a pointer in a register as computed: an empty asm the compiler cannot see through, so each
// lookup scales a 32-bit index onto it (one IMAD.WIDE) instead of re-forming `base + 4 * (offset +
// i)` from the kernel parameters at every use. The asm hides the pointer's address space too;
// __builtin_assume(__isGlobal) restores it, so the loads stay global (LDG), not generic (LD).
// Only for pointers into the device tables (global memory, never null).
__device__ __forceinline__ void kv_pin(const int*& p) {
    asm("" : "+l"(p));
    __builtin_assume(__isGlobal(p));
}

struct KvSlotDesc {
    unsigned int live, committed, scratch_len, full;
    unsigned int tail_start, pad0, pad1, pad2;
};

struct KvTables {
    const KvSlotDesc* desc;
    const int* fixed_pages;
    const int* page_tab;
    int* pos_slot;
    int* slot_pos;
    unsigned long long* mark;
    unsigned long long* stamp;
    unsigned int* hand;
    int* first;
    unsigned long long* call;  // [max_slots]: each slot's last accepted resolve call (starts at 1)
    unsigned char* arena;
    unsigned char* host;
    unsigned int* err;
};

struct KvCopy {
    unsigned int slot, position, dst_row, pad;
};

// A table patch: `count` u32 words at device address `dst` set to `value`.
struct KvFill {
    unsigned long long dst;
    unsigned int count, value;
};

// Hot-row state (CLOCK with per-call pins), two u64 per row: `stamp` and `mark`. A hit in call c
// writes stamp = 2c + 1 (one store: pinned, referenced), an install stamp = mark = 2c (pinned, not
// referenced), the sweep clears a reference with mark = 2c; a row is pinned by call c iff
// stamp >> 1 == c and referenced iff stamp > mark. Zeroed rows are neither (calls start at 1).
// The same decisions as the CPU reference's (bool referenced, u64 stamp): a hit after an install
// in the same call (prefetch after resolve) gives 2c + 1 > 2c, referenced, as there.
__device__ __forceinline__ unsigned long long kv_hit_stamp(unsigned long long call) { return 2ull * call + 1ull; }
__device__ __forceinline__ unsigned long long kv_cold_stamp(unsigned long long call) { return 2ull * call; }
__device__ __forceinline__ bool kv_pinned(unsigned long long stamp, unsigned long long call) {
    return (stamp >> 1) == call;
}
__device__ __forceinline__ void kv_touch(const KvTables& t, unsigned long long row, unsigned long long call) {
    t.stamp[row] = kv_hit_stamp(call);
}

#define KV_STATS 8  // picks, tail, scratch, page, hot, misses, direct, invalid
#define KV_LAYOUT_PACKED 1  // output rows: valid entries packed to the front (FlashMLA topk_length)

__device__ __forceinline__ unsigned long long kv_plane(const KvDims& d, unsigned int layer) {
    return (unsigned long long)layer * d.arena_rows * d.row_bytes;
}

__device__ __forceinline__ unsigned long long kv_host_off(const KvDims& d, unsigned int slot, unsigned int pos,
                                                         unsigned int layer) {
    return (((unsigned long long)slot * d.max_history + pos) * d.layers + layer) * d.row_bytes;
}

// Arena row of fixed local row `local` of a slot whose fixed pages are `fp` (its row of the
// fixed-page table, in global or shared memory).
__device__ __forceinline__ int kv_fixed_row_at(const KvDims& d, const int* fp, unsigned int local) {
    return fp[local / d.page_rows] * (int)d.page_rows + (int)(local % d.page_rows);
}

// kv_fixed_row_at with page_rows as a KvDiv (the lean engine's path).
__device__ __forceinline__ int kv_fixed_row_fd(const KvDiv& pr, const int* fp, unsigned int local) {
    const unsigned int j = kv_quo(pr, local);
    return fp[j] * (int)pr.d + (int)(local - j * pr.d);
}

__device__ __forceinline__ const int* kv_slot_fixed(const KvDims& d, const KvTables& t, unsigned int slot) {
    return t.fixed_pages + (unsigned long long)slot * d.fixed_pages;
}

__device__ __forceinline__ int kv_fixed_row(const KvDims& d, const KvTables& t, unsigned int slot,
                                            unsigned int local) {
    return kv_fixed_row_at(d, kv_slot_fixed(d, t, slot), local);
}

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

__device__ __forceinline__ int kv_resident(const KvDims& d, const KvTables& t, unsigned int slot,
                                           const KvSlotDesc& s, unsigned int p, int* kind) {
    return kv_resident_at(d, t, slot, s, p, kind, kv_slot_fixed(d, t, slot));
}

// One warp copies `bytes` bytes; 16-byte loads when sizes and addresses allow, two in flight per lane.
__device__ __forceinline__ void kv_warp_copy(unsigned char* dst, const unsigned char* src, unsigned int bytes,
                                             unsigned int lane) {
    if (((bytes | (unsigned int)(size_t)dst | (unsigned int)(size_t)src) & 15u) == 0u) {
        const uint4* s = (const uint4*)src;
        uint4* o = (uint4*)dst;
        const unsigned int n = bytes >> 4;
        for (unsigned int i = lane; i < n; i += 64u) {
            const uint4 a = s[i];
            const bool hb = i + 32u < n;
            uint4 b;
            if (hb) b = s[i + 32u];
            o[i] = a;
            if (hb) o[i + 32u] = b;
        }
    } else if (((bytes | (unsigned int)(size_t)dst | (unsigned int)(size_t)src) & 3u) == 0u) {
        const unsigned int* s = (const unsigned int*)src;
        unsigned int* o = (unsigned int*)dst;
        for (unsigned int i = lane; i < (bytes >> 2); i += 32u) o[i] = s[i];
    } else {
        for (unsigned int i = lane; i < bytes; i += 32u) dst[i] = src[i];
    }
}

// Exclusive block-wide prefix sum of a 0/1 predicate (blockDim.x a multiple of 32, <= 1024).
__device__ __forceinline__ unsigned int kv_block_scan(bool pred, unsigned int* total, unsigned int* warp_sums) {
    const unsigned int lane = threadIdx.x & 31u, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const unsigned int ballot = __ballot_sync(0xffffffffu, pred);
    const unsigned int in_warp = __popc(ballot & ((1u << lane) - 1u));
    __syncthreads();  // warp_sums may still be read by the previous call
    if (lane == 0) warp_sums[warp] = __popc(ballot);
    __syncthreads();
    unsigned int before = 0, sum = 0;
    for (unsigned int w = 0; w < nw; ++w) {
        const unsigned int v = warp_sums[w];
        if (w < warp) before += v;
        sum += v;
    }
    *total = sum;
    return before + in_warp;
}

// Victim selection by warp 0 (CLOCK, exactly the sequence of the CPU reference's victim() calls):
// scan index i visits slot (hand + i) % n; lap 1 takes an unpinned slot that is empty or unreferenced,
// lap 2 takes an unpinned referenced slot (its bit was cleared on lap 1). Victim slots go to
// plan[i].dst_row (still slot numbers). Returns (in shared) taken count and the last scan index.
__device__ void kv_pick_victims(const KvDims& d, const KvTables& t, unsigned int slot, unsigned long long call,
                                KvCopy* plan, unsigned int want, unsigned int* sh_taken, int* sh_last) {
    const unsigned int lane = threadIdx.x & 31u;
    const unsigned int n = d.hot_rows;
    const unsigned long long base = (unsigned long long)slot * n;
    const unsigned int hand = t.hand[slot];
    unsigned int taken = 0;
    int last = -1;
    for (unsigned int i0 = 0; i0 < 2u * n && taken < want; i0 += 32u) {
        const unsigned int i = i0 + lane;
        bool take = false;
        unsigned int s = 0;
        if (i < 2u * n) {
            s = (hand + i) % n;
            const unsigned long long st = t.stamp[base + s];
            const bool pin = kv_pinned(st, call);
            const bool empty = t.slot_pos[base + s] < 0;
            const bool ref = st > t.mark[base + s];
            take = !pin && (i < n ? (empty || !ref) : (!empty && ref));
        }
        const unsigned int ballot = __ballot_sync(0xffffffffu, take);
        const unsigned int rank = __popc(ballot & ((1u << lane) - 1u));
        const unsigned int cnt = __popc(ballot), need = want - taken;
        if (take && rank < need) plan[taken + rank].dst_row = s;
        if (cnt >= need) {
            const unsigned int at = __ballot_sync(0xffffffffu, take && rank == need - 1u);
            last = (int)(i0 + (unsigned int)(__ffs(at) - 1));
            taken = want;
        } else if (cnt > 0u) {
            last = (int)(i0 + 31u - (unsigned int)__clz(ballot));
            taken += cnt;
        }
    }
    if (lane == 0) {
        *sh_taken = taken;
        *sh_last = last;
    }
}

// After installs: clear the references (mark = 2c) of lap-1 slots the hand passed (unless pinned) and move the hand
// as the CPU reference does (a failing victim() call sweeps 2n + 1 slots, i.e. one net step).
__device__ void kv_finish_sweep_at(const KvDims& d, const KvTables& t, unsigned int slot, unsigned long long call,
                                   unsigned int misses, unsigned int taken, int last, unsigned int hand) {
    const unsigned int n = d.hot_rows;
    const unsigned long long base = (unsigned long long)slot * n;
    const unsigned int visited = last < 0 ? 0u : min((unsigned int)last + 1u, n);
    for (unsigned int i = threadIdx.x; i < visited; i += blockDim.x) {
        const unsigned int s = (hand + i) % n;
        if (!kv_pinned(t.stamp[base + s], call)) t.mark[base + s] = kv_cold_stamp(call);
    }
    __syncthreads();
    if (threadIdx.x == 0 && misses > 0) {
        unsigned long long adv = last < 0 ? 0ull : (unsigned long long)last + 1ull;
        // One failing victim() call after the last placed miss (also when the misses exceed the
        // hot rows: placement stops at the first miss without a victim).
        if (taken < misses) adv += 2ull * n + 1ull;
        t.hand[slot] = (unsigned int)((hand + adv) % n);
    }
}

__device__ void kv_finish_sweep(const KvDims& d, const KvTables& t, unsigned int slot, unsigned long long call,
                                unsigned int misses, unsigned int taken, int last) {
    kv_finish_sweep_at(d, t, slot, call, misses, taken, last, t.hand[slot]);
}

// Installs plan[i].position into hot slot `s` (evicting its old position) and writes plan[i] whole:
// (slot, position, arena row of `s`). `fp`: the slot's fixed pages.
__device__ __forceinline__ void kv_install_one(const KvDims& d, const KvTables& t, unsigned int slot,
                                               unsigned long long call, KvCopy* plan, unsigned int i, unsigned int s,
                                               const int* fp) {
    const unsigned long long hb = (unsigned long long)slot * d.hot_rows;
    const unsigned long long pb = (unsigned long long)slot * d.max_history;
    const unsigned int p = plan[i].position;
    const int old = t.slot_pos[hb + s];
    if (old >= 0) t.pos_slot[pb + old] = KV_NONE;
    t.slot_pos[hb + s] = (int)p;
    t.pos_slot[pb + p] = (int)s;
    t.mark[hb + s] = kv_cold_stamp(call);
    t.stamp[hb + s] = kv_cold_stamp(call);
    plan[i].dst_row = (unsigned int)kv_fixed_row_at(d, fp, s);
    plan[i].slot = slot;
    plan[i].pad = 0u;
}

// Installs plan[0..taken) (dst_row holds the victim slot) and rewrites dst_row to the arena row
// (`fp`: the slot's fixed pages).
__device__ void kv_install_at(const KvDims& d, const KvTables& t, unsigned int slot, unsigned long long call,
                              KvCopy* plan, unsigned int taken, const int* fp) {
    for (unsigned int i = threadIdx.x; i < taken; i += blockDim.x)
        kv_install_one(d, t, slot, call, plan, i, plan[i].dst_row, fp);
}

__device__ void kv_install(const KvDims& d, const KvTables& t, unsigned int slot, unsigned long long call,
                           KvCopy* plan, unsigned int taken) {
    kv_install_at(d, t, slot, call, plan, taken, kv_slot_fixed(d, t, slot));
}

// Places the `misses` positions ordered in plan[0 .. min(misses, hot_rows)) (classic path and
// prefetch): victims by warp 0, installs, sweep bookkeeping (a failing sweep when victims run out).
// Starts with a barrier (the plan positions are in global memory); returns the rows placed. The
// caller synchronizes before reading the plan's rows.
__device__ unsigned int kv_place_warp(const KvDims& d, const KvTables& t, unsigned int slot, unsigned long long call,
                                      KvCopy* plan, unsigned int misses, unsigned int* sh_taken, int* sh_last) {
    const unsigned int want = min(misses, d.hot_rows);
    __syncthreads();
    if (threadIdx.x < 32u) kv_pick_victims(d, t, slot, call, plan, want, sh_taken, sh_last);
    __syncthreads();
    const unsigned int taken = *sh_taken;
    kv_install(d, t, slot, call, plan, taken);
    __syncthreads();
    kv_finish_sweep(d, t, slot, call, misses, taken, *sh_last);
    return taken;
}

// Gathers plan rows from mapped host memory into layers [l0, l0 + nl): one warp per row. A plan
// may be caller-written (replay of a user tensor): an entry whose slot, position or destination row
// is out of range, or whose layer range exceeds the arena, is skipped and counted once as a stale
// plan entry, so no plan can read or write outside the host store / arena.
__device__ void kv_fetch(const KvDims& d, const KvTables& t, const KvCopy* plan, unsigned int n, unsigned int l0,
                         unsigned int nl) {
    const unsigned int lane = threadIdx.x & 31u, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const unsigned long long total = (unsigned long long)n * nl;
    for (unsigned long long w = warp; w < total; w += nw) {
        const unsigned int i = (unsigned int)(w % n), l = l0 + (unsigned int)(w / n);
        const KvCopy c = plan[i];
        if (c.slot >= d.max_slots || c.position >= d.max_history || c.dst_row >= d.arena_rows || l >= d.layers) {
            if (lane == 0 && w < n) atomicAdd(&t.err[KV_ERR_STALE_PLAN], 1u);
            continue;
        }
        kv_warp_copy(t.arena + kv_plane(d, l) + (unsigned long long)c.dst_row * d.row_bytes,
                     t.host + kv_host_off(d, c.slot, c.position, l), d.row_bytes, lane);
    }
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
    if (kv_resident(d, t, slot, s, (unsigned int)p, &kind) >= 0) return;
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
    if (kv_resident(d, t, slot, s, (unsigned int)p, &kind) >= 0) return false;
    const unsigned long long pb = (unsigned long long)slot * d.max_history;
    if (t.pos_slot[pb + p] >= 0) return false;
    if (t.first[pb + p] != f) return false;
    t.first[pb + p] = KV_UNCLAIMED;
    return true;
}

__device__ __forceinline__ bool kv_qsl_ok(const int* qsl, unsigned int sessions, unsigned int rows) {
    bool bad = false;
    for (unsigned int i = threadIdx.x; i < sessions; i += blockDim.x) bad |= qsl[i + 1] < qsl[i];
    if (threadIdx.x == 0) bad |= qsl[0] < 0 || (unsigned int)qsl[sessions] > rows;
    return !__syncthreads_or(bad);
}

__device__ void kv_fill_rows(int* indices, int* valid_count, unsigned int r0, unsigned int r1, unsigned int k) {
    for (unsigned long long i = (unsigned long long)r0 * k + threadIdx.x; i < (unsigned long long)r1 * k;
         i += blockDim.x)
        indices[i] = -1;
    for (unsigned int r = r0 + threadIdx.x; r < r1; r += blockDim.x) valid_count[r] = 0;
}

// Padding of oversized output buffers: indices[rows * k .. idx_len) = -1, valid_count[rows .. valid_len) = 0,
// plan_count[sessions .. pc_len) = 0 (a replay of more sessions than this call's copies nothing stale).
__device__ void kv_fill_pad(int* indices, int* valid_count, unsigned int rows, unsigned int k,
                            unsigned long long idx_len, unsigned long long valid_len, unsigned int* plan_count,
                            unsigned int sessions, unsigned long long pc_len) {
    for (unsigned long long i = (unsigned long long)sessions + threadIdx.x; i < pc_len; i += blockDim.x)
        plan_count[i] = 0u;
    for (unsigned long long i = (unsigned long long)rows * k + threadIdx.x; i < idx_len; i += blockDim.x)
        indices[i] = -1;
    for (unsigned long long r = (unsigned long long)rows + threadIdx.x; r < valid_len; r += blockDim.x)
        valid_count[r] = 0;
}

// A malformed query_start_loc: every row -1, every plan count and stats row 0, one bad_qsl (block 0).
__device__ void kv_refuse_call(const KvTables& t, unsigned int sessions, unsigned int rows, unsigned int k,
                               int* indices, int* valid_count, unsigned int* plan_count, unsigned int* stats) {
    const unsigned int r = blockIdx.x;
    for (unsigned int row = r; row < rows; row += gridDim.x) kv_fill_rows(indices, valid_count, row, row + 1, k);
    if (r < sessions && threadIdx.x == 0) plan_count[r] = 0u;
    if (r < sessions && threadIdx.x < KV_STATS) stats[r * KV_STATS + threadIdx.x] = 0u;
    if (r == 0 && threadIdx.x == 0) atomicAdd(&t.err[KV_ERR_BAD_QSL], 1u);
}

// A refused entry (bad or repeated slot, seq_len out of range): its rows -1, plan count and stats 0,
// one bad_session.
__device__ void kv_refuse_entry(const KvTables& t, unsigned int row0, unsigned int row1, unsigned int k,
                                int* indices, int* valid_count, unsigned int* plan_count_r, unsigned int* stats_r) {
    kv_fill_rows(indices, valid_count, row0, row1, k);
    if (threadIdx.x == 0) {
        *plan_count_r = 0u;
        atomicAdd(&t.err[KV_ERR_BAD_SESSION], 1u);
    }
    if (threadIdx.x < KV_STATS) stats_r[threadIdx.x] = 0u;
}

// Causal bound of one query row: the entry's seq_len, or min(query_seq_lens[row], seq_len).
__device__ __forceinline__ int kv_row_limit(const int* qseq, unsigned int row, int limit) {
    return qseq ? min(qseq[row], limit) : limit;
}

// ---------------------------------------------------------------------------------------------
// The fast engine (`tierkit_kv_resolve_fast`): the same contract and the same decisions as the
// classic body below, with the bookkeeping reorganised so that no phase is serial (see DESIGN.md,
// "Fast resolve engine"):
// - each thread holds up to KV_FAST_PER consecutive picks of its entry (as few as cover it) in
//   registers from the first global read to the output write (one lookup chain per pick instead
//   of three);
// - one block-wide scan orders the first appearances, one orders the outputs;
// - CLOCK victims are chosen by the whole block from two candidate bitmaps of the hot slots (one
//   coalesced pass over the slot state, a scan over hand-rotated ranges), instead of warp 0
//   walking up to 2 × hot_rows slots 32 at a time.
// Entries with more than KV_FAST_PER × blockDim picks or KV_FAST_MAX_ROWS query rows take the
// classic body (same results). Dynamic shared memory: 2 × ceil(hot_rows / 32) u32 (the bitmaps),
// then fixed_pages int32 (the entry's fixed pages).
#define KV_FAST_PER 4
#define KV_FAST_MAX_ROWS 64
#define KV_OUT_PENDING (-2)
#define KV_OUT_OWNER (-3)  // lean placement: an owner of rank r holds KV_OUT_OWNER - r until step G
#define KV_LEAN_VICTIM_MAX 8192u  // lean: hot_rows up to this get the shared rank -> victim table

// Dynamic shared memory of the fast and lean engines (victim bitmaps, then the entry's fixed pages).
extern __shared__ unsigned int kv_dyn[];

// Exclusive block-wide prefix sum of a u32 (blockDim.x a multiple of 32, <= 1024).
__device__ __forceinline__ unsigned int kv_block_scan_u32(unsigned int v, unsigned int* total,
                                                          unsigned int* warp_sums) {
    const unsigned int lane = threadIdx.x & 31u, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    unsigned int x = v;
#pragma unroll
    for (unsigned int o = 1; o < 32u; o <<= 1) {
        const unsigned int y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o) x += y;
    }
    __syncthreads();  // warp_sums may still be read by the previous call
    if (lane == 31u) warp_sums[warp] = x;
    __syncthreads();
    unsigned int before = 0, sum = 0;
    for (unsigned int w = 0; w < nw; ++w) {
        const unsigned int s = warp_sums[w];
        if (w < warp) before += s;
        sum += s;
    }
    *total = sum;
    return before + x - v;
}

// The sum of v over the warp, in every lane (all lanes call it): one REDUX on sm_80 and later,
// five shuffle-and-add steps before (the module still compiles for older GPUs).
__device__ __forceinline__ unsigned int kv_warp_sum(unsigned int v) {
#if __CUDA_ARCH__ >= 800
    return __reduce_add_sync(0xffffffffu, v);
#else
#pragma unroll
    for (unsigned int o = 16; o > 0u; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
#endif
}

__device__ __forceinline__ unsigned int kv_bit(const unsigned int* bits, unsigned int s) {
    return (bits[s >> 5] >> (s & 31u)) & 1u;
}

// Adds one thread's (or warp's) pick counters to the block's (shared) counters.
__device__ __forceinline__ void kv_add_counts(unsigned int* sh_count, unsigned int c_tail, unsigned int c_scr,
                                              unsigned int c_page, unsigned int c_hot, unsigned int bad) {
    atomicAdd(&sh_count[1], c_tail);
    atomicAdd(&sh_count[2], c_scr);
    atomicAdd(&sh_count[3], c_page);
    atomicAdd(&sh_count[4], c_hot);
    atomicAdd(&sh_count[7], bad);
}

// kv_add_counts with warp sums first (one shared add per counter per warp; all lanes call it).
__device__ __forceinline__ void kv_add_counts_warp(unsigned int* sh_count, unsigned int c_tail, unsigned int c_scr,
                                                   unsigned int c_page, unsigned int c_hot, unsigned int bad) {
    c_tail = kv_warp_sum(c_tail);
    c_scr = kv_warp_sum(c_scr);
    c_page = kv_warp_sum(c_page);
    c_hot = kv_warp_sum(c_hot);
    bad = kv_warp_sum(bad);
    if ((threadIdx.x & 31u) == 0u) kv_add_counts(sh_count, c_tail, c_scr, c_page, c_hot, bad);
}

// Thread 0 of an entry's block: its stats row from the block's counters (sh_count[1..5), [7]) and
// its bad positions into the error word.
__device__ __forceinline__ void kv_write_stats(const KvTables& t, unsigned int* st, const unsigned int* sh_count,
                                               unsigned int taken, bool direct) {
    st[0] = sh_count[1] + sh_count[2] + sh_count[3] + sh_count[4];
    st[1] = sh_count[1];
    st[2] = sh_count[2];
    st[3] = sh_count[3];
    st[4] = sh_count[4];
    st[5] = taken;
    st[6] = direct ? 1u : 0u;
    st[7] = sh_count[7];
    if (sh_count[7]) atomicAdd(&t.err[KV_ERR_BAD_POSITION], sh_count[7]);
}

// Victim selection by the whole block, exactly kv_pick_victims' result: the first `want` scan
// indices i in [0, 2n) whose take predicate holds (i < n: slot (hand + i) % n unpinned and empty
// or unreferenced; i >= n: slot (hand + i - n) % n unpinned, occupied and referenced), in scan order,
// into plan[rank].dst_row (slot numbers); *sh_taken, *sh_last (scan index of the last victim, -1 if
// none). `bits` holds 2 × ceil(n / 32) u32 of shared memory. Ends with the results in shared
// memory written by some thread: the caller synchronizes before reading them.
// INSTALL: the thread that finds victim `rank` also installs plan[rank] there (kv_install_one; the
// installs touch only global slot state, which the bitmaps no longer read, and distinct victims,
// distinct new positions and distinct old positions never collide), so plan[rank] is complete
// when the caller's barrier passes; `fp`: the slot's fixed pages (used only with INSTALL).
#define KV_VICTIM_BATCH 4

// Step 1 of kv_pick_victims_block: the two candidate bitmaps of a slot's hot rows from their state
// (stamp, position, mark) as it stands (this call's pins included). The caller
// synchronizes before the bitmaps are read.
__device__ void kv_victim_bits(const KvDims& d, const KvTables& t, unsigned int slot, unsigned long long call,
                               unsigned int* bits) {
    const unsigned int n = d.hot_rows, words = (n + 31u) >> 5, lane = threadIdx.x & 31u;
    const unsigned long long base = (unsigned long long)slot * n;
    // 1. candidate bits: a warp reads 32 consecutive slots (coalesced) and writes one word of each map;
    //    KV_VICTIM_BATCH such groups per warp have their loads issued together (one round trip per
    //    batch instead of one per group: hot 8192 at 1024 threads is 8 groups per warp).
    for (unsigned int g0 = threadIdx.x & ~31u; g0 < words * 32u; g0 += blockDim.x * KV_VICTIM_BATCH) {
        unsigned long long st[KV_VICTIM_BATCH], mk[KV_VICTIM_BATCH];
        int sp[KV_VICTIM_BATCH];
#pragma unroll
        for (unsigned int j = 0; j < KV_VICTIM_BATCH; ++j) {
            const unsigned int s = g0 + j * blockDim.x + lane;
            st[j] = kv_cold_stamp(call);  // out of range: pinned (no candidate)
            mk[j] = st[j];
            sp[j] = -1;
            if (s < n) {
                st[j] = t.stamp[base + s];
                sp[j] = t.slot_pos[base + s];
                mk[j] = t.mark[base + s];
            }
        }
#pragma unroll
        for (unsigned int j = 0; j < KV_VICTIM_BATCH; ++j) {
            const unsigned int s0 = g0 + j * blockDim.x;
            const bool pin = kv_pinned(st[j], call), empty = sp[j] < 0, ref = st[j] > mk[j];
            const bool l1 = !pin && (empty || !ref), l2 = !pin && !empty && ref;
            const unsigned int b1 = __ballot_sync(0xffffffffu, l1), b2 = __ballot_sync(0xffffffffu, l2);
            if (lane == 0u && s0 < words * 32u) {
                bits[s0 >> 5] = b1;
                bits[words + (s0 >> 5)] = b2;
            }
        }
    }
}

template <bool INSTALL>
__device__ void kv_pick_victims_block(const KvDims& d, const KvTables& t, unsigned int slot,
                                      unsigned long long call, KvCopy* plan, unsigned int want, unsigned int* bits,
                                      unsigned int* warp_sums, unsigned int* sh_taken, int* sh_last,
                                      unsigned int hand, const int* fp, unsigned short* vt, bool ready) {
    const unsigned int n = d.hot_rows, words = (n + 31u) >> 5;
    // 1. candidate bits (kv_victim_bits), unless the caller computed them already (`ready`).
    if (!ready) {
        kv_victim_bits(d, t, slot, call, bits);
        __syncthreads();
    }
    // 2. each thread counts a contiguous range of hand-rotated positions q (slot (hand + q) % n).
    const unsigned int per = (n + blockDim.x - 1u) / blockDim.x;
    const unsigned int q0 = min(threadIdx.x * per, n), q1 = min(q0 + per, n);
    unsigned int c1 = 0, c2 = 0;
    unsigned int s = hand + q0 >= n ? hand + q0 - n : hand + q0;
    for (unsigned int q = q0; q < q1; ++q) {
        c1 += kv_bit(bits, s);
        c2 += kv_bit(bits + words, s);
        if (++s == n) s = 0;
    }
    unsigned int t1, t2;
    unsigned int r1 = kv_block_scan_u32(c1, &t1, warp_sums);
    unsigned int r2 = kv_block_scan_u32(c2, &t2, warp_sums) + t1;
    const unsigned int taken = min(want, t1 + t2);
    // 3. lap-1 victims take ranks 0 .. t1, lap-2 victims t1 .. t1 + t2 (scan index n + q).
    if (r1 < taken || r2 < taken) {
        s = hand + q0 >= n ? hand + q0 - n : hand + q0;
        for (unsigned int q = q0; q < q1; ++q) {
            if (kv_bit(bits, s)) {
                if (r1 < taken) {
                    if (INSTALL) {
                        kv_install_one(d, t, slot, call, plan, r1, s, fp);
                        if (vt) vt[r1] = (unsigned short)s;
                    } else
                        plan[r1].dst_row = s;
                    if (r1 == taken - 1u) *sh_last = (int)q;
                }
                ++r1;
            }
            if (kv_bit(bits + words, s)) {
                if (r2 < taken) {
                    if (INSTALL) {
                        kv_install_one(d, t, slot, call, plan, r2, s, fp);
                        if (vt) vt[r2] = (unsigned short)s;
                    } else
                        plan[r2].dst_row = s;
                    if (r2 == taken - 1u) *sh_last = (int)(n + q);
                }
                ++r2;
            }
            if (++s == n) s = 0;
        }
    }
    if (threadIdx.x == 0) {
        *sh_taken = taken;
        if (taken == 0u) *sh_last = -1;
    }
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

// kv_finish_sweep_at from the candidate bitmaps of kv_pick_victims_block instead of the stamps: a
// visited slot not pinned by this call after the installs is one that was unpinned before them
// (a lap-1 or lap-2 bit: the two bits together mark exactly the unpinned slots) and not a victim; a
// victim's install already wrote mark = 2c (not referenced), so writing mark = 2c on every visited
// unpinned slot gives the same table. Saves the stamp reads.
__device__ void kv_finish_sweep_bits(const KvDims& d, const KvTables& t, unsigned int slot, unsigned long long call,
                                     unsigned int misses, unsigned int taken, int last, unsigned int hand,
                                     const unsigned int* bits) {
    const unsigned int n = d.hot_rows, words = (n + 31u) >> 5;
    const unsigned long long base = (unsigned long long)slot * n;
    const unsigned int visited = last < 0 ? 0u : min((unsigned int)last + 1u, n);
    for (unsigned int i = threadIdx.x; i < visited; i += blockDim.x) {
        const unsigned int s = (hand + i) % n;
        if (kv_bit(bits, s) | kv_bit(bits + words, s)) t.mark[base + s] = kv_cold_stamp(call);
    }
    // (No barrier: the hand is thread 0's own value, and the bitmaps are not written again.)
    if (threadIdx.x == 0 && misses > 0) {
        unsigned long long adv = last < 0 ? 0ull : (unsigned long long)last + 1ull;
        if (taken < misses) adv += 2ull * n + 1ull;  // one failing victim() call, as kv_finish_sweep_at
        t.hand[slot] = (unsigned int)((hand + adv) % n);
    }
}

// The lean engine's rank -> victim slot table (u16, dynamic shared memory after the fixed pages;
// present when hot_rows <= KV_LEAN_VICTIM_MAX, the launcher sizes it).
__device__ __forceinline__ unsigned short* kv_victim_table(const KvDims& d) {
    return (unsigned short*)(kv_dyn + 2u * ((d.hot_rows + 31u) >> 5) + d.fixed_pages);
}

// Steps C-G of a fast-engine entry (the lean engine shares them): after the block barrier that
// follows the claims, orders the first appearances (the plan's positions), picks CLOCK victims with
// the whole block, installs, does the sweep bookkeeping and gives each pending pick (KV_OUT_PENDING)
// its placed row or -1 (unserved). Returns the distinct misses and placed rows; adds placed picks
// to *c_hot. `p`, `out`: the thread's picks and outputs (f0 + i: flat index in the entry).
template <bool LEAN>
__device__ __forceinline__ void kv_fast_place(const KvDims& d, const KvTables& t, unsigned int slot,
                                              const int (&p)[KV_FAST_PER], int (&out)[KV_FAST_PER],
                                              unsigned int f0, unsigned long long call, KvCopy* __restrict__ plan,
                                              unsigned int* bits, unsigned int* warp_sums, const int* fp,
                                              unsigned int* sh_taken, int* sh_last, unsigned int hand,
                                              unsigned int* misses_out, unsigned int* taken_out,
                                              unsigned int* c_hot) {
    const unsigned long long pb = (unsigned long long)slot * d.max_history;
    unsigned int misses = 0;
    // C. owners of the first appearances, ordered by one block scan (each thread's picks are
    //    consecutive, so thread order is flat order); owners release their claims.
    //    The lean engine builds the victim candidate bitmaps while the claims' loads are in flight
    //    (the candidate state includes this call's pins, all made before the caller's barrier, and
    //    nothing before the victim search changes it); the barriers of the scan below publish them.
    int fr[KV_FAST_PER];
#pragma unroll
    for (unsigned int i = 0; i < KV_FAST_PER; ++i) fr[i] = out[i] == KV_OUT_PENDING ? t.first[pb + p[i]] : -1;
    if (LEAN) kv_victim_bits(d, t, slot, call, bits);
    bool own[KV_FAST_PER];
    unsigned int cnt = 0;
#pragma unroll
    for (unsigned int i = 0; i < KV_FAST_PER; ++i) {
        own[i] = out[i] == KV_OUT_PENDING && fr[i] == (int)(f0 + i);
        cnt += own[i];
    }
#pragma unroll
    for (unsigned int i = 0; i < KV_FAST_PER; ++i)
        if (own[i]) t.first[pb + p[i]] = KV_UNCLAIMED;
    unsigned int at = kv_block_scan_u32(cnt, &misses, warp_sums);
    // Lean with a victim table (hot_rows <= KV_LEAN_VICTIM_MAX): victim slot of each rank in shared
    // memory (u16, after the fixed pages), and each owner's rank kept in its output as
    // KV_OUT_OWNER - rank, so that step G reads no global memory for owners.
    const bool vt = LEAN && d.hot_rows <= KV_LEAN_VICTIM_MAX;
#pragma unroll
    for (unsigned int i = 0; i < KV_FAST_PER; ++i) {
        if (!own[i]) continue;
        if (at < d.hot_rows) plan[at].position = (unsigned int)p[i];
        if (vt) out[i] = KV_OUT_OWNER - (int)at;
        ++at;
    }
    const unsigned int want = min(misses, d.hot_rows);
    __syncthreads();
    // D. victims (whole block), E. installs, F. sweep bookkeeping
    if (want > 0u)
        kv_pick_victims_block<LEAN>(d, t, slot, call, plan, want, bits, warp_sums, sh_taken, sh_last, hand, fp,
                                    vt ? kv_victim_table(d) : nullptr, LEAN);
    else if (threadIdx.x == 0) {
        *sh_taken = 0u;
        *sh_last = -1;
    }
    __syncthreads();
    const unsigned int taken = *sh_taken;
    if (!LEAN) {  // the lean engine installed with the victims
        kv_install_at(d, t, slot, call, plan, taken, fp);
        __syncthreads();
    }
    // G. rows of the misses: placed (fetched below) or -1 (overflow, unserved). The lean engine
    // issues these loads before the sweep (which writes only reference marks and the hand, never
    // the position table) so that they overlap its stores, and needs no barrier after the sweep:
    // nothing later in the block reads what it writes or writes what it reads.
    int h[KV_FAST_PER];
    if (LEAN) {
        // An owner of rank `at` holds the victim of that rank, vt[at], if placed (at < taken), else
        // nothing (-1): what the position table holds for it after the installs.
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
        if (misses > 0u) kv_finish_sweep_bits(d, t, slot, call, misses, taken, *sh_last, hand, bits);
    } else {
        if (misses > 0u) {
            kv_finish_sweep_at(d, t, slot, call, misses, taken, *sh_last, hand);
            __syncthreads();
        }
#pragma unroll
        for (unsigned int i = 0; i < KV_FAST_PER; ++i) h[i] = out[i] == KV_OUT_PENDING ? t.pos_slot[pb + p[i]] : -1;
    }
#pragma unroll
    for (unsigned int i = 0; i < KV_FAST_PER; ++i) {
        if (out[i] != KV_OUT_PENDING) continue;
        out[i] = h[i] >= 0 ? kv_fixed_row_at(d, fp, (unsigned int)h[i]) : -1;
        *c_hot += h[i] >= 0;
    }
    *misses_out = misses;
    *taken_out = taken;
}

// One entry of the fast engine (slot validated, not shared with another entry of the call; rows
// row0 .. row1 with (row1 - row0) × k <= KV_FAST_PER × blockDim and row1 - row0 <= KV_FAST_MAX_ROWS).
// Writes the entry's rows, valid counts, plan, plan count, stats and error words like the classic body.
__device__ void kv_entry_fast(const KvDims& d, const KvTables& t, unsigned int slot, const KvSlotDesc& s, int limit,
                              const int* __restrict__ topk, const int* __restrict__ qseq, unsigned int row0,
                              unsigned int row1, unsigned int k, unsigned int layer, unsigned int fetch,
                              int* __restrict__ indices, int* __restrict__ valid_count, KvCopy* __restrict__ plan,
                              unsigned int* __restrict__ plan_count_r, unsigned int* __restrict__ stats_r,
                              unsigned int layout, unsigned long long call, unsigned int* bits, unsigned int* warp_sums,
                              unsigned int* sh_rowstart, unsigned int* sh_count, unsigned int* sh_taken, int* sh_last) {
    const unsigned int R = row1 - row0;
    const unsigned int F = R * k;
    // Picks per thread: as few as cover the entry (all threads busy at k = 2048: 2 each).
    const unsigned int per = min((unsigned int)KV_FAST_PER, (F + blockDim.x - 1u) / blockDim.x);
    const unsigned int f0 = threadIdx.x * per;
    const unsigned int fe = min(f0 + per, F);  // this thread's picks: f0 .. fe
    const unsigned long long hb = (unsigned long long)slot * d.hot_rows;
    const unsigned long long pb = (unsigned long long)slot * d.max_history;
    const int* const tk = topk + (unsigned long long)row0 * k;
    // The slot's fixed pages in shared memory (after the victim bitmaps): every fixed-row lookup
    // below (tail, scratch, hot rows, installs) reads them there instead of global memory.
    int* const fp = (int*)(bits + 2u * ((d.hot_rows + 31u) >> 5));
    {
        const int* const g = kv_slot_fixed(d, t, slot);
        for (unsigned int i = threadIdx.x; i < d.fixed_pages; i += blockDim.x) fp[i] = g[i];
    }
    int p[KV_FAST_PER], out[KV_FAST_PER];
    unsigned int c_tail = 0, c_scr = 0, c_page = 0, c_hot = 0, bad = 0;
    // A. picks, causal bounds, resident rows (tail / scratch / borrowed page)
#pragma unroll
    for (unsigned int i = 0; i < KV_FAST_PER; ++i) p[i] = f0 + i < fe ? tk[f0 + i] : -1;
    __syncthreads();  // fp
#pragma unroll
    for (unsigned int i = 0; i < KV_FAST_PER; ++i) {
        out[i] = -1;
        const unsigned int f = f0 + i;
        if (f >= fe || p[i] == -1) continue;
        const int rl = kv_row_limit(qseq, row0 + f / k, limit);
        if (p[i] < 0 || p[i] >= rl) {
            bad += 1u;
            continue;
        }
        int kind;
        const int rr = kv_resident_at(d, t, slot, s, (unsigned int)p[i], &kind, fp);
        if (rr >= 0) {
            out[i] = rr;
            c_scr += kind == 1;
            c_tail += kind == 2;
            c_page += kind == 3;
        } else {
            out[i] = KV_OUT_PENDING;
        }
    }
    // B. hot cache: pin hits, claim misses (direct path: look up only, no bookkeeping)
    int hs[KV_FAST_PER];
#pragma unroll
    for (unsigned int i = 0; i < KV_FAST_PER; ++i) hs[i] = out[i] == KV_OUT_PENDING ? t.pos_slot[pb + p[i]] : -1;
#pragma unroll
    for (unsigned int i = 0; i < KV_FAST_PER; ++i) {
        if (out[i] != KV_OUT_PENDING) continue;
        if (hs[i] >= 0) {
            if (s.full == 0u) kv_touch(t, hb + hs[i], call);
            out[i] = kv_fixed_row_at(d, fp, (unsigned int)hs[i]);
            c_hot++;
        } else if (s.full == 0u) {
            atomicMin(&t.first[pb + p[i]], (int)(f0 + i));
        } else {
            out[i] = -1;
        }
    }
    unsigned int misses = 0, taken = 0;
    if (s.full == 0u) {
        __syncthreads();
        kv_fast_place<false>(d, t, slot, p, out, f0, call, plan, bits, warp_sums, fp, sh_taken, sh_last,
                             t.hand[slot], &misses, &taken, &c_hot);
    }
    // H. outputs: one scan ranks the valid entries (packed position, per-row counts)
    const unsigned int rank = kv_rank_valid(out, f0, fe, k, R, warp_sums, sh_rowstart);
    __syncthreads();
    int* const base = indices + (unsigned long long)row0 * k;
    if (layout == KV_LAYOUT_PACKED) {
        kv_write_packed(out, f0, fe, k, R, rank, sh_rowstart, base);
    } else {
#pragma unroll
        for (unsigned int i = 0; i < KV_FAST_PER; ++i)
            if (f0 + i < fe) base[f0 + i] = out[i];
    }
    for (unsigned int rr = 0; rr < R; ++rr)
        if (threadIdx.x == 0) valid_count[row0 + rr] = (int)(sh_rowstart[rr + 1] - sh_rowstart[rr]);
    // The copy last: the outputs above are plain stores that need nothing from it.
    if (fetch && taken > 0u) kv_fetch(d, t, plan, taken, layer, fetch);
    // Stats (warp sums, then one shared add per warp).
    kv_add_counts_warp(sh_count, c_tail, c_scr, c_page, c_hot, bad);
    __syncthreads();
    if (threadIdx.x == 0) {
        *plan_count_r = taken;
        if (taken < misses) atomicAdd(&t.err[KV_ERR_OVERFLOW], misses - taken);
        kv_write_stats(t, stats_r, sh_count, taken, s.full != 0u && misses == 0u);
    }
}

// One entry of the classic engine (slot validated, not shared with another entry of the call): three
// passes over the picks (claim, ordered compaction, output), victims by warp 0. Also the fast and lean
// engines' path for entries over KV_FAST_PER x blockDim picks or KV_FAST_MAX_ROWS rows.
__device__ void kv_entry_classic(const KvDims& d, const KvTables& t, int sl, const KvSlotDesc& s, int limit,
                                 const int* __restrict__ topk, const int* __restrict__ qseq, unsigned int row0,
                                 unsigned int row1, unsigned int k, unsigned int layer, unsigned int fetch,
                                 int* __restrict__ indices, int* __restrict__ valid_count, KvCopy* __restrict__ plan,
                                 unsigned int* __restrict__ plan_count_r, unsigned int* __restrict__ stats_r,
                                 unsigned int layout, unsigned long long call, unsigned int* warp_sums,
                                 unsigned int* sh_count, unsigned int* sh_taken, int* sh_last) {
    const unsigned int slot = (unsigned int)sl;
    unsigned int bad = 0, misses = 0, taken = 0;
    // Direct path: the whole history is resident (tail + borrowed pages), nothing to place.
    if (s.full == 0u) {
        // 1. touch hits, claim misses
        for (unsigned int row = row0; row < row1; ++row) {
            const int rl = kv_row_limit(qseq, row, limit);
            for (unsigned int j = threadIdx.x; j < k; j += blockDim.x)
                kv_claim(d, t, slot, s, topk[(unsigned long long)row * k + j], rl, (int)((row - row0) * k + j),
                         call, &bad);
        }
        __syncthreads();
        // 2. ordered compaction of first appearances
        for (unsigned int row = row0; row < row1; ++row) {
            const int rl = kv_row_limit(qseq, row, limit);
            for (unsigned int j0 = 0; j0 < k; j0 += blockDim.x) {
                const unsigned int j = j0 + threadIdx.x;
                const int f = (int)((row - row0) * k + j);
                const int p = j < k ? topk[(unsigned long long)row * k + j] : -1;
                const bool own = j < k && kv_owner(d, t, slot, s, p, rl, f);
                unsigned int total;
                const unsigned int at = misses + kv_block_scan(own, &total, warp_sums);
                if (own && at < d.hot_rows) plan[at].position = (unsigned int)p;
                misses += total;
            }
        }
        // 3. victims (warp 0), 4. installs, 5. sweep bookkeeping
        taken = kv_place_warp(d, t, slot, call, plan, misses, sh_taken, sh_last);
        __syncthreads();
        // 6. fetch from mapped host memory
        if (fetch) kv_fetch(d, t, plan, taken, layer, fetch);
    } else {
        // Direct path: only the invalid picks need counting (the output pass skips them).
        for (unsigned int row = row0; row < row1; ++row) {
            const int rl = kv_row_limit(qseq, row, limit);
            for (unsigned int j = threadIdx.x; j < k; j += blockDim.x) {
                const int p = topk[(unsigned long long)row * k + j];
                bad += (p < -1 || (p >= 0 && p >= rl)) ? 1u : 0u;
            }
        }
    }
    if (threadIdx.x == 0) {
        *plan_count_r = taken;
        if (taken < misses) atomicAdd(&t.err[KV_ERR_OVERFLOW], misses - taken);
    }
    // 7. outputs, every element written
    unsigned int c_tail = 0, c_scr = 0, c_page = 0, c_hot = 0;
    for (unsigned int row = row0; row < row1; ++row) {
        const int rl = kv_row_limit(qseq, row, limit);
        int* const orow = indices + (unsigned long long)row * k;
        unsigned int valid = 0;
        for (unsigned int j0 = 0; j0 < k; j0 += blockDim.x) {
            const unsigned int j = j0 + threadIdx.x;
            int out = -1;
            if (j < k) {
                const int p = topk[(unsigned long long)row * k + j];
                if (p >= 0 && p < rl) {
                    int kind;
                    out = kv_resident(d, t, slot, s, (unsigned int)p, &kind);
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
            if (layout == KV_LAYOUT_PACKED) {
                // Packed: valid entries at the front in column order (exclusive block scan).
                unsigned int total;
                const unsigned int at = kv_block_scan(out >= 0, &total, warp_sums);
                if (out >= 0) orow[valid + at] = out;
                valid += total;
            } else {
                if (j < k) orow[j] = out;
                valid += (unsigned int)__syncthreads_count(out >= 0);
            }
        }
        // Packed: -1 after the valid entries (columns no thread of this row wrote above).
        if (layout == KV_LAYOUT_PACKED)
            for (unsigned int j = valid + threadIdx.x; j < k; j += blockDim.x) orow[j] = -1;
        if (threadIdx.x == 0) valid_count[row] = (int)valid;
    }
    kv_add_counts(sh_count, c_tail, c_scr, c_page, c_hot, bad);
    __syncthreads();
    if (threadIdx.x == 0) {
        kv_write_stats(t, stats_r, sh_count, taken, s.full != 0u && misses == 0u);
    }
}

// The fused resolve. Grid: sessions + 1 blocks (block `sessions` writes rows no request owns and the padding
// of oversized buffers). Outputs: indices int32 [idx_len >= rows * k] (row stride k), valid_count int32
// [valid_len >= rows], plan [sessions][hot_rows] with plan_count [pc_len >= sessions] (entries past sessions
// written 0), stats [sessions][KV_STATS].
// fetch = n > 0: gather misses into layers [layer, layer + n) now (a layer group's planes); 0: leave copies to
// the caller (DMA). layout: 0 in place, 1 packed.
// qseq: int32 [rows] per-query causal bound, or null (the entry's seq_len for every row).
// FAST = false: the classic body (`tierkit_kv_resolve`); true: entries that fit take kv_entry_fast
// (`tierkit_kv_resolve_fast`, dynamic shared memory 2 × ceil(hot_rows / 32) u32 + fixed_pages int32).
#define KV_RESOLVE_PARAMS                                                                                     \
    KvDims d, KvTables t, const int* __restrict__ topk, const int* __restrict__ qsl,                          \
        const int* __restrict__ seq_lens, const int* __restrict__ session_slot, unsigned int sessions,         \
        unsigned int rows, unsigned int k, unsigned int layer, unsigned int fetch, int* __restrict__ indices,  \
        int* __restrict__ valid_count, KvCopy* __restrict__ plan_all, unsigned int* __restrict__ plan_count,   \
        unsigned int* __restrict__ stats, unsigned int layout, const int* __restrict__ qseq,                   \
        unsigned long long idx_len, unsigned long long valid_len, unsigned long long pc_len, KvDivs dv
#define KV_RESOLVE_ARGS                                                                                        \
    d, t, topk, qsl, seq_lens, session_slot, sessions, rows, k, layer, fetch, indices, valid_count, plan_all,  \
        plan_count, stats, layout, qseq, idx_len, valid_len, pc_len, dv

template <bool FAST>
__device__ __forceinline__ void kv_resolve_body(KV_RESOLVE_PARAMS) {
    __shared__ unsigned long long sh_call;
    __shared__ unsigned int warp_sums[32];
    __shared__ unsigned int sh_taken, sh_count[KV_STATS];
    __shared__ int sh_last;
    __shared__ unsigned int sh_rowstart[KV_FAST_MAX_ROWS + 1];
    if (threadIdx.x < KV_STATS) sh_count[threadIdx.x] = 0u;
    __syncthreads();
    const unsigned int r = blockIdx.x;

    if (!kv_qsl_ok(qsl, sessions, rows)) {
        kv_refuse_call(t, sessions, rows, k, indices, valid_count, plan_count, stats);
    } else if (r == sessions) {
        kv_fill_rows(indices, valid_count, 0, (unsigned int)qsl[0], k);
        kv_fill_rows(indices, valid_count, (unsigned int)qsl[sessions], rows, k);
    } else {
        const unsigned int row0 = (unsigned int)qsl[r], row1 = (unsigned int)qsl[r + 1];
        const int sl = session_slot[r];
        const int limit = seq_lens[r];
        bool ok = sl >= 0 && (unsigned int)sl < d.max_slots;
        KvSlotDesc s = {};
        if (ok) {
            s = t.desc[sl];
            ok = s.live != 0u && limit >= 1 && (unsigned int)limit <= s.committed + s.scratch_len;
        }
        if (ok) {
            // The slot's call counter (thread 0; published by the barrier below). Only this block
            // writes it during the call: a repeated slot is refused for every entry naming it.
            if (threadIdx.x == 0) sh_call = t.call[sl] + 1ull;
            // A slot named by another request of this call is refused for every request naming it:
            // two blocks must never update one slot's hot cache (uniform: `ok` is block-wide).
            bool dup = false;
            for (unsigned int i = threadIdx.x; i < sessions; i += blockDim.x) dup |= i != r && session_slot[i] == sl;
            ok = !__syncthreads_or(dup);
        }
        const unsigned long long call = ok ? sh_call : 0ull;
        if (ok && threadIdx.x == 0) t.call[sl] = call;  // published by the kernel's end
        if (!ok) {
            kv_refuse_entry(t, row0, row1, k, indices, valid_count, plan_count + r, stats + r * KV_STATS);
        } else if (FAST && (row1 - row0) <= KV_FAST_MAX_ROWS &&
                   (unsigned long long)(row1 - row0) * k <= (unsigned long long)KV_FAST_PER * blockDim.x) {
            kv_entry_fast(d, t, (unsigned int)sl, s, limit, topk, qseq, row0, row1, k, layer, fetch, indices,
                          valid_count, plan_all + (unsigned long long)r * d.hot_rows, plan_count + r,
                          stats + r * KV_STATS, layout, call, kv_dyn, warp_sums, sh_rowstart, sh_count, &sh_taken,
                          &sh_last);
        } else {
            kv_entry_classic(d, t, sl, s, limit, topk, qseq, row0, row1, k, layer, fetch, indices, valid_count,
                             plan_all + (unsigned long long)r * d.hot_rows, plan_count + r, stats + r * KV_STATS,
                             layout, call, warp_sums, sh_count, &sh_taken, &sh_last);
        }
    }
    if (blockIdx.x == sessions) kv_fill_pad(indices, valid_count, rows, k, idx_len, valid_len, plan_count, sessions, pc_len);
}

extern "C" __global__ void __launch_bounds__(1024) tierkit_kv_resolve(KV_RESOLVE_PARAMS) {
    kv_resolve_body<false>(KV_RESOLVE_ARGS);
}

extern "C" __global__ void __launch_bounds__(1024) tierkit_kv_resolve_fast(KV_RESOLVE_PARAMS) {
    kv_resolve_body<true>(KV_RESOLVE_ARGS);
}

// ---------------------------------------------------------------------------------------------
// The lean engine (`tierkit_kv_resolve_lean`): the fast engine's decisions (and its steps C-G,
// kv_fast_place) with the chain of dependent global round trips and barriers cut short; see
// DESIGN.md, "Lean resolve engine":
// 1. every load that depends on no other load is issued at once (the query_start_loc check, the
//    entry's qsl words, slot and seq_len, the repeated-slot scan); as soon as those arrive, before
//    any barrier, the slot's descriptor, call counter and fixed pages, the entry's picks and per-query
//    bounds; then per pick the page-table and position-table entries (both addresses depend only
//    on the slot and the pick). These are reads of tables no other block writes during the call,
//    bounds-checked on the entry's own words; the call is validated after them.
// 2. one barrier validates the call (query_start_loc, repeated slot); a second pair only when it failed;
//    before it, every warp previews its picks' classes into shared partials (kv_lean_classify), and
//    a quiet entry (no miss, in place, no flagged warp) finishes from them with no further barrier;
// 3. the call counter is the slot's own (thread 0 reads it in trip 2 and stores it + 1 once the entry
//    is accepted): no block waits for another, and there is no call-wide ticket;
// 4. steps C-G run only when some pick of the entry missed (one __syncthreads_or), the direct path
//    (s.full) does no hot-cache bookkeeping at all;
// 5. in-place rows count their valid entries with per-row shared counters (no block scan).
// 1024 threads per block (ResolveEngine::Lean) or 512 (Lean512); entries over KV_FAST_PER x blockDim
// picks or KV_FAST_MAX_ROWS rows take the classic entry. Dynamic shared memory as the fast engine.
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
// pj: each pick's page (its page-table index, read in trip 2). Returns whether the warp has a
// pick of a fixed-row class (warp-uniform). All lanes call it.
__device__ __forceinline__ bool kv_lean_classify(const KvDims& d, const KvDivs& dv, const KvSlotDesc& s, int limit,
                                                 const int (&p)[KV_FAST_PER], const int (&rl)[KV_FAST_PER],
                                                 const int (&pg)[KV_FAST_PER], const unsigned int (&pj)[KV_FAST_PER],
                                                 const int (&hs)[KV_FAST_PER],
                                                 unsigned int f0, unsigned int fe, unsigned int per, unsigned int F,
                                                 unsigned int k, bool slow, unsigned int* part, unsigned int* cls,
                                                 int (&v)[KV_FAST_PER]) {
    const bool full = s.full != 0u;
    unsigned int w0 = 0u, w1 = 0u, c = 0u;
#pragma unroll
    for (unsigned int i = 0; i < KV_FAST_PER; ++i) {
        v[i] = -1;
        // Picks past the thread's share were loaded as -1 (kv_load_picks), so -1 covers them.
        if (f0 + i >= fe || p[i] == -1) continue;
        if (p[i] < 0 || p[i] >= min(rl[i], limit)) {
            c |= KV_PICK_BAD << (3u * i);
            w1 += 1u << 8;
            continue;
        }
        const unsigned int q = (unsigned int)p[i];
        // The common class first: a borrowed page serves q only below the tail (tail_start <=
        // committed), so testing it before scratch and tail decides the same class.
        if (q < s.tail_start && pg[i] >= 0) {
            c |= KV_PICK_PAGE << (3u * i);
            v[i] = pg[i] * (int)d.page_rows + (int)(q - pj[i] * d.page_rows);  // pj: q's page (trip 2)
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
        } else if (hs[i] >= 0) {
            c |= KV_PICK_HOT << (3u * i);
            v[i] = hs[i];
            w0 += 1u;
            w1 += 1u;
            slow |= (unsigned int)hs[i] >= d.hot_rows;
        } else if (!full) {
            c |= KV_PICK_MISS << (3u * i);
            v[i] = p[i];
            w1 += 1u << 16;
        }
    }
    *cls = c;
    const unsigned int a = (threadIdx.x & ~31u) * per, b = min(a + 32u * per, F);
    slow |= a < b && kv_quo(dv.k, a) != kv_quo(dv.k, b - 1u);
    w1 += slow ? 1u << 24 : 0u;
    w0 = kv_warp_sum(w0);
    w1 = kv_warp_sum(w1);
    if ((threadIdx.x & 31u) == 0u) {
        part[(threadIdx.x >> 5) * KV_LEAN_PARTS] = w0;
        part[(threadIdx.x >> 5) * KV_LEAN_PARTS + 1u] = w1;
    }
    return ((w0 >> 8) & 0xffffu) != 0u || (w1 & 0xffu) != 0u;  // the warp has a tail, scratch or hot pick
}

// After the validating barrier: whether no warp of the block raised a preview flag (block-uniform).
__device__ __forceinline__ bool kv_lean_quiet(const unsigned int* part) {
    const unsigned int lane = threadIdx.x & 31u;
    return !__any_sync(0xffffffffu, lane < (blockDim.x >> 5) && (part[lane * KV_LEAN_PARTS + 1u] >> 16) != 0u);
}

// Stores a thread's consecutive outputs o[0 .. n): one 16- or 8-byte store when n and the address allow.
__device__ __forceinline__ void kv_store_picks(int* o, const int (&out)[KV_FAST_PER], unsigned int n) {
    const unsigned long long a = (unsigned long long)(size_t)o;
    if (n == 4u && (a & 15u) == 0u) {
        *(int4*)o = make_int4(out[0], out[1], out[2], out[3]);
    } else if (n == 2u && (a & 7u) == 0u) {
        *(int2*)o = make_int2(out[0], out[1]);
    } else {
#pragma unroll
        for (unsigned int i = 0; i < KV_FAST_PER; ++i)
            if (i < n) o[i] = out[i];
    }
}

// Loads a thread's consecutive picks p[0 .. n) (-1 beyond n): one 16- or 8-byte load when n and the
// address allow.
__device__ __forceinline__ void kv_load_picks(const int* g, int (&p)[KV_FAST_PER], unsigned int n) {
    const unsigned long long a = (unsigned long long)(size_t)g;
    if (n == 4u && (a & 15u) == 0u) {
        const int4 v = *(const int4*)g;
        p[0] = v.x;
        p[1] = v.y;
        p[2] = v.z;
        p[3] = v.w;
    } else if (n == 2u && (a & 7u) == 0u) {
        const int2 v = *(const int2*)g;
        p[0] = v.x;
        p[1] = v.y;
        p[2] = -1;
        p[3] = -1;
    } else {
#pragma unroll
        for (unsigned int i = 0; i < KV_FAST_PER; ++i) p[i] = i < n ? g[i] : -1;
    }
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
__device__ __forceinline__ void kv_lean_counts(const KvTables& t, const unsigned int* part, unsigned int per,
                                               unsigned int F, unsigned int R, const KvDiv& k, unsigned int row0,
                                               bool full, int* __restrict__ valid_count,
                                               unsigned int* __restrict__ plan_count_r,
                                               unsigned int* __restrict__ st) {
    const unsigned int lane = threadIdx.x & 31u, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const unsigned int wp = 32u * per;
    const bool has = lane < nw && lane * wp < F;
    for (unsigned int row = warp; row < R; row += nw) {
        const unsigned int v =
            kv_warp_sum(has && kv_quo(k, lane * wp) == row ? part[lane * KV_LEAN_PARTS] & 0xffu : 0u);
        if (lane == 0u) valid_count[row0 + row] = (int)v;
    }
    if (warp == nw - 1u) {
        unsigned int c[5];  // tail, scratch, page, hot, bad
        kv_lean_part_sums(part, has, c);
        if (lane == 0u) {
            *plan_count_r = 0u;
            st[0] = c[0] + c[1] + c[2] + c[3];
            st[1] = c[0];
            st[2] = c[1];
            st[3] = c[2];
            st[4] = c[3];
            st[5] = 0u;
            st[6] = full ? 1u : 0u;
            st[7] = c[4];
            if (c[4]) atomicAdd(&t.err[KV_ERR_BAD_POSITION], c[4]);
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
// one store per thread, the counts from the preview's partials; no barrier.
__device__ __forceinline__ void kv_entry_lean_quiet(const KvDims& d, const KvDivs& dv, const KvTables& t, unsigned int slot,
                                                    bool full, bool fixed_any, unsigned int cls,
                                                    const int (&v)[KV_FAST_PER], unsigned int f0, unsigned int fe,
                                                    unsigned int per,
                                                    unsigned int F, unsigned int R, unsigned int row0,
                                                    unsigned int k, int* __restrict__ indices,
                                                    int* __restrict__ valid_count,
                                                    unsigned int* __restrict__ plan_count_r,
                                                    unsigned int* __restrict__ stats_r, unsigned long long call,
                                                    const int* fp, const unsigned int* part) {
    int out[KV_FAST_PER];
    kv_lean_outputs(dv.page, t, (unsigned long long)slot * d.hot_rows, full, fixed_any, cls, v, call, fp, out);
    kv_store_picks(indices + (unsigned long long)row0 * k + f0, out, fe > f0 ? fe - f0 : 0u);
    kv_lean_counts(t, part, per, F, R, dv.k, row0, full, valid_count, plan_count_r, stats_r);
}

// One entry of the lean engine, after the validating barrier, when the quiet finish does not apply
// (a miss, the packed layout, or a flagged warp): steps A + B from the preview's classes
// (kv_lean_outputs; missed picks claimed on the slot's `first` table), C-G when something missed,
// then the outputs, valid counts and stats. cls, v: the preview's classes and values; fp: the
// slot's fixed pages (shared); part: the preview's per-warp partials, whose tail, scratch, page,
// hot and bad counts, plus the picks placed by C-G, make the stats row.
__device__ __forceinline__ void kv_entry_lean(const KvDims& d, const KvDivs& dv, const KvTables& t, unsigned int slot,
                                              const KvSlotDesc& s, bool fixed_any, unsigned int cls,
                                              const int (&v)[KV_FAST_PER], unsigned int f0, unsigned int fe,
                                              unsigned int per, unsigned int F, unsigned int R, unsigned int row0,
                                              unsigned int k, unsigned int layer, unsigned int fetch,
                                              int* __restrict__ indices, int* __restrict__ valid_count,
                                              KvCopy* __restrict__ plan, unsigned int* __restrict__ plan_count_r,
                                              unsigned int* __restrict__ stats_r, unsigned int layout,
                                              unsigned long long call, unsigned int* bits, const int* fp,
                                              const unsigned int* part, unsigned int* warp_sums,
                                              unsigned int* sh_rows, unsigned int* sh_count,
                                              unsigned int* sh_taken, int* sh_last, unsigned int hand) {
    const bool full = s.full != 0u;
    int out[KV_FAST_PER];
    kv_lean_outputs(dv.page, t, (unsigned long long)slot * d.hot_rows, full, fixed_any, cls, v, call, fp, out);
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
    if (!full && __syncthreads_or(miss))
        kv_fast_place<true>(d, t, slot, v, out, f0, call, plan, bits, warp_sums, fp, sh_taken, sh_last, hand,
                            &misses, &taken, &c_hot);
    // H. outputs. Packed: one scan ranks the valid entries; in place: per-row shared counters.
    const bool packed = layout == KV_LAYOUT_PACKED;
    int* const base = indices + (unsigned long long)row0 * k;
    unsigned int rank = 0;
    if (packed) {
        rank = kv_rank_valid(out, f0, fe, k, R, warp_sums, sh_rows);
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
    kv_lean_stat_counts(part, per, F, sh_count);
    c_hot = kv_warp_sum(c_hot);
    if ((threadIdx.x & 31u) == 0u && c_hot) atomicAdd(&sh_count[4], c_hot);
    __syncthreads();
    if (packed) kv_write_packed(out, f0, fe, k, R, rank, sh_rows, base);
    if (threadIdx.x < R)
        valid_count[row0 + threadIdx.x] =
            (int)(packed ? sh_rows[threadIdx.x + 1] - sh_rows[threadIdx.x] : sh_rows[threadIdx.x]);
    // The copy last: the outputs above are plain stores that need nothing from it.
    if (fetch && taken > 0u) kv_fetch(d, t, plan, taken, layer, fetch);
    if (threadIdx.x == 0) {
        *plan_count_r = taken;
        if (taken < misses) atomicAdd(&t.err[KV_ERR_OVERFLOW], misses - taken);
        kv_write_stats(t, stats_r, sh_count, taken, full && misses == 0u);
    }
}

__device__ __forceinline__ void kv_resolve_lean_body(KV_RESOLVE_PARAMS) {
    __shared__ unsigned int warp_sums[32];
    __shared__ unsigned int sh_taken, sh_count[KV_STATS];
    __shared__ int sh_last;
    __shared__ unsigned int sh_rows[KV_FAST_MAX_ROWS + 1];
    // Written by kv_lean_classify before the validating barrier, read after it (kv_lean_quiet,
    // kv_lean_counts, kv_lean_stat_counts): nothing else may write it in between.
    __shared__ unsigned int sh_part[32 * KV_LEAN_PARTS];
    __shared__ unsigned long long sh_call;
    const unsigned int r = blockIdx.x, tid = threadIdx.x;
#ifdef KV_ABL_EMPTY
    return;  // ablation (TIERKIT_NVRTC_DEFINES): the launch alone
#endif
    if (tid < KV_STATS) sh_count[tid] = 0u;
    if (tid <= KV_FAST_MAX_ROWS) sh_rows[tid] = 0u;
    // Round trip 1: loads that depend on no other load, all issued before any is used: the entry's
    // words, its picks (speculatively, below), and the call-wide checks' words.
    const bool entry = r < sessions;
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
    int p[KV_FAST_PER];
    {
        const unsigned int gF = guess ? m * k : 0u;
        const unsigned int g0 = tid * dv.gper, ge = min(g0 + dv.gper, gF);
        kv_load_picks(topk + (unsigned long long)(guess ? r * m : 0u) * k + g0, p, ge > g0 ? ge - g0 : 0u);
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
    const bool lean = rows_in && R <= KV_FAST_MAX_ROWS && k <= KV_FAST_PER * blockDim.x &&
                      R * k <= KV_FAST_PER * blockDim.x;
    const unsigned int F = lean ? R * k : 0u;
    const unsigned int per = min((unsigned int)KV_FAST_PER, (F + blockDim.x - 1u) >> lb);
    const unsigned int f0 = tid * per, fe = min(f0 + per, F);
    const int* const tk = topk + (unsigned long long)(lean ? q0 : 0) * k;
    // Block-uniform: the guess holds iff this entry's rows are r x m .. r x m + m (then F, per, f0
    // and fe equal the guessed ones, `lean` and `guess` having the same bounds).
    if (!(guess && lean && (unsigned int)q0 == r * m && R == m)) kv_load_picks(tk + f0, p, fe > f0 ? fe - f0 : 0u);
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
    int pg[KV_FAST_PER], hs[KV_FAST_PER];
    unsigned int pj[KV_FAST_PER];  // each pick's page (reused by the classification)
#pragma unroll
    for (unsigned int i = 0; i < KV_FAST_PER; ++i) {
        const unsigned int q = (unsigned int)p[i];  // >= 2^31 for a negative pick
        const unsigned int j = kv_quo(dv.page, q);  // meaningful only for q < 2^31
        const bool look = slot_in && p[i] >= 0;
        pj[i] = j;
        pg[i] = look && j < d.max_pages ? ptab[j] : -1;
        hs[i] = look && q < d.max_history ? pslot[q] : -1;
    }
    int rl[KV_FAST_PER];
#pragma unroll
    for (unsigned int i = 0; i < KV_FAST_PER; ++i) rl[i] = KV_NO_BOUND;
    if (qseq != nullptr) {  // a launch-wide branch: without per-query bounds none of this issues
#pragma unroll
        for (unsigned int i = 0; i < KV_FAST_PER; ++i)
            if (f0 + i < fe) rl[i] = qseq[(unsigned int)q0 + kv_quo(dv.k, f0 + i)];
    }
    int* const fp = (int*)(kv_dyn + 2u * ((d.hot_rows + 31u) >> 5));
    bool fp_slow = false;  // a fixed row of this thread's pages could be negative
    if (slot_in) {
        for (unsigned int i = tid; i < d.fixed_pages; i += blockDim.x) {
            const int v = i == tid ? fp_first : g[i];
            fp[i] = v;
            fp_slow |= (unsigned int)v > dv.fp_max;  // negative, or its last row overflows an int
        }
    }
    // Preview of the picks' classes into the warp partials (folded into the validating barrier).
    unsigned int cls;
    int v[KV_FAST_PER];
    const bool fixed_any = kv_lean_classify(d, dv, s, limit, p, rl, pg, pj, hs, f0, fe, per, F, k, fp_slow, sh_part, &cls, v);
    // The validating barrier (it also publishes sh_call).
    bool qsl_bad = false, dup_any = false;
    if (__syncthreads_or(bad_qsl | dup)) {
        qsl_bad = __syncthreads_or(bad_qsl);
        dup_any = __syncthreads_or(dup);
    }
    const unsigned long long call = sh_call;
    if (qsl_bad) {
        kv_refuse_call(t, sessions, rows, k, indices, valid_count, plan_count, stats);
    } else if (r == sessions) {
        kv_fill_rows(indices, valid_count, 0, (unsigned int)qsl[0], k);
        kv_fill_rows(indices, valid_count, (unsigned int)qsl[sessions], rows, k);
    } else {
        const unsigned int row0 = (unsigned int)q0, row1 = (unsigned int)q1;
        const bool ok = slot_in && !dup_any && s.live != 0u && limit >= 1 &&
                        (unsigned int)limit <= s.committed + s.scratch_len;
        KvCopy* const plan = plan_all + (unsigned long long)r * d.hot_rows;
        // The slot's call number advances with each accepted entry (the kernel's end publishes it
        // to the next launch and to a prefetch that follows this resolve on the stream).
        if (ok && tid == 0) t.call[sl] = call;
        if (!ok) {
            kv_refuse_entry(t, row0, row1, k, indices, valid_count, plan_count + r, stats + r * KV_STATS);
        } else if (lean && layout != KV_LAYOUT_PACKED && kv_lean_quiet(sh_part)) {
            kv_entry_lean_quiet(d, dv, t, (unsigned int)sl, s.full != 0u, fixed_any, cls, v, f0, fe, per, F, R, row0, k, indices,
                                valid_count, plan_count + r, stats + r * KV_STATS, call, fp, sh_part);
        } else if (lean) {
            kv_entry_lean(d, dv, t, (unsigned int)sl, s, fixed_any, cls, v, f0, fe, per, F, R, row0, k, layer, fetch,
                          indices, valid_count, plan, plan_count + r, stats + r * KV_STATS, layout, call, kv_dyn, fp,
                          sh_part, warp_sums, sh_rows, sh_count, &sh_taken, &sh_last, hand);
        } else {
            kv_entry_classic(d, t, sl, s, limit, topk, qseq, row0, row1, k, layer, fetch, indices, valid_count, plan,
                             plan_count + r, stats + r * KV_STATS, layout, call, warp_sums, sh_count, &sh_taken,
                             &sh_last);
        }
    }
    if (r == sessions) kv_fill_pad(indices, valid_count, rows, k, idx_len, valid_len, plan_count, sessions, pc_len);
}

// ResolveEngine::Lean: 1024 threads (64 registers per thread at most).
extern "C" __global__ void __launch_bounds__(1024) tierkit_kv_resolve_lean(KV_RESOLVE_PARAMS) {
    kv_resolve_lean_body(KV_RESOLVE_ARGS);
}

// ResolveEngine::Lean512: the same body compiled for 512 threads (up to 128 registers: no spills).
extern "C" __global__ void __launch_bounds__(512) tierkit_kv_resolve_lean512(KV_RESOLVE_PARAMS) {
    kv_resolve_lean_body(KV_RESOLVE_ARGS);
}

// Whether hot row `c.dst_row` of slot `c.slot` still holds `c.position` in these tables (a layer group's).
__device__ __forceinline__ bool kv_plan_fresh(const KvDims& d, const KvTables& t, const KvCopy& c) {
    if (c.slot >= d.max_slots || c.position >= d.max_history) return false;
    const int hs = t.pos_slot[(unsigned long long)c.slot * d.max_history + c.position];
    return hs >= 0 && kv_fixed_row(d, t, c.slot, (unsigned int)hs) == (int)c.dst_row;
}

// Plan replay into layers [l0, l0 + nl): block b copies plan[b * stride .. + count[b]].
// check = 0: copy every entry (the caller knows the rows: page fills); 1: copy nothing, count entries whose
// destination no longer holds the position; 2: copy each entry whose destination still holds its position in
// these tables (a plan replayed into its own layer group), skip and count the others (a stale plan, or one of
// another group, whose rows hold other positions here).
extern "C" __global__ void tierkit_kv_replay(KvDims d, KvTables t, const KvCopy* __restrict__ plan,
                                             const unsigned int* __restrict__ count, unsigned int stride,
                                             unsigned int l0, unsigned int nl, unsigned int check) {
    const KvCopy* p = plan + (unsigned long long)blockIdx.x * stride;
    const unsigned int n = min(count[blockIdx.x], stride);
    if (check == 2u) {
        const unsigned int lane = threadIdx.x & 31u, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
        for (unsigned long long w = warp; w < (unsigned long long)n * nl; w += nw) {
            const unsigned int i = (unsigned int)(w % n), l = l0 + (unsigned int)(w / n);
            const KvCopy c = p[i];
            if (!kv_plan_fresh(d, t, c) || c.dst_row >= d.arena_rows || l >= d.layers) {
                if (lane == 0 && w < n) atomicAdd(&t.err[KV_ERR_STALE_PLAN], 1u);
                continue;
            }
            kv_warp_copy(t.arena + kv_plane(d, l) + (unsigned long long)c.dst_row * d.row_bytes,
                         t.host + kv_host_off(d, c.slot, c.position, l), d.row_bytes, lane);
        }
        return;
    }
    if (check) {
        unsigned int stale = 0;
        for (unsigned int i = threadIdx.x; i < n; i += blockDim.x) stale += !kv_plan_fresh(d, t, p[i]);
        if (stale) atomicAdd(&t.err[KV_ERR_STALE_PLAN], stale);
        return;
    }
    kv_fetch(d, t, p, n, l0, nl);
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
        const unsigned int at = misses + kv_block_scan(own, &total, warp_sums);
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

// Write-back of new rows to the host store (mapped pinned memory), layers [l0, l0 + nl):
// items[i] = (slot, position, src arena row). One warp per (item, layer); ordered on the stream.
extern "C" __global__ void tierkit_kv_write_back(KvDims d, KvTables t, const KvCopy* __restrict__ items,
                                                 unsigned int n, unsigned int l0, unsigned int nl) {
    const unsigned int lane = threadIdx.x & 31u;
    const unsigned long long w = ((unsigned long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (w >= (unsigned long long)n * nl) return;
    const unsigned int i = (unsigned int)(w % n), l = l0 + (unsigned int)(w / n);
    const KvCopy c = items[i];
    if (c.slot >= d.max_slots || c.position >= d.max_history || c.dst_row >= d.arena_rows) {
        if (lane == 0) atomicAdd(&t.err[KV_ERR_BAD_SESSION], 1u);
        return;
    }
    kv_warp_copy(t.host + kv_host_off(d, c.slot, c.position, l),
                 t.arena + kv_plane(d, l) + (unsigned long long)c.dst_row * d.row_bytes, d.row_bytes, lane);
}

// Table patches (kv-elastic's GPU pool, between steps, on the step stream): block b sets
// fills[b].count u32 words at fills[b].dst to fills[b].value. Blocks run in any order: one launch
// must not name a word twice with different values (the host deduplicates; ranges of one launch
// are disjoint or equal-valued).
extern "C" __global__ void tierkit_kv_fill_words(const KvFill* __restrict__ fills, unsigned int n) {
    if (blockIdx.x >= n) return;
    const KvFill f = fills[blockIdx.x];
    unsigned int* dst = (unsigned int*)f.dst;
    for (unsigned int i = threadIdx.x; i < f.count; i += blockDim.x) dst[i] = f.value;
}
