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
//   12 TierkitWarpCounts (the recommended path): begin right after the logits loads, one
//     tierkit_warp_count_uniform per round on the warp's arg-max, end after the ids store, into
//     `stripes` [layers][num_stripes][experts] (warp index = token); the drain folds them;
//   13 as 12 with num_stripes = 0 (fallback: the warp's nonzero counts added to the table at the end);
//   14 (diagnostic) as 12 without the stripe load at begin, the counts `red`-added to the stripe row;
//   15 (diagnostic, counts discarded) as 12 with no memory access at all (registers only);
//   17 (diagnostic) no counting, lanes < k store their pick a second time, into
//     stripes[(layer * tokens + token) * k + lane] (an extra 24-byte store per warp at the tail);
//   19 (diagnostic) as 12 storing all 64 words of the stripe row (old + new) at the end;
//   20 TierkitWarpStripe: begin (stripe row load) right after the logits loads, nothing in the
//     loop, end after the ids store with each lane's pick (shuffle the old value, match_any,
//     one plain store per distinct pick);
//   21 no load, no loop work: lanes < k red-add 1 to their pick's cell of the warp's stripe row at the end;
//   22 as 20 with begin before the logits loads (the kernel's first line);
//   23 as 20 without the match_any (assumes the warp's picks are distinct, as one token's top-k are);
//   24 as 21 with the red issued inside each round by lane 0, as each pick is known;
//   28 as 21 with `red.relaxed.cta` (the row is private to the warp);
//   31 as 21 with the reds issued before the ids store;
//   40 per-warp one-hot row in shared memory, added to the table row by one TMA bulk reduction
//      (cp.reduce.async.bulk .add.u32, 256 B) per warp at the end; 41 as 40 into the warp's stripe row;
//   42 per-block shared histogram (shared atomics, two __syncthreads), one TMA bulk reduction per
//      block into the table row; 43 as 42 with the nonzero bins red-added by threads < experts.
//   Modes 40-43 need experts <= 64 and blocks of 256 threads (bench diagnostics, sm_90).
// TMA bulk reduction (sm_90): dst[i] += src[i] for `bytes / 4` u32, src in shared memory; waits
// until the shared source has been read (so the CTA may exit or reuse it).
__device__ __forceinline__ void tierkit_bulk_add_u32(unsigned int* dst, const unsigned int* src_shared,
                                                     unsigned int bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    const unsigned int s = (unsigned int)__cvta_generic_to_shared(src_shared);
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.u32 [%0], [%1], %2;" ::"l"(dst), "r"(s),
                 "r"(bytes)
                 : "memory");
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
    asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
#else
    for (unsigned int i = 0; i < bytes / 4u; ++i)
        if (src_shared[i] != 0u) atomicAdd(dst + i, src_shared[i]);
#endif
}

template <unsigned int MODE>
__device__ __forceinline__ void tierkit_standin_router_prev_body(
    const float* __restrict__ logits, unsigned int tokens, unsigned int experts, unsigned int k, int* ids,
    const int* prev_ids, unsigned int* table, unsigned int* err, unsigned int layer, unsigned int layers,
    unsigned int* stripes, unsigned int num_stripes) {
    const unsigned int token = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const unsigned int lane = threadIdx.x & 31u;
    if (token >= tokens) return;  // whole warps exit together
    const unsigned int kk = k < 32u ? k : 32u;
    if (MODE == 11u && layer > 0u && lane < kk)
        tierkit_count_prev_layer(table, err, prev_ids, token * k + lane, tokens * k, layer - 1u, layers, experts);
    __shared__ __align__(128) unsigned int tk_hist[8][64];  // modes 40-43
    if (MODE == 40u || MODE == 41u) {
        tk_hist[threadIdx.x >> 5][lane] = 0u;
        tk_hist[threadIdx.x >> 5][lane + 32u] = 0u;
    }
    if ((MODE == 42u || MODE == 43u) && threadIdx.x < 64u) tk_hist[0][threadIdx.x] = 0u;
    TierkitWarpStripe<2> ws;  // modes 20-23: experts <= 64
    if (MODE == 22u) tierkit_warp_stripe_begin(ws, stripes, num_stripes, table, layer, layers, experts, token);
    const float* row = logits + (unsigned long long)token * experts;
    const float NEG = __int_as_float(0xff800000);  // -inf
    float v[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        const unsigned int e = lane + 32u * j;
        v[j] = e < experts ? row[e] : NEG;
    }
    constexpr bool WARP_COUNTS = MODE == 12u || MODE == 13u || MODE == 14u || MODE == 15u || MODE == 19u;
    TierkitWarpCounts<2> wc;  // modes 12-14: experts <= 64 (other experts are rejected into err)
    if (WARP_COUNTS)
        tierkit_warp_counts_begin(wc, stripes,
                                  MODE == 13u ? 0u : ((MODE == 14u || MODE == 15u) ? 0xFFFFFFFFu : num_stripes),
                                  table, layer, layers, experts, (MODE == 14u || MODE == 15u) ? 0xFFFFFFFFu : token);
    if (MODE == 42u || MODE == 43u) __syncthreads();  // the zeroed histogram, before any pick is added
    if (MODE == 20u || MODE == 23u)
        tierkit_warp_stripe_begin(ws, stripes, num_stripes, table, layer, layers, experts, token);
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
        if (WARP_COUNTS) tierkit_warp_count_uniform(wc, (long long)arg);
        if (MODE == 24u && lane == 0u && layer < layers && token < num_stripes && (unsigned int)arg < experts)
            tierkit_red_add_u32(stripes + ((unsigned long long)layer * num_stripes + token) * experts + arg, 1u);
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
    if (MODE == 31u && lane < kk && layer < layers && token < num_stripes && (unsigned int)mine < experts)
        tierkit_red_add_u32(stripes + ((unsigned long long)layer * num_stripes + token) * experts + mine, 1u);
    if (lane < kk) ids[(unsigned long long)token * k + lane] = mine;
    if (MODE == 40u || MODE == 41u) {
        unsigned int* h = tk_hist[threadIdx.x >> 5];
        __syncwarp();
        if (lane < kk && (unsigned int)mine < experts) h[mine] = 1u;  // one token's picks are distinct
        __syncwarp();
        if (lane == 0u && layer < layers) {
            unsigned int* dst = MODE == 40u ? table + (unsigned long long)layer * experts
                                            : stripes + ((unsigned long long)layer * num_stripes + token) * experts;
            if (MODE == 40u || token < num_stripes) tierkit_bulk_add_u32(dst, h, experts * 4u);
        }
    }
    if (MODE == 42u || MODE == 43u) {
        // (all warps of the block reach here: tokens is a multiple of 8 in the bench)
        if (lane < kk && (unsigned int)mine < experts) atomicAdd(&tk_hist[0][mine], 1u);
        __syncthreads();
        if (MODE == 42u && threadIdx.x == 0u && layer < layers)
            tierkit_bulk_add_u32(table + (unsigned long long)layer * experts, tk_hist[0], experts * 4u);
        if (MODE == 43u && threadIdx.x < experts && layer < layers && tk_hist[0][threadIdx.x] != 0u)
            tierkit_red_add_u32(table + (unsigned long long)layer * experts + threadIdx.x, tk_hist[0][threadIdx.x]);
    }
    if (MODE == 28u && lane < kk && layer < layers && token < num_stripes && (unsigned int)mine < experts) {
        unsigned int* p = stripes + ((unsigned long long)layer * num_stripes + token) * experts + mine;
        asm volatile("red.relaxed.cta.global.add.u32 [%0], %1;" ::"l"(p), "r"(1u));
    }
    if (MODE == 12u || MODE == 13u) tierkit_warp_counts_end(wc, err);
    if (MODE == 20u || MODE == 22u) tierkit_warp_stripe_end(ws, (long long)mine, lane < kk, err);
    if (MODE == 21u && lane < kk && layer < layers && token < num_stripes && (unsigned int)mine < experts)
        tierkit_red_add_u32(stripes + ((unsigned long long)layer * num_stripes + token) * experts + mine, 1u);
    if (MODE == 23u) {
        const unsigned int e = (unsigned int)mine & 63u;
        const unsigned int v0 = __shfl_sync(0xFFFFFFFFu, ws.pre[0], e & 31u);
        const unsigned int v1 = __shfl_sync(0xFFFFFFFFu, ws.pre[1], e & 31u);
        if (lane < kk && ws.private_row && (unsigned int)mine < ws.experts) ws.row[e] = (e >> 5 ? v1 : v0) + 1u;
    }
    if (MODE == 15u && wc.c[0] == 0xFFFFFFFFu) err[0] = wc.c[1];  // never true: keeps the counting live
    if (MODE == 17u && lane < kk) stripes[((unsigned long long)layer * tokens + token) * k + lane] = mine;
    if (MODE == 19u && wc.row != nullptr) {
#pragma unroll
        for (unsigned int j = 0; j < 2u; ++j)
            if (lane + 32u * j < wc.experts) wc.row[lane + 32u * j] = wc.pre[j] + wc.c[j];
    }
    if (MODE == 14u && layer < layers && token < num_stripes) {
        // diagnostic: no load at begin (the warp index above was out of range, so counts start at
        // 0 and row is the table row); red-add the nonzero counts to the warp's stripe row instead
        unsigned int* srow = stripes + ((unsigned long long)layer * num_stripes + token) * experts;
#pragma unroll
        for (unsigned int j = 0; j < 2u; ++j)
            if (lane + 32u * j < experts && wc.c[j] != 0u) tierkit_red_add_u32(srow + lane + 32u * j, wc.c[j]);
    }
}

extern "C" __global__ void tierkit_standin_router_prev(const float* __restrict__ logits, unsigned int tokens,
                                                       unsigned int experts, unsigned int k, int* ids,
                                                       const int* prev_ids, unsigned int mode,
                                                       unsigned int* table, unsigned int* err,
                                                       unsigned int layer, unsigned int layers,
                                                       unsigned int* stripes, unsigned int num_stripes) {
#define TIERKIT_PREV_CASE(M)                                                                       \
    case M:                                                                                        \
        tierkit_standin_router_prev_body<M>(logits, tokens, experts, k, ids, prev_ids, table, err, \
                                            layer, layers, stripes, num_stripes);                  \
        break;
    switch (mode) {
        TIERKIT_PREV_CASE(3u)
        TIERKIT_PREV_CASE(6u)
        TIERKIT_PREV_CASE(7u)
        TIERKIT_PREV_CASE(8u)
        TIERKIT_PREV_CASE(9u)
        TIERKIT_PREV_CASE(10u)
        TIERKIT_PREV_CASE(11u)
        TIERKIT_PREV_CASE(12u)
        TIERKIT_PREV_CASE(13u)
        TIERKIT_PREV_CASE(14u)
        TIERKIT_PREV_CASE(15u)
        TIERKIT_PREV_CASE(17u)
        TIERKIT_PREV_CASE(19u)
        TIERKIT_PREV_CASE(20u)
        TIERKIT_PREV_CASE(21u)
        TIERKIT_PREV_CASE(22u)
        TIERKIT_PREV_CASE(23u)
        TIERKIT_PREV_CASE(24u)
        TIERKIT_PREV_CASE(28u)
        TIERKIT_PREV_CASE(31u)
        TIERKIT_PREV_CASE(40u)
        TIERKIT_PREV_CASE(41u)
        TIERKIT_PREV_CASE(42u)
        TIERKIT_PREV_CASE(43u)
        default: tierkit_standin_router_prev_body<0u>(logits, tokens, experts, k, ids, prev_ids, table, err,
                                                      layer, layers, stripes, num_stripes);
    }
#undef TIERKIT_PREV_CASE
}

// Folds the fused path's per-warp stripes into the table: table[l][e] += sum over s of
// stripes[l][s][e] (wrapping u32, relaxed atomic add of each nonzero sum), then zeroes the stripes.
// stripes: u32 [layers][num_stripes][experts]. Launch grid (ceil(experts / 32), layers), block
// (32, 32), on the stream the routers run on (between steps: it must not overlap a router).
extern "C" __global__ void tierkit_fold_stripes(unsigned int* stripes, unsigned int num_stripes,
                                                unsigned int layers, unsigned int experts,
                                                unsigned int* table) {
    __shared__ unsigned int part[32][33];
    const unsigned int e = blockIdx.x * 32u + threadIdx.x;
    const unsigned int layer = blockIdx.y;
    unsigned int sum = 0u;
    if (e < experts && layer < layers) {
        unsigned int* base = stripes + (unsigned long long)layer * num_stripes * experts + e;
        unsigned int s = threadIdx.y;
        // four independent loads in flight per thread, then their zeroing stores
        for (; s + 96u < num_stripes; s += 128u) {
            unsigned int* p0 = base + (unsigned long long)s * experts;
            const unsigned long long d = 32ull * experts;
            const unsigned int a = p0[0], b = p0[d], c = p0[2 * d], q = p0[3 * d];
            p0[0] = 0u; p0[d] = 0u; p0[2 * d] = 0u; p0[3 * d] = 0u;
            sum += a + b + c + q;
        }
        for (; s < num_stripes; s += 32u) {
            unsigned int* p = base + (unsigned long long)s * experts;
            sum += *p;
            *p = 0u;
        }
    }
    part[threadIdx.y][threadIdx.x] = sum;
    __syncthreads();
    if (threadIdx.y == 0u && e < experts && layer < layers) {
#pragma unroll 8
        for (unsigned int y = 1; y < 32u; ++y) sum += part[y][threadIdx.x];
        if (sum != 0u) atomicAdd(table + (unsigned long long)layer * experts + e, sum);
    }
}

// Test kernel of the fused warp path with arbitrary ids (bad ones included): warp w counts
// ids[w * 32 + lane] (lanes past n hold none) of layer `layer` with tierkit_warp_count_lanes,
// PER_LANE = 8 (experts <= 256; more experts reject every pick). Launch >= ceil(n / 32) warps,
// blocks of a multiple of 32 threads.
extern "C" __global__ void tierkit_warp_count_ids_i32(const int* ids, unsigned int n, unsigned int layer,
                                                      unsigned int layers, unsigned int experts,
                                                      unsigned int* table, unsigned int* err,
                                                      unsigned int* stripes, unsigned int num_stripes) {
    const unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    const unsigned int warp = i >> 5;
    TierkitWarpCounts<8> wc;
    tierkit_warp_counts_begin(wc, stripes, num_stripes, table, layer, layers, experts, warp);
    const bool has = i < n;
    tierkit_warp_count_lanes(wc, has ? (long long)ids[i] : 0ll, has);
    tierkit_warp_counts_end(wc, err);
}
