// tierkit: standalone pick-counting kernels (the `.cuh` header is prepended by the host).
//
// ids: [ids_layers, tokens, k] (int32 or int64) for layers layer0 .. layer0 + ids_layers,
// flat index i = (l * tokens + t) * k + j, picks_per_layer = tokens * k. The host guarantees
// n <= 2^31 (u32 index math); 16-byte aligned `ids` take the vector loads, others a scalar path.
// Each thread counts 4 consecutive picks (one 16-byte load for int32, two for int64).
//
// Controls (tierkit_count_ctl_i32 / _i64; PickCounterGpu launches these): `ctl` is the counter's
// control block, u32 [4] in device memory (TIERKIT_CTL_* in expert_count.cuh), read by every
// launch at run time, so a captured CUDA graph sees the values written before each replay:
// ctl[0] == 0 counts nothing at all; token rows t >= ctl[1] (padding, dummy rows) are skipped in
// every layer of the launch. Skipped picks are neither counted nor rejected. tierkit_count_i32 /
// _i64 keep their old arguments (no control: everything counted) for engines that launch them.
template <typename T>
__device__ __forceinline__ void tierkit_count4(const T (&v)[4], unsigned int i, unsigned int n,
                                               unsigned int picks_per_layer, unsigned int valid_per_layer,
                                               unsigned int layer0, unsigned int layers,
                                               unsigned int experts, unsigned int* table,
                                               unsigned int* err) {
    unsigned int l = i / picks_per_layer;
    unsigned int r = i - l * picks_per_layer;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        // r < valid_per_layer: the pick's token row is below the valid count
        if (i + j < n && r < valid_per_layer)
            tierkit_count_pick_aggregated(table, err, layer0 + l, layers, (long long)v[j], experts);
        if (++r == picks_per_layer) { r = 0; ++l; }
    }
}

// Four picks from a 16-byte aligned address: one int4 load for int32, two longlong2 for int64.
__device__ __forceinline__ void tierkit_load4(const int* __restrict__ p, int (&v)[4]) {
    const int4 q = *reinterpret_cast<const int4*>(p);
    v[0] = q.x; v[1] = q.y; v[2] = q.z; v[3] = q.w;
}
__device__ __forceinline__ void tierkit_load4(const long long* __restrict__ p, long long (&v)[4]) {
    const longlong2 a = *reinterpret_cast<const longlong2*>(p);
    const longlong2 b = *reinterpret_cast<const longlong2*>(p + 2);
    v[0] = a.x; v[1] = a.y; v[2] = b.x; v[3] = b.y;
}

// The counting loop of all four kernels. valid_per_layer: picks of each layer that are counted
// (min(valid tokens, tokens) * k; picks_per_layer when uncontrolled).
template <typename T>
__device__ __forceinline__ void tierkit_count_body(const T* __restrict__ ids, unsigned int n,
                                                   unsigned int picks_per_layer,
                                                   unsigned int valid_per_layer, unsigned int layer0,
                                                   unsigned int layers, unsigned int experts,
                                                   unsigned int* table, unsigned int* err) {
    // 64-bit grid stride: i + stride never wraps for n up to u32::MAX (i < n fits u32 in the body)
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x * 4u;
    const bool aligned = ((unsigned long long)ids & 15ull) == 0ull;
    for (unsigned long long i64 = ((unsigned long long)blockIdx.x * blockDim.x + threadIdx.x) * 4u; i64 < n;
         i64 += stride) {
        const unsigned int i = (unsigned int)i64;
        T v[4];
        if (aligned && i64 + 4u <= n) {
            tierkit_load4(ids + i, v);
        } else {
#pragma unroll
            for (int j = 0; j < 4; ++j) v[j] = (i + j < n) ? ids[i + j] : (T)0;
        }
        tierkit_count4(v, i, n, picks_per_layer, valid_per_layer, layer0, layers, experts, table, err);
    }
}

// Picks of each layer a controlled launch counts: 0 if disabled, else min(ctl[1], tokens) * k
// (tokens = picks_per_layer / k). One read of the block per thread, before any pick.
__device__ __forceinline__ unsigned int tierkit_count_valid_per_layer(const unsigned int* ctl,
                                                                      unsigned int picks_per_layer,
                                                                      unsigned int k) {
    if (ctl == nullptr) return picks_per_layer;
    const unsigned int enabled = ctl[TIERKIT_CTL_ENABLED];
    const unsigned int valid = ctl[TIERKIT_CTL_VALID_TOKENS];
    if (enabled == 0u || k == 0u) return 0u;
    const unsigned int tokens = picks_per_layer / k;
    return (valid < tokens ? valid : tokens) * k;
}

extern "C" __global__ void tierkit_count_i32(const int* __restrict__ ids, unsigned int n,
                                             unsigned int picks_per_layer, unsigned int layer0,
                                             unsigned int layers, unsigned int experts,
                                             unsigned int* table, unsigned int* err) {
    tierkit_count_body<int>(ids, n, picks_per_layer, picks_per_layer, layer0, layers, experts, table, err);
}

extern "C" __global__ void tierkit_count_i64(const long long* __restrict__ ids, unsigned int n,
                                             unsigned int picks_per_layer, unsigned int layer0,
                                             unsigned int layers, unsigned int experts,
                                             unsigned int* table, unsigned int* err) {
    tierkit_count_body<long long>(ids, n, picks_per_layer, picks_per_layer, layer0, layers, experts, table,
                                  err);
}

// As tierkit_count_i32 / _i64, under the control block `ctl` (u32 [4], see the top of this file);
// k: picks per token (picks_per_layer = tokens * k).
template <typename T>
__device__ __forceinline__ void tierkit_count_ctl(const T* __restrict__ ids, unsigned int n,
                                                  unsigned int picks_per_layer, unsigned int k,
                                                  unsigned int layer0, unsigned int layers,
                                                  unsigned int experts, unsigned int* table,
                                                  unsigned int* err, const unsigned int* ctl) {
    const unsigned int valid = tierkit_count_valid_per_layer(ctl, picks_per_layer, k);
    if (valid == 0u) return;
    tierkit_count_body<T>(ids, n, picks_per_layer, valid, layer0, layers, experts, table, err);
}

extern "C" __global__ void tierkit_count_ctl_i32(const int* __restrict__ ids, unsigned int n,
                                                 unsigned int picks_per_layer, unsigned int k,
                                                 unsigned int layer0, unsigned int layers,
                                                 unsigned int experts, unsigned int* table,
                                                 unsigned int* err, const unsigned int* ctl) {
    tierkit_count_ctl<int>(ids, n, picks_per_layer, k, layer0, layers, experts, table, err, ctl);
}

extern "C" __global__ void tierkit_count_ctl_i64(const long long* __restrict__ ids, unsigned int n,
                                                 unsigned int picks_per_layer, unsigned int k,
                                                 unsigned int layer0, unsigned int layers,
                                                 unsigned int experts, unsigned int* table,
                                                 unsigned int* err, const unsigned int* ctl) {
    tierkit_count_ctl<long long>(ids, n, picks_per_layer, k, layer0, layers, experts, table, err, ctl);
}

// Writes the control block on the launch's stream (PickCounterGpu::set_enabled_async /
// set_valid_tokens_async): ctl[w] = value for word w < TIERKIT_CTL_WORDS. One thread.
extern "C" __global__ void tierkit_count_set_control(unsigned int* ctl, unsigned int word,
                                                     unsigned int value) {
    if (threadIdx.x == 0u && blockIdx.x == 0u && word < TIERKIT_CTL_WORDS) ctl[word] = value;
}

// Folds the fused path's stripes (tierkit_count_pick_striped) into the table: table[l][e] += sum over s of
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

// Strided, caller-owned form (CountLauncher; the torch op tierkit::count_topk and the C entry
// point): one layer's ids [tokens, k] with a row stride (elements; >= k), counted into a table the
// caller owns (u32 [layers][experts] + a rejected word `err`) under its control block `ctl` (u32 [4],
// nullptr = count everything). Same semantics as tierkit_count_ctl_* for that layer: disabled ->
// nothing; rows t >= ctl[1] skipped; out-of-range ids go to `err`. Grid-stride over tokens * k.
template <typename T>
__device__ __forceinline__ void tierkit_count_strided(const T* __restrict__ ids, unsigned int tokens,
                                                      unsigned int k, unsigned long long row_stride,
                                                      unsigned int layer, unsigned int layers,
                                                      unsigned int experts, unsigned int* table,
                                                      unsigned int* err, const unsigned int* ctl) {
    // tokens * k <= u32::MAX (check_strided); the index is 64-bit so the grid stride cannot wrap
    const unsigned int valid = tierkit_count_valid_per_layer(ctl, tokens * k, k);
    if (valid == 0u) return;
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < valid; i += stride) {
        const unsigned long long t = i / k;
        const unsigned int j = (unsigned int)(i - t * k);
        const long long v = (long long)ids[(unsigned long long)t * row_stride + j];
        tierkit_count_pick(table, err, layer, layers, v, experts);
    }
}

extern "C" __global__ void tierkit_count_strided_i32(const int* __restrict__ ids, unsigned int tokens,
                                                     unsigned int k, unsigned long long row_stride,
                                                     unsigned int layer, unsigned int layers,
                                                     unsigned int experts, unsigned int* table,
                                                     unsigned int* err, const unsigned int* ctl) {
    tierkit_count_strided<int>(ids, tokens, k, row_stride, layer, layers, experts, table, err, ctl);
}

extern "C" __global__ void tierkit_count_strided_i64(const long long* __restrict__ ids,
                                                     unsigned int tokens, unsigned int k,
                                                     unsigned long long row_stride, unsigned int layer,
                                                     unsigned int layers, unsigned int experts,
                                                     unsigned int* table, unsigned int* err,
                                                     const unsigned int* ctl) {
    tierkit_count_strided<long long>(ids, tokens, k, row_stride, layer, layers, experts, table, err, ctl);
}
