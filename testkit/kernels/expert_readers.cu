// tierkit-testkit: readers of an expert store's indirection table (tests and benches only).
// Moved verbatim from cuda-kernels' former bank.cu.

__device__ __forceinline__ unsigned int tierkit_mix(unsigned int w, unsigned int i) {
    unsigned int h = (w ^ (i * 0x9E3779B9u)) * 0x85EBCA6Bu;
    return h ^ (h >> 13);
}

// Checksum reader: block b verifies entry picks[b] (a flat layer * experts + expert index) by
// reading the expert through the indirection table (HBM slot or mapped pinned host memory).
// Expert layout (u32 words): w[0] = tag (flat index), w[last] = sum_{i < last} mix(w[i], i).
// errors[0] += 1 for each expert whose tag or checksum does not match; errors[1] = last bad index.
extern "C" __global__ void tierkit_verify_experts(const unsigned long long* table, const unsigned int* picks,
                                                  unsigned int n_picks, unsigned long long words,
                                                  unsigned int* errors) {
    __shared__ unsigned int partial[32];
    if (blockIdx.x >= n_picks) return;
    const unsigned int flat = picks[blockIdx.x];
    const unsigned int* w = (const unsigned int*)table[flat];
    const unsigned long long last = words - 1ull;
    unsigned int sum = 0u;
    for (unsigned long long i = threadIdx.x; i < last; i += blockDim.x) {
        sum += tierkit_mix(w[i], (unsigned int)i);
    }
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_down_sync(0xFFFFFFFFu, sum, o);
    if ((threadIdx.x & 31u) == 0u) partial[threadIdx.x >> 5] = sum;
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned int total = 0u;
        for (unsigned int i = 0; i < (blockDim.x + 31u) / 32u; ++i) total += partial[i];
        if (w[0] != flat || w[last] != total) {
            atomicAdd(errors, 1u);
            errors[1] = flat;
        }
    }
}

// Bandwidth reader used as a stand-in step: each block reads its share of the expert at
// table[picks[blockIdx.y]] (16-byte loads) and folds it into sink[0] so the read is not elided.
extern "C" __global__ void tierkit_touch_experts(const unsigned long long* table, const unsigned int* picks,
                                                 unsigned long long bytes, unsigned int* sink) {
    const uint4* p = (const uint4*)table[picks[blockIdx.y]];
    const unsigned long long n = bytes / 16ull;
    unsigned int acc = 0u;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        const uint4 v = p[i];
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x7FFFFFFFu) sink[0] = acc;  // practically never: keeps the loads alive
}
