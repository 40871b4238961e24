// tierkit: expert pick counting, fused path (paste or #include into your own router kernel).
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
