// tierkit-testkit: stand-in kernels for the KV decode-step benchmark and tests (never part of a
// library): the block-table conversion a fully resident engine runs (`tierkit_kv_resident_indices`,
// the baseline the resolve is compared with) and a gather-and-dot sparse-attention stand-in
// (`tierkit_kv_attend`), moved verbatim from cuda-kernels/kernels/kv_resolve.cu; and a stream gate
// for timing (`tierkit_spin_until`).

// Baseline of a fully resident cache: positions -> rows through a block table
// (row = block_table[slot][p / page_rows] * page_rows + p % page_rows), -1 for invalid picks.
extern "C" __global__ void tierkit_kv_resident_indices(const int* __restrict__ topk, const int* __restrict__ qsl,
                                                       const int* __restrict__ seq_lens,
                                                       const int* __restrict__ block_table, unsigned int max_blocks,
                                                       unsigned int page_rows, unsigned int sessions, unsigned int k,
                                                       int* __restrict__ indices, int* __restrict__ valid_count) {
    const unsigned int r = blockIdx.x;
    if (r >= sessions) return;
    const int limit = seq_lens[r];
    for (int row = qsl[r]; row < qsl[r + 1]; ++row) {
        unsigned int valid = 0;
        for (unsigned int j0 = 0; j0 < k; j0 += blockDim.x) {
            const unsigned int j = j0 + threadIdx.x;
            int out = -1;
            if (j < k) {
                const int p = topk[(unsigned long long)row * k + j];
                if (p >= 0 && p < limit && (unsigned int)p / page_rows < max_blocks)
                    out = block_table[(unsigned long long)r * max_blocks + p / page_rows] * (int)page_rows +
                          (int)((unsigned int)p % page_rows);
                indices[(unsigned long long)row * k + j] = out;
            }
            valid += (unsigned int)__syncthreads_count(out >= 0);
        }
        if (threadIdx.x == 0) valid_count[row] = (int)valid;
    }
}

// Sparse-attention stand-in for the decode-step benchmark: block per query row, warp per pick; the
// score of a pick is the dot of its row's bytes with q (f32 [row_bytes]); out[row] = mean score.
extern "C" __global__ void tierkit_kv_attend(const unsigned char* __restrict__ plane, unsigned int row_bytes,
                                             const int* __restrict__ indices, const int* __restrict__ valid_count,
                                             unsigned int k, const float* __restrict__ q, float* __restrict__ out) {
    extern __shared__ float qs[];
    __shared__ float partial[32];
    const unsigned int row = blockIdx.x, lane = threadIdx.x & 31u, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (unsigned int i = threadIdx.x; i < row_bytes; i += blockDim.x) qs[i] = q[i];
    __syncthreads();
    float acc = 0.f;
    const unsigned int words = row_bytes >> 4;
    for (unsigned int j = warp; j < k; j += nw) {
        const int idx = indices[(unsigned long long)row * k + j];
        if (idx < 0) continue;
        const uint4* src = (const uint4*)(plane + (unsigned long long)idx * row_bytes);
        for (unsigned int w = lane; w < words; w += 32u) {
            const uint4 v = src[w];
            const unsigned int u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
            for (int e = 0; e < 4; ++e)
#pragma unroll
                for (int b = 0; b < 4; ++b) acc += (float)((u[e] >> (8 * b)) & 0xffu) * qs[w * 16u + e * 4u + b];
        }
    }
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_down_sync(0xffffffffu, acc, o);
    if (lane == 0) partial[warp] = acc;
    __syncthreads();
    if (threadIdx.x == 0) {
        float s = 0.f;
        for (unsigned int w = 0; w < nw; ++w) s += partial[w];
        const int v = valid_count[row];
        out[row] = v > 0 ? s / (float)v : 0.f;
    }
}

// Holds a stream until the host writes a non-zero word at `flag` (mapped pinned memory), or until
// `max_ns` nanoseconds passed (never a hang if the host cannot release it). One thread. Benchmarks
// queue work behind it on several streams, then release them together.
extern "C" __global__ void tierkit_spin_until(const volatile unsigned int* flag, unsigned long long max_ns) {
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    while (*flag == 0u) {
        __nanosleep(2000);
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
        if (t - t0 > max_ns) break;
    }
}
