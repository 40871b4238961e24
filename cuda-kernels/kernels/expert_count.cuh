// tierkit: expert pick counting, fused path (paste or #include into your own router kernel).
//
// Recommended fused path: TierkitWarpCounts (bottom of this file): counts in registers, one
// private coalesced store per warp at the end, folded into the table at the drain.
//
// Table layout (the `expert-residency` PickCounters layout): u32 [layers][experts], row-major,
// cumulative (wraps at 2^32; the host takes wrap-safe deltas between drains).
// `err` is one u32 that counts rejected picks (layer >= layers, expert < 0 or expert >= experts):
// a bad id is never written out of bounds, it is counted here and the host reads it at the drain.
// Atomics are relaxed (plain atomicAdd whose result is unused: a fire-and-forget reduction); the
// counts are only read after a stream-ordered drain.
#pragma once

// The fused-path call: one bounds check and one relaxed add, branch-free. Router kernels are
// latency-bound (a handful of warps per SM): call it as soon as each pick is known (inside the
// top-k loop) so the add's completion overlaps the rest of the router instead of holding the
// kernel's tail (measured on the H200: see benches/figures-cuda-experts.md).
__device__ __forceinline__ void tierkit_count_pick(unsigned int* table, unsigned int* err,
                                                   unsigned int layer, unsigned int layers,
                                                   long long expert, unsigned int experts) {
    const bool ok = layer < layers && (unsigned long long)expert < (unsigned long long)experts;
    // branch-free: one select, one add
    unsigned int* p = ok ? table + ((unsigned long long)layer * experts + (unsigned int)expert) : err;
    atomicAdd(p, 1u);
}

// Warp-aggregated variant: lanes of a warp that pick the same (layer, expert) add once, so a hot
// expert does not queue a whole warp's adds on one address. Costs a __match_any_sync; use it
// where many lanes of a warp count the same expert (the standalone kernel does).
__device__ __forceinline__ void tierkit_count_pick_aggregated(unsigned int* table, unsigned int* err,
                                                              unsigned int layer, unsigned int layers,
                                                              long long expert, unsigned int experts) {
    const bool ok = layer < layers && (unsigned long long)expert < (unsigned long long)experts;
    const unsigned int key = ok ? layer * experts + (unsigned int)expert : 0xFFFFFFFFu;
    const unsigned int active = __activemask();
    const unsigned int peers = __match_any_sync(active, key);
    const unsigned int lane = threadIdx.x & 31u;
    const unsigned int leader = __ffs(peers) - 1u;
    if (lane == leader) {
        const unsigned int n = __popc(peers);
        if (ok) {
            atomicAdd(table + key, n);
        } else {
            atomicAdd(err, n);
        }
    }
}

// Fire-and-forget form of the add: `red.relaxed.gpu.global.add.u32` (no returned value, so no
// register waits on it). Same table semantics as tierkit_count_pick. Measured on the H200: inside
// the top-k loop it is SLOWER than atomicAdd (13.2 vs 9.4 us per 40-layer step); used by
// tierkit_count_prev_layer, where it is 0.7-1 us faster (benches/README.md, "Fused header path").
__device__ __forceinline__ void tierkit_red_add_u32(unsigned int* p, unsigned int v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
    // no "memory" clobber: a relaxed add with no result orders nothing, and the clobber would
    // stop the compiler from moving the kernel's own loads across it
    asm volatile("red.relaxed.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(v));
#else
    atomicAdd(p, v);
#endif
}

// As tierkit_count_pick, issued as a `red` (fire-and-forget) reduction.
__device__ __forceinline__ void tierkit_count_pick_red(unsigned int* table, unsigned int* err,
                                                       unsigned int layer, unsigned int layers,
                                                       long long expert, unsigned int experts) {
    const bool ok = layer < layers && (unsigned long long)expert < (unsigned long long)experts;
    unsigned int* p = ok ? table + ((unsigned long long)layer * experts + (unsigned int)expert) : err;
    tierkit_red_add_u32(p, 1u);
}

// Previous-layer counting: layer l's router kernel counts layer l-1's picks at its START, reading
// the topk_ids that layer l-1's router already wrote (stream order makes them visible), so the
// adds overlap the whole kernel instead of holding its tail. Call it right AFTER the kernel issues
// its first loads (the logits), not before them: the add waits for the prev_ids load, and placed
// first it puts that load's latency in front of the logits loads. prev_layer = l - 1 for l >= 1
// (skip it in layer 0), and count the LAST layer's own picks in its own kernel
// (tierkit_count_pick_red as each pick is known): after every step the table then holds that
// step's exact counts. prev_ids: [picks_per_layer] (int32 or int64) of layer prev_layer; the
// calling thread counts pick `pick` (picks >= picks_per_layer do nothing). If the router reuses
// one ids buffer for every layer, each pick must be read here by the same thread that later
// overwrites it (e.g. warp `token`, lane j < k counts pick token * k + j), so no read races a write.
// Measured on the H200 (stand-in router, 40 layers x 256 tokens x top-6 of 64, CUDA graph): 6.5-7.4
// us added per step against 9.0-9.4 us for tierkit_count_pick in the loop; the exact-count goal of
// <= 2 us is not met by either (benches/README.md, "Fused header path").
template <typename T>
__device__ __forceinline__ void tierkit_count_prev_layer(unsigned int* table, unsigned int* err,
                                                         const T* prev_ids, unsigned int pick,
                                                         unsigned int picks_per_layer,
                                                         unsigned int prev_layer, unsigned int layers,
                                                         unsigned int experts) {
    if (pick < picks_per_layer)
        tierkit_count_pick_red(table, err, prev_layer, layers, (long long)prev_ids[pick], experts);
}

// ---------------------------------------------------------------------------------------------
// Warp-register counting into per-warp stripes: the RECOMMENDED fused path.
//
// A router warp keeps the counts of its picks for one layer in registers: lane i holds experts
// i, i + 32, ..., (PER_LANE counters, so experts <= 32 * PER_LANE; e.g. PER_LANE = 2 for 64
// experts, 8 for 256). Counting a pick is PER_LANE compares in registers: no memory access and
// no atomic inside the router's loop. At the end of the kernel the warp adds its counts into its
// own stripe, a private row of the u32 buffer `stripes` [layers][num_stripes][experts]: the row
// was loaded by tierkit_warp_counts_begin (call it right after the kernel's own first loads; the
// value is only used at the end, so nothing waits for it) and the lanes whose experts the warp
// picked store old + new (at most one store per pick, plain, no atomic). No other warp of
// the launch touches that row, so no atomic is needed; launches on one stream are ordered. The
// host folds the stripes into the table at the drain: PickCounterGpu::drain_async launches
// tierkit_fold_stripes on the step stream (table += sum of stripes, stripes zeroed) before its
// copy. Use one stripes buffer per stream (two streams routing at once would share rows).
// A warp whose index is >= num_stripes (a grid larger than planned, or num_stripes = 0) falls
// back to relaxed atomics into `table` for its nonzero counts: still exact, only slower.
// Rejected picks (expert < 0 or >= experts, layer >= layers, or experts > 32 * PER_LANE, which
// rejects every pick) are added to `err` at the end, never written to the table.
// Measured on the H200 (stand-in router, 40 layers x 256 tokens x top-6 of 64, CUDA graph):
// see benches/README.md, "Fused header path".
// Idea: privatised sub-histograms merged later (Podlozhnyuk, "Histogram calculation in CUDA",
// NVIDIA 2007; CUB's BlockHistogram), taken down to one warp's registers.
__device__ __forceinline__ unsigned int tierkit_lane_id() {
    unsigned int lane;
    asm("mov.u32 %0, %%laneid;" : "=r"(lane));
    return lane;
}

template <unsigned int PER_LANE>
struct TierkitWarpCounts {
    unsigned int c[PER_LANE];    // c[j]: picks of expert lane + 32 * j counted by this launch's warp
    unsigned int pre[PER_LANE];  // the stripe's value loaded at begin (0 in the fallback); only used at end
    unsigned int* row;         // the warp's stripe row, or the table row (fallback), or null (bad layer)
    unsigned int experts;      // 0 when every pick is rejected
    unsigned int bad;          // rejected picks (lane 0 counts them)
    bool private_row;          // row is the warp's own stripe (plain store) rather than the table (atomics)
};

// Starts counting one layer in the calling warp (all 32 lanes must call it, with the same
// arguments). warp: this warp's index in the launch, unique among the launch's warps, e.g.
// (blockIdx.x * blockDim.x + threadIdx.x) >> 5 for 1-D blocks of a multiple of 32 threads.
template <unsigned int PER_LANE>
__device__ __forceinline__ void tierkit_warp_counts_begin(TierkitWarpCounts<PER_LANE>& w, unsigned int* stripes,
                                                          unsigned int num_stripes, unsigned int* table,
                                                          unsigned int layer, unsigned int layers,
                                                          unsigned int experts, unsigned int warp) {
    const unsigned int lane = tierkit_lane_id();
    const bool ok = layer < layers && experts <= 32u * PER_LANE;
    w.experts = ok ? experts : 0u;
    w.bad = 0u;
    w.private_row = ok && warp < num_stripes;
    w.row = !ok ? nullptr
                : w.private_row ? stripes + ((unsigned long long)layer * num_stripes + warp) * experts
                                : table + (unsigned long long)layer * experts;
    // the stripe load is only consumed at end: the counting never waits for it
#pragma unroll
    for (unsigned int j = 0; j < PER_LANE; ++j) {
        const unsigned int e = lane + 32u * j;
        w.pre[j] = (w.private_row && e < experts) ? w.row[e] : 0u;
        w.c[j] = 0u;
    }
}

// Counts one pick that every lane of the warp holds (a warp-uniform value, e.g. the result of a
// warp arg-max reduction). Call from all 32 lanes.
template <unsigned int PER_LANE>
__device__ __forceinline__ void tierkit_warp_count_uniform(TierkitWarpCounts<PER_LANE>& w, long long expert) {
    const unsigned int lane = tierkit_lane_id();
    if ((unsigned long long)expert < (unsigned long long)w.experts) {
        const unsigned int e = (unsigned int)expert;
#pragma unroll
        for (unsigned int j = 0; j < PER_LANE; ++j) w.c[j] += e == lane + 32u * j ? 1u : 0u;
    } else {
        w.bad += lane == 0u ? 1u : 0u;
    }
}

// Counts the picks held by the lanes with `has` set (each lane at most one pick; lanes may hold
// different experts). Call from all 32 lanes; costs one shuffle per pick.
template <unsigned int PER_LANE>
__device__ __forceinline__ void tierkit_warp_count_lanes(TierkitWarpCounts<PER_LANE>& w, long long expert,
                                                         bool has) {
    unsigned int m = __ballot_sync(0xFFFFFFFFu, has);
    while (m != 0u) {
        const int src = __ffs(m) - 1;
        m &= m - 1u;
        tierkit_warp_count_uniform(w, __shfl_sync(0xFFFFFFFFu, expert, src));
    }
}

// Ends counting: stores the warp's stripe row (or adds its nonzero counts to the table in the
// fallback) and adds rejected picks to `err`. Call once from all 32 lanes, after the last pick.
template <unsigned int PER_LANE>
__device__ __forceinline__ void tierkit_warp_counts_end(const TierkitWarpCounts<PER_LANE>& w, unsigned int* err) {
    const unsigned int lane = tierkit_lane_id();
    if (w.row != nullptr) {
#pragma unroll
        for (unsigned int j = 0; j < PER_LANE; ++j) {
            const unsigned int e = lane + 32u * j;
            if (e < w.experts && w.c[j] != 0u) {  // only the experts this warp picked
                if (w.private_row) {
                    w.row[e] = w.pre[j] + w.c[j];
                } else {
                    atomicAdd(w.row + e, w.c[j]);
                }
            }
        }
    }
    if (w.bad != 0u) atomicAdd(err, w.bad);
}

// ---------------------------------------------------------------------------------------------
// Tail form: the warp's picks counted once, at the end of the router, into its private stripe.
template <unsigned int PER_LANE>
struct TierkitWarpStripe {
    unsigned int pre[PER_LANE];  // the stripe row loaded at begin: lane i holds experts i + 32 * j
    unsigned int* row;           // the warp's stripe row, the table row (fallback) or null (bad layer)
    unsigned int experts;        // 0 when every pick is rejected
    bool private_row;
};

template <unsigned int PER_LANE>
__device__ __forceinline__ void tierkit_warp_stripe_begin(TierkitWarpStripe<PER_LANE>& w, unsigned int* stripes,
                                                          unsigned int num_stripes, unsigned int* table,
                                                          unsigned int layer, unsigned int layers,
                                                          unsigned int experts, unsigned int warp) {
    const unsigned int lane = tierkit_lane_id();
    const bool ok = layer < layers && experts <= 32u * PER_LANE;
    w.experts = ok ? experts : 0u;
    w.private_row = ok && warp < num_stripes;
    w.row = !ok ? nullptr
                : w.private_row ? stripes + ((unsigned long long)layer * num_stripes + warp) * experts
                                : table + (unsigned long long)layer * experts;
#pragma unroll
    for (unsigned int j = 0; j < PER_LANE; ++j) {
        const unsigned int e = lane + 32u * j;
        w.pre[j] = (w.private_row && e < experts) ? w.row[e] : 0u;
    }
}

// Each lane with `has` holds one pick (lanes may hold the same expert). Call once, from all 32 lanes.
template <unsigned int PER_LANE>
__device__ __forceinline__ void tierkit_warp_stripe_end(const TierkitWarpStripe<PER_LANE>& w, long long expert,
                                                        bool has, unsigned int* err) {
    const unsigned int lane = tierkit_lane_id();
    const bool ok = has && (unsigned long long)expert < (unsigned long long)w.experts;
    const unsigned int e = ok ? (unsigned int)expert : 0xFFFFFFFFu;
    unsigned int old = 0u;  // the stripe cell of e, held by lane e & 31 in pre[e >> 5]
#pragma unroll
    for (unsigned int j = 0; j < PER_LANE; ++j) {
        const unsigned int v = __shfl_sync(0xFFFFFFFFu, w.pre[j], e & 31u);
        if ((e >> 5) == j) old = v;
    }
    const unsigned int peers = __match_any_sync(0xFFFFFFFFu, e);
    if (ok && (peers & ((1u << lane) - 1u)) == 0u) {  // the lowest lane holding e writes it
        if (w.private_row) {
            w.row[e] = old + __popc(peers);
        } else {
            atomicAdd(w.row + e, (unsigned int)__popc(peers));
        }
    }
    const unsigned int bad = __ballot_sync(0xFFFFFFFFu, has && !ok);
    if (bad != 0u && lane == 0u) atomicAdd(err, (unsigned int)__popc(bad));
}
