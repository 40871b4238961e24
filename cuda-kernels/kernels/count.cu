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
