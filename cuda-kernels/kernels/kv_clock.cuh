// tierkit: the hot cache's CLOCK (second chance with per-call pins) on the device: row state,
// victim selection by one warp (classic path, prefetch) or by the whole block from candidate
// bitmaps (lean path), installs and the sweep's bookkeeping. The same victims, in the same order,
// as kv-elastic's CPU reference (HotCache::victim); DESIGN.md, "Hot-row state".

// Hot-row CLOCK state, two u64 per row (DESIGN.md, "Hot-row state"): a hit in call c writes stamp =
// 2c + 1, an install stamp = mark = 2c, the sweep mark = 2c; pinned iff stamp >> 1 == c, referenced
// iff stamp > mark.
__device__ __forceinline__ unsigned long long kv_hit_stamp(unsigned long long call) { return 2ull * call + 1ull; }
__device__ __forceinline__ unsigned long long kv_cold_stamp(unsigned long long call) { return 2ull * call; }

__device__ __forceinline__ bool kv_pinned(unsigned long long stamp, unsigned long long call) {
    return (stamp >> 1) == call;
}

__device__ __forceinline__ void kv_touch(const KvTables& t, unsigned long long row, unsigned long long call) {
    t.stamp[row] = kv_hit_stamp(call);
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
    kv_install_at(d, t, slot, call, plan, taken, kv_slot_fixed(d, t, slot));
    __syncthreads();
    kv_finish_sweep_at(d, t, slot, call, misses, taken, *sh_last, t.hand[slot]);
    return taken;
}

// Victim selection by the whole block, exactly kv_pick_victims' result: the first `want` scan
// indices i in [0, 2n) whose take predicate holds (i < n: slot (hand + i) % n unpinned and empty
// or unreferenced; i >= n: slot (hand + i - n) % n unpinned, occupied and referenced), in scan order,
// into plan[rank].dst_row (slot numbers); *sh_taken, *sh_last (scan index of the last victim, -1 if
// none). `bits` holds 2 × ceil(n / 32) u32 of shared memory. Ends with the results in shared
// memory written by some thread: the caller synchronizes before reading them.
// The thread that finds victim `rank` also installs plan[rank] there (kv_install_one; the installs
// touch only global slot state, which the bitmaps no longer read, and distinct victims, distinct
// new positions and distinct old positions never collide), so plan[rank] is complete when the
// caller's barrier passes; sh.fp: the slot's fixed pages. (kv_pick_victims_block, below.)
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

__device__ __forceinline__ void kv_pick_victims_block(const KvDims& d, const KvTables& t, const KvEntry& e, KvCopy* plan,
                                      unsigned int want, const KvShared& sh, unsigned short* vt) {
    const unsigned int n = d.hot_rows, words = (n + 31u) >> 5, hand = e.hand;
    const unsigned int* const bits = sh.bits;
    // 1. the candidate bits (kv_victim_bits) were computed by the caller and published by its barrier.
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
    unsigned int r1 = kv_block_scan_u32(c1, &t1, sh.warp_sums);
    unsigned int r2 = kv_block_scan_u32(c2, &t2, sh.warp_sums) + t1;
    const unsigned int taken = min(want, t1 + t2);
    // 3. lap-1 victims take ranks 0 .. t1, lap-2 victims t1 .. t1 + t2 (scan index n + q).
    if (r1 < taken || r2 < taken) {
        s = hand + q0 >= n ? hand + q0 - n : hand + q0;
        for (unsigned int q = q0; q < q1; ++q) {
            if (kv_bit(bits, s)) {
                if (r1 < taken) {
                    kv_install_one(d, t, e.slot, e.call, plan, r1, s, sh.fp);
                    if (vt) vt[r1] = (unsigned short)s;
                    if (r1 == taken - 1u) *sh.last = (int)q;
                }
                ++r1;
            }
            if (kv_bit(bits + words, s)) {
                if (r2 < taken) {
                    kv_install_one(d, t, e.slot, e.call, plan, r2, s, sh.fp);
                    if (vt) vt[r2] = (unsigned short)s;
                    if (r2 == taken - 1u) *sh.last = (int)(n + q);
                }
                ++r2;
            }
            if (++s == n) s = 0;
        }
    }
    if (threadIdx.x == 0) {
        *sh.taken = taken;
        if (taken == 0u) *sh.last = -1;
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
