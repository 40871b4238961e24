// tierkit: device primitives of the KV kernels (kv-elastic): fast division, row addressing, warp
// copies, the block's per-entry structs and block-wide scans. Prepended, after kv_abi.cuh, to
// kv_clock.cuh, kv_resolve.cu and kv_copy.cu (one NVRTC module, cuda_kernels::kv::KV_MODULE).

__device__ __forceinline__ unsigned int kv_quo(const KvDiv& v, unsigned int x) {
    return (__umulhi(x, v.mul) + x) >> v.shr;
}

__device__ __forceinline__ unsigned int kv_rem(const KvDiv& v, unsigned int x) { return x - kv_quo(v, x) * v.d; }

// Keeps a table pointer in a register (an opaque asm), so each lookup is one 32-bit index scaled onto
// it; __isGlobal keeps the loads global (LDG). Only for pointers into the device tables.
__device__ __forceinline__ void kv_pin(const int*& p) {
    asm("" : "+l"(p));
    __builtin_assume(__isGlobal(p));
}

// Byte offset of plane `layer` in the arena: (arena_rows / page_rows) pages of fmt_page_bytes each.
__device__ __forceinline__ unsigned long long kv_plane(const KvDims& d, unsigned int layer) {
    return (unsigned long long)layer * (d.arena_rows / d.page_rows) * d.fmt_page_bytes;
}

// A row's two segments in the arena (byte offsets): its value, then its scale (empty for
// KV_FMT_CONTIGUOUS).
struct KvSegs {
    unsigned long long value, scale;
};

// The segment rule (cuda-kernels/DESIGN.md, "Row formats"; the host's copy: KvDims::row_segs and
// kv_elastic::Geometry::row_offsets): arena row `row` of plane `layer` is at page row / page_rows,
// slot row % page_rows; its value at page x fmt_page_bytes + slot x value_bytes, its scale at
// page x fmt_page_bytes + page_rows x value_bytes + slot x scale_bytes. The contiguous format is the
// one-segment case (value_bytes = row_bytes, fmt_page_bytes = page_rows x row_bytes: the value at
// row x row_bytes), so every copy path takes this one rule.
//
// Contiguous rows take the closed form (layer x arena_rows + row) x row_bytes, which is the same
// offset without the division by page_rows: `d` is a kernel parameter, so the branch is uniform
// across the grid and costs no divergence (review of the paged split change: one division per row
// copy on the common format otherwise).
__device__ __forceinline__ KvSegs kv_row_segs(const KvDims& d, unsigned int layer, unsigned int row) {
    if (d.fmt == KV_FMT_CONTIGUOUS) {
        KvSegs s;
        s.value = ((unsigned long long)layer * d.arena_rows + row) * d.row_bytes;
        s.scale = s.value + d.row_bytes;
        return s;
    }
    const unsigned int page = row / d.page_rows, slot = row - page * d.page_rows;
    const unsigned long long base = kv_plane(d, layer) + page * d.fmt_page_bytes;
    KvSegs s;
    s.value = base + (unsigned long long)slot * d.value_bytes;
    s.scale = base + (unsigned long long)d.page_rows * d.value_bytes + (unsigned long long)slot * d.scale_bytes;
    return s;
}

__device__ __forceinline__ unsigned long long kv_host_off(const KvDims& d, unsigned int slot, unsigned int pos,
                                                         unsigned int layer) {
    return (((unsigned long long)slot * d.max_history + pos) * d.layers + layer) * d.row_bytes;
}

// Arena row of fixed local row `local` of a slot whose fixed pages are `fp` (its row of the
// fixed-page table, in global or shared memory).
__device__ __forceinline__ int kv_fixed_row_at(const KvDims& d, const int* fp, unsigned int local) {
    return fp[local / d.page_rows] * (int)d.page_rows + (int)(local % d.page_rows);
}

// kv_fixed_row_at with page_rows as a KvDiv (the lean engine's path).
__device__ __forceinline__ int kv_fixed_row_fd(const KvDiv& pr, const int* fp, unsigned int local) {
    const unsigned int j = kv_quo(pr, local);
    return fp[j] * (int)pr.d + (int)(local - j * pr.d);
}

__device__ __forceinline__ const int* kv_slot_fixed(const KvDims& d, const KvTables& t, unsigned int slot) {
    return t.fixed_pages + (unsigned long long)slot * d.fixed_pages;
}

__device__ __forceinline__ int kv_fixed_row(const KvDims& d, const KvTables& t, unsigned int slot,
                                            unsigned int local) {
    return kv_fixed_row_at(d, kv_slot_fixed(d, t, slot), local);
}

// One warp copies `bytes` bytes; 16-byte loads when sizes and addresses allow, two in flight per lane.
__device__ __forceinline__ void kv_warp_copy(unsigned char* dst, const unsigned char* src, unsigned int bytes,
                                             unsigned int lane) {
    if (((bytes | (unsigned int)(size_t)dst | (unsigned int)(size_t)src) & 15u) == 0u) {
        const uint4* s = (const uint4*)src;
        uint4* o = (uint4*)dst;
        const unsigned int n = bytes >> 4;
        for (unsigned int i = lane; i < n; i += 64u) {
            const uint4 a = s[i];
            const bool hb = i + 32u < n;
            uint4 b;
            if (hb) b = s[i + 32u];
            o[i] = a;
            if (hb) o[i + 32u] = b;
        }
    } else if (((bytes | (unsigned int)(size_t)dst | (unsigned int)(size_t)src) & 7u) == 0u) {
        // 8-byte words: DeepSeek-V4's 584-byte host rows are 8-aligned, every other one not 16-aligned.
        const uint2* s = (const uint2*)src;
        uint2* o = (uint2*)dst;
        for (unsigned int i = lane; i < (bytes >> 3); i += 32u) o[i] = s[i];
    } else if (((bytes | (unsigned int)(size_t)dst | (unsigned int)(size_t)src) & 3u) == 0u) {
        const unsigned int* s = (const unsigned int*)src;
        unsigned int* o = (unsigned int*)dst;
        for (unsigned int i = lane; i < (bytes >> 2); i += 32u) o[i] = s[i];
    } else {
        for (unsigned int i = lane; i < bytes; i += 32u) dst[i] = src[i];
    }
}

// One warp copies arena row `row` of plane `layer` and the host row at byte `h` of the host store
// (value ‖ scale, row_bytes bytes) into each other: host -> arena, or arena -> host when `to_host`.
// Every row copy of the module goes through here (gather, replay, write-back).
__device__ __forceinline__ void kv_copy_row(const KvDims& d, const KvTables& t, unsigned int layer, unsigned int row,
                                            unsigned long long h, bool to_host, unsigned int lane) {
    const KvSegs s = kv_row_segs(d, layer, row);
    unsigned char* const host = t.host + h;
    if (to_host) {
        kv_warp_copy(host, t.arena + s.value, d.value_bytes, lane);
        if (d.scale_bytes) kv_warp_copy(host + d.value_bytes, t.arena + s.scale, d.scale_bytes, lane);
    } else {
        kv_warp_copy(t.arena + s.value, host, d.value_bytes, lane);
        if (d.scale_bytes) kv_warp_copy(t.arena + s.scale, host + d.value_bytes, d.scale_bytes, lane);
    }
}

// Gathers plan rows from mapped host memory into layers [l0, l0 + nl): one warp per row. A plan
// may be caller-written (replay of a user tensor): an entry whose slot, position or destination row
// is out of range, or whose layer range exceeds the arena, is skipped and counted once as a stale
// plan entry, so no plan can read or write outside the host store / arena.
__device__ void kv_fetch(const KvDims& d, const KvTables& t, const KvCopy* plan, unsigned int n, unsigned int l0,
                         unsigned int nl) {
    const unsigned int lane = threadIdx.x & 31u, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const unsigned long long total = (unsigned long long)n * nl;
    for (unsigned long long w = warp; w < total; w += nw) {
        const unsigned int i = (unsigned int)(w % n), l = l0 + (unsigned int)(w / n);
        const KvCopy c = plan[i];
        if (c.slot >= d.max_slots || c.position >= d.max_history || c.dst_row >= d.arena_rows || l >= d.layers) {
            if (lane == 0 && w < n) atomicAdd(&t.err[KV_ERR_STALE_PLAN], 1u);
            continue;
        }
        kv_copy_row(d, t, l, c.dst_row, kv_host_off(d, c.slot, c.position, l), false, lane);
    }
}

extern __shared__ unsigned int kv_dyn[];

// One entry (batch element) of a resolve call once validated: what its helpers share (by reference).
struct KvEntry {
    unsigned int slot;         // session slot
    KvSlotDesc s;              // its descriptor
    int limit;                 // the entry's seq_len
    unsigned int row0, R;      // its first query row and its rows
    unsigned int F, per;       // its picks (R x k) and picks per thread (lean)
    unsigned int f0, fe;       // this thread's picks f0 .. fe (lean)
    unsigned long long call;   // this call's number for the slot
    unsigned int hand;         // the slot's CLOCK hand before the call
    KvCopy* plan;              // its plan segment (hot_rows copies)
    unsigned int* plan_count;  // its plan count
    unsigned int* stats;       // its stats row (KV_STATS)
};

// A lean thread's picks and the speculative lookups of trip 2 (registers).
struct KvLookups {
    int p[KV_FAST_PER];            // the picks
    int rl[KV_FAST_PER];           // their rows' causal bounds (KV_NO_BOUND without per-query bounds)
    int pg[KV_FAST_PER];           // page-table entries of their pages
    unsigned int pj[KV_FAST_PER];  // their pages
    int hs[KV_FAST_PER];           // position-table entries (hot slots)
};

// A block's shared scratch (static arrays and the dynamic kv_dyn regions).
struct KvShared {
    unsigned int* bits;       // victim candidate bitmaps, 2 x ceil(hot_rows / 32) (dynamic)
    int* fp;                  // the slot's fixed pages (dynamic, after the bitmaps)
    unsigned int* warp_sums;  // [32]
    unsigned int* rows;       // [KV_FAST_MAX_ROWS + 1]: per-row counts (in place) or first ranks (packed)
    unsigned int* count;      // [KV_STATS]: the entry's counters
    unsigned int* part;       // [32 x KV_LEAN_PARTS]: the lean preview's per-warp partials
    unsigned int* taken;      // victims taken
    int* last;                // scan index of the last victim
};

// Exclusive block-wide prefix sum of a u32 (blockDim.x a multiple of 32, <= 1024).
__device__ __forceinline__ unsigned int kv_block_scan_u32(unsigned int v, unsigned int* total,
                                                          unsigned int* warp_sums) {
    const unsigned int lane = threadIdx.x & 31u, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    unsigned int x = v;
#pragma unroll
    for (unsigned int o = 1; o < 32u; o <<= 1) {
        const unsigned int y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o) x += y;
    }
    __syncthreads();  // warp_sums may still be read by the previous call
    if (lane == 31u) warp_sums[warp] = x;
    __syncthreads();
    unsigned int before = 0, sum = 0;
    for (unsigned int w = 0; w < nw; ++w) {
        const unsigned int s = warp_sums[w];
        if (w < warp) before += s;
        sum += s;
    }
    *total = sum;
    return before + x - v;
}

// The sum of v over the warp, in every lane (all lanes call it): one REDUX on sm_80 and later,
// five shuffle-and-add steps before (the module still compiles for older GPUs).
__device__ __forceinline__ unsigned int kv_warp_sum(unsigned int v) {
#if __CUDA_ARCH__ >= 800
    return __reduce_add_sync(0xffffffffu, v);
#else
#pragma unroll
    for (unsigned int o = 16; o > 0u; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
#endif
}

__device__ __forceinline__ unsigned int kv_bit(const unsigned int* bits, unsigned int s) {
    return (bits[s >> 5] >> (s & 31u)) & 1u;
}

// Stores a thread's consecutive outputs o[0 .. n): one 16- or 8-byte store when n and the address allow.
__device__ __forceinline__ void kv_store_picks(int* o, const int (&out)[KV_FAST_PER], unsigned int n) {
    const unsigned long long a = (unsigned long long)(size_t)o;
    if (n == 4u && (a & 15u) == 0u) {
        *(int4*)o = make_int4(out[0], out[1], out[2], out[3]);
    } else if (n == 2u && (a & 7u) == 0u) {
        *(int2*)o = make_int2(out[0], out[1]);
    } else {
#pragma unroll
        for (unsigned int i = 0; i < KV_FAST_PER; ++i)
            if (i < n) o[i] = out[i];
    }
}

// Loads a thread's consecutive picks p[0 .. n) (-1 beyond n): one 16- or 8-byte load when n and the
// address allow.
__device__ __forceinline__ void kv_load_picks(const int* g, int (&p)[KV_FAST_PER], unsigned int n) {
    const unsigned long long a = (unsigned long long)(size_t)g;
    if (n == 4u && (a & 15u) == 0u) {
        const int4 v = *(const int4*)g;
        p[0] = v.x, p[1] = v.y, p[2] = v.z, p[3] = v.w;
    } else if (n == 2u && (a & 7u) == 0u) {
        const int2 v = *(const int2*)g;
        p[0] = v.x, p[1] = v.y, p[2] = -1, p[3] = -1;
    } else {
#pragma unroll
        for (unsigned int i = 0; i < KV_FAST_PER; ++i) p[i] = i < n ? g[i] : -1;
    }
}
