// tierkit: standalone pick-counting kernels (the `.cuh` header is prepended by the host).
//
// ids: [ids_layers, tokens, k] (int32 or int64) for layers layer0 .. layer0 + ids_layers,
// flat index i = (l * tokens + t) * k + j, picks_per_layer = tokens * k. The host guarantees
// n <= 2^31 (u32 index math); 16-byte aligned `ids` take the vector loads, others a scalar path.
// Each thread counts 4 consecutive picks (one 16-byte load for int32, two for int64).

template <typename T>
__device__ __forceinline__ void tierkit_count4(const T (&v)[4], unsigned int i, unsigned int n,
                                               unsigned int picks_per_layer, unsigned int layer0,
                                               unsigned int layers, unsigned int experts,
                                               unsigned int* table, unsigned int* err) {
    unsigned int l = i / picks_per_layer;
    unsigned int r = i - l * picks_per_layer;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        if (i + j < n) tierkit_count_pick_aggregated(table, err, layer0 + l, layers, (long long)v[j], experts);
        if (++r == picks_per_layer) { r = 0; ++l; }
    }
}

extern "C" __global__ void tierkit_count_i32(const int* __restrict__ ids, unsigned int n,
                                             unsigned int picks_per_layer, unsigned int layer0,
                                             unsigned int layers, unsigned int experts,
                                             unsigned int* table, unsigned int* err) {
    const unsigned int stride = gridDim.x * blockDim.x * 4u;
    const bool aligned = ((unsigned long long)ids & 15ull) == 0ull;
    for (unsigned int i = (blockIdx.x * blockDim.x + threadIdx.x) * 4u; i < n; i += stride) {
        int v[4];
        if (aligned && i + 4u <= n) {
            const int4 q = *reinterpret_cast<const int4*>(ids + i);
            v[0] = q.x; v[1] = q.y; v[2] = q.z; v[3] = q.w;
        } else {
#pragma unroll
            for (int j = 0; j < 4; ++j) v[j] = (i + j < n) ? ids[i + j] : 0;
        }
        tierkit_count4(v, i, n, picks_per_layer, layer0, layers, experts, table, err);
    }
}

extern "C" __global__ void tierkit_count_i64(const long long* __restrict__ ids, unsigned int n,
                                             unsigned int picks_per_layer, unsigned int layer0,
                                             unsigned int layers, unsigned int experts,
                                             unsigned int* table, unsigned int* err) {
    const unsigned int stride = gridDim.x * blockDim.x * 4u;
    const bool aligned = ((unsigned long long)ids & 15ull) == 0ull;
    for (unsigned int i = (blockIdx.x * blockDim.x + threadIdx.x) * 4u; i < n; i += stride) {
        long long v[4];
        if (aligned && i + 4u <= n) {
            const longlong2 a = *reinterpret_cast<const longlong2*>(ids + i);
            const longlong2 b = *reinterpret_cast<const longlong2*>(ids + i + 2);
            v[0] = a.x; v[1] = a.y; v[2] = b.x; v[3] = b.y;
        } else {
#pragma unroll
            for (int j = 0; j < 4; ++j) v[j] = (i + j < n) ? ids[i + j] : 0;
        }
        tierkit_count4(v, i, n, picks_per_layer, layer0, layers, experts, table, err);
    }
}

// Stand-in router (bench and tests of the fused path), one warp per token: top-k of `experts`
// (<= 256) f32 logits by k warp arg-max rounds (ties: lowest id; NaN never picked).
// logits f32 [tokens, experts]; ids int32 [tokens, k], k <= 32. Launch >= tokens * 32 threads.
// mode (how the fused header is called; the bench compares them):
//   0 no counting; 1 tierkit_count_pick from lanes 0..k-1 after the top-k (the recommended call);
//   2 tierkit_count_pick_aggregated from lanes 0..k-1 after the top-k;
//   3 tierkit_count_pick from lane 0 inside each arg-max round, as each pick is known;
//   4 (bench) as 3 into a table striped by block (32 stripes); 5 (bench diagnostic) as 3 but
//   adding to distinct addresses. Modes 4-5 need `table` to hold 32 * layers * experts >= 4096 words.
extern "C" __global__ void tierkit_standin_router(const float* __restrict__ logits, unsigned int tokens,
                                                  unsigned int experts, unsigned int k, int* ids,
                                                  unsigned int mode, unsigned int* table, unsigned int* err,
                                                  unsigned int layer, unsigned int layers) {
    const unsigned int token = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const unsigned int lane = threadIdx.x & 31u;
    if (token >= tokens) return;  // whole warps exit together
    const float* row = logits + (unsigned long long)token * experts;
    const float NEG = __int_as_float(0xff800000);  // -inf
    float v[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        const unsigned int e = lane + 32u * j;
        v[j] = e < experts ? row[e] : NEG;
    }
    int mine = 0x7fffffff;
    for (unsigned int r = 0; r < k && r < 32u; ++r) {
        float best = NEG;
        int arg = 0x7fffffff;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            if (v[j] > best) { best = v[j]; arg = (int)(lane + 32u * j); }
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float ob = __shfl_xor_sync(0xFFFFFFFFu, best, o);
            const int oa = __shfl_xor_sync(0xFFFFFFFFu, arg, o);
            if (ob > best || (ob == best && oa < arg)) { best = ob; arg = oa; }
        }
        if (lane == r) mine = arg;
        if (mode == 3u && lane == 0) tierkit_count_pick(table, err, layer, layers, (long long)arg, experts);
        if (mode == 4u && lane == 0)  // bench variant: table striped by block, 32 stripes
            tierkit_count_pick(table + (unsigned long long)(blockIdx.x & 31u) * layers * experts, err, layer,
                               layers, (long long)arg, experts);
        if (mode == 5u && lane == 0)  // bench diagnostic: adds to distinct addresses (no same-line queueing)
            atomicAdd(table + ((token * k + r) & 4095u), 1u);
        if (arg != 0x7fffffff && (unsigned int)(arg & 31) == lane) {
#pragma unroll
            for (int j = 0; j < 8; ++j) if (j == (arg >> 5)) v[j] = NEG;
        }
    }
    if (lane < k) {
        ids[(unsigned long long)token * k + lane] = mine;
        if (mode == 1u) tierkit_count_pick(table, err, layer, layers, (long long)mine, experts);
        if (mode == 2u) tierkit_count_pick_aggregated(table, err, layer, layers, (long long)mine, experts);
    }
}

// Bench/test stand-in router for the previous-layer fused path: as tierkit_standin_router (one
// warp per token, top-k by k warp arg-max rounds, ties lowest id), plus prev_ids (int32
// [tokens, k], layer-1's picks; may equal ids: each pick is read by the lane that later
// overwrites it). Each mode is compiled as its own body (MODE is a template constant, as a
// router with counting compiled in would be); the kernel dispatches once on `mode`:
//   0 no counting; 3 tierkit_count_pick (atomicAdd) from lane 0 in each round;
//   6 as 3 with tierkit_count_pick_red; 9 tierkit_count_pick_red from lane r in round r;
//   7 previous-layer path: layers >= 1 count prev_ids (tierkit_count_prev_layer) right after the
//     logits loads are issued, the last layer also counts its own picks in the loop
//     (tierkit_count_pick_red): exact counts after every step;
//   8 as 7 with atomicAdd (tierkit_count_pick) for every add;
//   11 as 7 with tierkit_count_prev_layer called before the logits loads (kernel's first line);
//   10 (diagnostic, counts lag one layer) as 7 without the last layer's own adds; layer 0 counts
//     prev_ids as layer layers-1 (the previous step's last layer).
template <unsigned int MODE>
__device__ __forceinline__ void tierkit_standin_router_prev_body(
    const float* __restrict__ logits, unsigned int tokens, unsigned int experts, unsigned int k, int* ids,
    const int* prev_ids, unsigned int* table, unsigned int* err, unsigned int layer, unsigned int layers) {
    const unsigned int token = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const unsigned int lane = threadIdx.x & 31u;
    if (token >= tokens) return;  // whole warps exit together
    const unsigned int kk = k < 32u ? k : 32u;
    if (MODE == 11u && layer > 0u && lane < kk)
        tierkit_count_prev_layer(table, err, prev_ids, token * k + lane, tokens * k, layer - 1u, layers, experts);
    const float* row = logits + (unsigned long long)token * experts;
    const float NEG = __int_as_float(0xff800000);  // -inf
    float v[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        const unsigned int e = lane + 32u * j;
        v[j] = e < experts ? row[e] : NEG;
    }
    if (MODE == 7u && layer > 0u && lane < kk)
        tierkit_count_prev_layer(table, err, prev_ids, token * k + lane, tokens * k, layer - 1u, layers, experts);
    if (MODE == 8u && layer > 0u && lane < kk)
        tierkit_count_pick(table, err, layer - 1u, layers, (long long)prev_ids[token * k + lane], experts);
    if (MODE == 10u && lane < kk)
        tierkit_count_prev_layer(table, err, prev_ids, token * k + lane, tokens * k,
                                 layer > 0u ? layer - 1u : layers - 1u, layers, experts);
    const bool own_in_loop = MODE == 3u || MODE == 6u || MODE == 9u ||
                             ((MODE == 7u || MODE == 8u || MODE == 11u) && layer + 1u == layers);
    int mine = 0x7fffffff;
    for (unsigned int r = 0; r < kk; ++r) {
        float best = NEG;
        int arg = 0x7fffffff;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            if (v[j] > best) { best = v[j]; arg = (int)(lane + 32u * j); }
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float ob = __shfl_xor_sync(0xFFFFFFFFu, best, o);
            const int oa = __shfl_xor_sync(0xFFFFFFFFu, arg, o);
            if (ob > best || (ob == best && oa < arg)) { best = ob; arg = oa; }
        }
        if (lane == r) mine = arg;
        if (own_in_loop) {
            if (MODE == 3u || MODE == 8u) {
                if (lane == 0) tierkit_count_pick(table, err, layer, layers, (long long)arg, experts);
            } else if (MODE == 9u) {
                if (lane == r) tierkit_count_pick_red(table, err, layer, layers, (long long)arg, experts);
            } else if (lane == 0) {
                tierkit_count_pick_red(table, err, layer, layers, (long long)arg, experts);
            }
        }
        if (arg != 0x7fffffff && (unsigned int)(arg & 31) == lane) {
#pragma unroll
            for (int j = 0; j < 8; ++j) if (j == (arg >> 5)) v[j] = NEG;
        }
    }
    if (lane < kk) ids[(unsigned long long)token * k + lane] = mine;
}

extern "C" __global__ void tierkit_standin_router_prev(const float* __restrict__ logits, unsigned int tokens,
                                                       unsigned int experts, unsigned int k, int* ids,
                                                       const int* prev_ids, unsigned int mode,
                                                       unsigned int* table, unsigned int* err,
                                                       unsigned int layer, unsigned int layers) {
#define TIERKIT_PREV_CASE(M)                                                                       \
    case M:                                                                                        \
        tierkit_standin_router_prev_body<M>(logits, tokens, experts, k, ids, prev_ids, table, err, \
                                            layer, layers);                                        \
        break;
    switch (mode) {
        TIERKIT_PREV_CASE(3u)
        TIERKIT_PREV_CASE(6u)
        TIERKIT_PREV_CASE(7u)
        TIERKIT_PREV_CASE(8u)
        TIERKIT_PREV_CASE(9u)
        TIERKIT_PREV_CASE(10u)
        TIERKIT_PREV_CASE(11u)
        default: tierkit_standin_router_prev_body<0u>(logits, tokens, experts, k, ids, prev_ids, table, err,
                                                      layer, layers);
    }
#undef TIERKIT_PREV_CASE
}
