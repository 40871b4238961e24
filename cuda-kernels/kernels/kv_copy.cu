// tierkit: the KV copy kernels outside the resolve: plan replay (and its freshness check),
// write-back of new rows to the host store, and the pool's table patches.

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
            kv_copy_row(d, t, l, c.dst_row, kv_host_off(d, c.slot, c.position, l), false, lane);
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
    kv_copy_row(d, t, l, c.dst_row, kv_host_off(d, c.slot, c.position, l), true, lane);
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
