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
