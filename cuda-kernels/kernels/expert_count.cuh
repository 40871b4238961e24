// tierkit: expert pick counting, fused path (paste or #include into your own router kernel).
//
// Table layout (the `expert-residency` PickCounters layout): u32 [layers][experts], row-major,
// cumulative (wraps at 2^32; the host takes wrap-safe deltas between drains).
// `err` is one u32 that counts rejected picks (layer >= layers, expert < 0 or expert >= experts):
// a bad id is never written out of bounds, it is counted here and the host reads it at the drain.
// Atomics are relaxed (plain atomicAdd): the counts are only read after a stream-ordered drain.
// Call it as soon as a pick is known (not at the kernel's tail): the add is fire-and-forget, so
// its latency then hides behind the rest of the router.
// Warp-aggregated: lanes of a warp that pick the same (layer, expert) add once, so a hot expert
// does not serialise a whole warp on one address.
#pragma once

__device__ __forceinline__ void tierkit_count_pick(unsigned int* table, unsigned int* err,
                                                   unsigned int layer, unsigned int layers,
                                                   long long expert, unsigned int experts) {
    const bool ok = layer < layers && expert >= 0 && expert < (long long)experts;
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

// Striped variant (what `PickCounterGpu::fused_table_ptr` / `fused_stripes` hand out): `scratch`
// is u32 [stripes][layers][experts]; block b adds into stripe b % stripes. A router touches only
// a few cache lines of one layer's row, so thousands of adds from all blocks would queue on those
// lines in L2; striping spreads them over `stripes` times more lines. The drain folds the stripes
// into the canonical [layers][experts] table (sum), so the host sees the same counts.
__device__ __forceinline__ void tierkit_count_pick_striped(unsigned int* scratch, unsigned int stripes,
                                                           unsigned int* err, unsigned int layer,
                                                           unsigned int layers, long long expert,
                                                           unsigned int experts) {
    const unsigned int s = stripes > 1u ? blockIdx.x % stripes : 0u;
    tierkit_count_pick(scratch + (unsigned long long)s * layers * experts, err, layer, layers, expert, experts);
}
