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

// ---- Stand-ins of the GPU serving benchmark (benches/src/bin/kv_serving_bench.rs) ----

// The step's new KV rows: writes a pseudo-random row (from row, layer, seed) into arena row rows[i] of
// every layer plane (plane l at arena + l * plane_bytes), as a decode step's attention writes each
// request's new token. Block per row, 4-byte words (row_bytes % 4 == 0).
extern "C" __global__ void tierkit_kv_write_rows(unsigned char* __restrict__ arena, unsigned long long plane_bytes,
                                                 unsigned int row_bytes, unsigned int layers,
                                                 const int* __restrict__ rows, unsigned int n, unsigned int seed) {
    const unsigned int i = blockIdx.x;
    if (i >= n) return;
    const int row = rows[i];
    if (row < 0) return;
    const unsigned int words = row_bytes >> 2;
    for (unsigned int l = 0; l < layers; ++l) {
        unsigned int* dst = (unsigned int*)(arena + l * plane_bytes + (unsigned long long)row * row_bytes);
        for (unsigned int w = threadIdx.x; w < words; w += blockDim.x) {
            unsigned int h = (unsigned int)row * 0x9E3779B1u ^ (l * 0x85EBCA77u) ^ (w * 0xC2B2AE3Du) ^ seed;
            h ^= h >> 15;
            h *= 0x2C1B3C6Du;
            h ^= h >> 12;
            dst[w] = h;
        }
    }
}

// The step's base cost: streams n16 16-byte words of HBM (the weights a decode step reads) and
// folds them into sink[blockIdx.x] so the read cannot be elided.
extern "C" __global__ void tierkit_kv_stream_read(const uint4* __restrict__ buf, unsigned long long n16,
                                                  unsigned int* __restrict__ sink) {
    unsigned int acc = 0;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n16;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        const uint4 v = buf[i];
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    for (int o = 16; o > 0; o >>= 1) acc ^= __shfl_down_sync(0xffffffffu, acc, o);
    if ((threadIdx.x & 31u) == 0) atomicXor(&sink[blockIdx.x], acc);
}

struct TierkitKvCopy {
    unsigned int slot, position, dst_row, pad;
};

// The miss traffic of the layers a physical layer group does not hold: for each entry of the
// resolve's plan (block b = request, entries plan[b * stride ..][.. count[b]]), reads `reps` rows of
// row_bytes from mapped pinned host memory (`host`, host_rows rows) at pseudo-random rows (from
// slot, position, rep, salt; spread over a buffer far larger than L2 so the reads cross PCIe), a
// warp per row, gridDim.y blocks per segment, 16-byte words (row_bytes % 16 == 0), folded into sink[b].
extern "C" __global__ void tierkit_kv_shadow_fetch(const TierkitKvCopy* __restrict__ plan,
                                                   const unsigned int* __restrict__ count, unsigned int stride,
                                                   const unsigned char* __restrict__ host,
                                                   unsigned long long host_rows, unsigned int row_bytes,
                                                   unsigned int reps, unsigned int salt,
                                                   unsigned int* __restrict__ sink) {
    const unsigned int b = blockIdx.x, lane = threadIdx.x & 31u, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const unsigned int n = count[b];
    const unsigned int words = row_bytes >> 4;
    // Blocks (b, y) of one segment share its n * reps rows (warp-strided over gridDim.y blocks).
    const unsigned int first = blockIdx.y * nw + warp, step = nw * gridDim.y;
    unsigned int acc = 0;
    for (unsigned long long j = first; j < (unsigned long long)n * reps; j += step) {
        const TierkitKvCopy c = plan[(unsigned long long)b * stride + j / reps];
        const unsigned int rep = (unsigned int)(j % reps);
        unsigned long long h = ((unsigned long long)c.slot << 40) ^ ((unsigned long long)c.position << 8) ^
                               ((unsigned long long)rep * 0x9E3779B97F4A7C15ull) ^ salt;
        h ^= h >> 31;
        h *= 0xBF58476D1CE4E5B9ull;
        h ^= h >> 29;
        const uint4* src = (const uint4*)(host + (h % host_rows) * row_bytes);
        for (unsigned int w = lane; w < words; w += 32u) {
            const uint4 v = src[w];
            acc ^= v.x ^ v.y ^ v.z ^ v.w;
        }
    }
    for (int o = 16; o > 0; o >>= 1) acc ^= __shfl_down_sync(0xffffffffu, acc, o);
    if (lane == 0) atomicXor(&sink[b], acc);
}
