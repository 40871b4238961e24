// tierkit-testkit: stand-in routers and striped-count test kernels for the fused counting path
// (tests and benches only; cuda-kernels' `expert_count.cuh` is prepended by the host).
// Moved verbatim from cuda-kernels' count.cu.

// Bench/test stand-in routers for the fused path, one kernel per way of calling the header
// (tierkit_standin_router_m<MODE>; each compiled alone, as a router with counting compiled in
// would be). One warp per token: top-k of `experts` (<= 256) f32 logits [tokens, experts] by k
// warp arg-max rounds (ties: lowest id; NaN never picked) into ids int32 [tokens, k], k <= 32;
// launch >= tokens * 32 threads in blocks of 256; weights f32 [tokens, k] (gate kernels only, else
// unused). Also prev_ids (int32 [tokens, k], layer-1's
// picks; may equal ids: each pick is read by the lane that later overwrites it) and the stripes
// of tierkit_count_pick_striped ([layers][num_stripes][experts], num_stripes may be 0). Modes:
//   0  no counting;
//   3  tierkit_count_pick (atomicAdd into the table) from lane 0 in each round, as each pick is known;
//   7  previous-layer path: layers >= 1 count prev_ids (tierkit_count_prev_layer) right after the
//      logits loads, the last layer also counts its own picks in the loop (tierkit_count_pick_red):
//      exact counts after every step;
//   17 (diagnostic, no counting) each lane < k stores its pick a second time, into
//      stripes[(layer * tokens + token) * k + lane]: what one more plain store at the end costs;
//   21 tierkit_count_pick_striped from lanes < k as soon as the loop ends (before the router's
//      remaining work and stores), stripe = the warp's index (token);
//   25 as 21 with stripe = blockIdx.x (the block's 8 warps share a stripe);
//   26 as 21 into the table itself (stripe index >= num_stripes);
//   27 as 21 placed at the very end, after the router's last store: the recommended call;
//   29 as 0 (no counting), for the step form's baseline: the host passes ids = this layer's slice
//      of the step buffer prev_ids [layers, tokens, k] (ids = prev_ids + layer * tokens * k);
//   30 step form, same buffers as 29: the last layer loads layers 0..layers-2's picks from
//      prev_ids after its logits loads (tierkit_step_picks_load, 8 per thread), counts them into
//      the stripes before its top-k loop (tierkit_step_picks_count), and its own picks at the very
//      end (tierkit_count_pick_striped); the other layers run no counting code;
// Two routers per mode: tierkit_standin_router_m<MODE> writes ids only; tierkit_standin_gate_m<MODE>
// also writes the top-k weights (f32 [tokens, k], softmax over the k selected logits, i.e. the
// renormalised top-k softmax that Mixtral/Qwen-style routers output), as a real gating kernel does.
template <unsigned int MODE, bool GATE>
__device__ __forceinline__ void tierkit_standin_router_body(
    const float* __restrict__ logits, unsigned int tokens, unsigned int experts, unsigned int k, int* ids,
    const int* prev_ids, unsigned int* table, unsigned int* err, unsigned int layer, unsigned int layers,
    unsigned int* stripes, unsigned int num_stripes, float* weights) {
    const unsigned int token = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const unsigned int lane = threadIdx.x & 31u;
    if (token >= tokens) return;  // whole warps exit together
    const unsigned int kk = k < 32u ? k : 32u;
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
    if (MODE == 30u && layer + 1u == layers) {
        // the threads that pass the early return: tokens * 32 of them, indices 0 .. tokens * 32
        const unsigned int thread = blockIdx.x * blockDim.x + threadIdx.x, threads = tokens * 32u;
        const unsigned int n = (layers - 1u) * tokens * k;
        TierkitStepPicks<int, 8> sp;
        tierkit_step_picks_load(sp, prev_ids, n, thread, threads);
        tierkit_step_picks_count(sp, prev_ids, n, tokens * k, thread, threads, stripes, num_stripes, token, table, err,
                                 layers, experts);
    }
    const bool own_in_loop = MODE == 3u || (MODE == 7u && layer + 1u == layers);
    int mine = 0x7fffffff;
    float mine_val = NEG;
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
        if (lane == r) {
            mine = arg;
            mine_val = best;
        }
        if (own_in_loop && lane == 0u) {
            if (MODE == 3u) {
                tierkit_count_pick(table, err, layer, layers, (long long)arg, experts);
            } else {
                tierkit_count_pick_red(table, err, layer, layers, (long long)arg, experts);
            }
        }
        if (arg != 0x7fffffff && (unsigned int)(arg & 31) == lane) {
#pragma unroll
            for (int j = 0; j < 8; ++j) if (j == (arg >> 5)) v[j] = NEG;
        }
    }
    if (MODE == 17u && lane < kk) stripes[((unsigned long long)layer * tokens + token) * k + lane] = mine;
    if ((MODE == 21u || MODE == 25u || MODE == 26u) && lane < kk) {
        const unsigned int stripe = MODE == 21u ? token : (MODE == 25u ? blockIdx.x : 0xFFFFFFFFu);
        tierkit_count_pick_striped(stripes, num_stripes, stripe, table, err, layer, layers, (long long)mine, experts);
    }
    if (GATE) {
        // renormalised top-k softmax weights: exp(v_r - v_0) / sum over the k picks
        const float top = __shfl_sync(0xFFFFFFFFu, mine_val, 0);
        float w = lane < kk ? __expf(mine_val - top) : 0.0f;
        float sum = w;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xFFFFFFFFu, sum, o);
        if (lane < kk) weights[(unsigned long long)token * k + lane] = w / sum;
    }
    if (lane < kk) ids[(unsigned long long)token * k + lane] = mine;
    if ((MODE == 27u || (MODE == 30u && layer + 1u == layers)) && lane < kk)
        tierkit_count_pick_striped(stripes, num_stripes, token, table, err, layer, layers, (long long)mine, experts);
}

#define TIERKIT_STANDIN_ROUTER(M)                                                                         \
    extern "C" __global__ void tierkit_standin_router_m##M(                                               \
        const float* __restrict__ logits, unsigned int tokens, unsigned int experts, unsigned int k, int* ids, \
        const int* prev_ids, unsigned int* table, unsigned int* err, unsigned int layer, unsigned int layers, \
        unsigned int* stripes, unsigned int num_stripes, float* weights) {                                \
        tierkit_standin_router_body<M##u, false>(logits, tokens, experts, k, ids, prev_ids, table, err, layer, \
                                                 layers, stripes, num_stripes, weights);                  \
    }                                                                                                     \
    extern "C" __global__ void tierkit_standin_gate_m##M(                                                 \
        const float* __restrict__ logits, unsigned int tokens, unsigned int experts, unsigned int k, int* ids, \
        const int* prev_ids, unsigned int* table, unsigned int* err, unsigned int layer, unsigned int layers, \
        unsigned int* stripes, unsigned int num_stripes, float* weights) {                                \
        tierkit_standin_router_body<M##u, true>(logits, tokens, experts, k, ids, prev_ids, table, err, layer,  \
                                                layers, stripes, num_stripes, weights);                   \
    }
TIERKIT_STANDIN_ROUTER(0)
TIERKIT_STANDIN_ROUTER(3)
TIERKIT_STANDIN_ROUTER(7)
TIERKIT_STANDIN_ROUTER(17)
TIERKIT_STANDIN_ROUTER(21)
TIERKIT_STANDIN_ROUTER(25)
TIERKIT_STANDIN_ROUTER(26)
TIERKIT_STANDIN_ROUTER(27)
TIERKIT_STANDIN_ROUTER(29)
TIERKIT_STANDIN_ROUTER(30)
#undef TIERKIT_STANDIN_ROUTER

// Test kernels of tierkit_count_pick_striped with arbitrary ids (bad ones included): thread i
// counts ids[i] (i < n) of layer `layer` into stripe i / 32 (its warp; warps >= num_stripes go to
// the table). Launch >= n threads.
template <typename T>
__device__ __forceinline__ void tierkit_count_ids_striped(const T* ids, unsigned int n, unsigned int layer,
                                                          unsigned int layers, unsigned int experts,
                                                          unsigned int* table, unsigned int* err,
                                                          unsigned int* stripes, unsigned int num_stripes) {
    const unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        tierkit_count_pick_striped(stripes, num_stripes, i >> 5, table, err, layer, layers, (long long)ids[i],
                                   experts);
}

extern "C" __global__ void tierkit_count_ids_striped_i32(const int* ids, unsigned int n, unsigned int layer,
                                                         unsigned int layers, unsigned int experts,
                                                         unsigned int* table, unsigned int* err,
                                                         unsigned int* stripes, unsigned int num_stripes) {
    tierkit_count_ids_striped(ids, n, layer, layers, experts, table, err, stripes, num_stripes);
}

extern "C" __global__ void tierkit_count_ids_striped_i64(const long long* ids, unsigned int n, unsigned int layer,
                                                         unsigned int layers, unsigned int experts,
                                                         unsigned int* table, unsigned int* err,
                                                         unsigned int* stripes, unsigned int num_stripes) {
    tierkit_count_ids_striped(ids, n, layer, layers, experts, table, err, stripes, num_stripes);
}
