// tierkit: standalone pick-counting kernels (the `.cuh` header is prepended by the host).
//
// ids: [ids_layers, tokens, k] (int32 or int64) for layers layer0 .. layer0 + ids_layers,
// flat index i = (l * tokens + t) * k + j, picks_per_layer = tokens * k.

extern "C" __global__ void tierkit_count_i32(const int* __restrict__ ids, unsigned long long n,
                                             unsigned int picks_per_layer, unsigned int layer0,
                                             unsigned int layers, unsigned int experts,
                                             unsigned int* table, unsigned int* err) {
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const unsigned int layer = layer0 + (unsigned int)(i / picks_per_layer);
        tierkit_count_pick(table, err, layer, layers, (long long)ids[i], experts);
    }
}

extern "C" __global__ void tierkit_count_i64(const long long* __restrict__ ids, unsigned long long n,
                                             unsigned int picks_per_layer, unsigned int layer0,
                                             unsigned int layers, unsigned int experts,
                                             unsigned int* table, unsigned int* err) {
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const unsigned int layer = layer0 + (unsigned int)(i / picks_per_layer);
        tierkit_count_pick(table, err, layer, layers, ids[i], experts);
    }
}

// Stand-in router (bench and tests of the fused path): per token, top-k of `experts` logits by
// repeated arg-max (ties: lowest id). logits f32 [tokens, experts]; out ids int32 [tokens, k].
// With count != 0 the picks are also counted through the fused header function.
extern "C" __global__ void tierkit_standin_router(const float* __restrict__ logits, unsigned int tokens,
                                                  unsigned int experts, unsigned int k, int* ids,
                                                  unsigned int count, unsigned int* table, unsigned int* err,
                                                  unsigned int layer, unsigned int layers) {
    const unsigned int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= tokens) return;
    const float* row = logits + (unsigned long long)t * experts;
    unsigned long long taken[4] = {0ull, 0ull, 0ull, 0ull};  // up to 256 experts
    for (unsigned int j = 0; j < k; ++j) {
        float best = -3.402823466e38f;
        unsigned int arg = 0xFFFFFFFFu;
        for (unsigned int e = 0; e < experts && e < 256u; ++e) {
            if ((taken[e >> 6] >> (e & 63u)) & 1ull) continue;
            const float v = row[e];
            if (arg == 0xFFFFFFFFu || v > best) { best = v; arg = e; }
        }
        if (arg != 0xFFFFFFFFu) taken[arg >> 6] |= 1ull << (arg & 63u);
        ids[(unsigned long long)t * k + j] = (int)arg;
        if (count) tierkit_count_pick(table, err, layer, layers, (long long)(int)arg, experts);
    }
}
