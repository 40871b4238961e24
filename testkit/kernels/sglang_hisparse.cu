// Copyright 2023-2026 SGLang Team (sgl-project/sglang)
//
// Licensed under the Apache License, Version 2.0 (the "License");
// you may not use this file except in compliance with the License.
// You may obtain a copy of the License at
//
//     http://www.apache.org/licenses/LICENSE-2.0
//
// Unless required by applicable law or agreed to in writing, software
// distributed under the License is distributed on an "AS IS" BASIS,
// WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
// See the License for the specific language governing permissions and
// limitations under the License.
//
// ---------------------------------------------------------------------------------------------
// A port of SGLang HiSparse's swap-in kernel `load_cache_to_device_buffer_kernel`, used only as the
// peer in tierkit's `kv_gpu_bench --mode peer` (dev-only, never shipped in a library crate).
//
// Source: https://github.com/sgl-project/sglang, python/sglang/jit_kernel/csrc/hisparse.cuh at
// commit 010c0028f2e93000b5249dbbef967c22fc0a4cb8 (the file the sglang 0.5.x wheels JIT-compile
// through `load_cache_to_device_buffer_mla`; the same algorithm is in
// python/sglang/kernels/jit/csrc/kvcacheio/hisparse.cuh of later trees).
//
// Modifications (tierkit, 2026): only what NVRTC without SGLang's headers needs, nothing in the
// algorithm:
// - the CUDA (non-ROCm) path only; the generic linear layout (IsDsv4Layout = false) of the MLA
//   variant (IsMLA = true: K only); int32 seq_lens and req_pool_indices;
// - the tvm-ffi launcher is replaced by `extern "C"` entry points, one per (top-k, hot buffer size)
//   the benchmark uses, launched by tierkit-testkit's `SglangHisparse` exactly as SGLang's
//   launcher does (grid = batch, the coordinator's 960 threads per block, dynamic shared memory =
//   SmemLayout::BYTES);
// - a SKIP_COPY template flag (the `_nocopy` entry points) leaves the final miss-copy loop out, so the
//   benchmark can time the kernel's bookkeeping alone; everything else runs unchanged;
// - fixed-width integer names are local typedefs (NVRTC has no <stdint.h> here).
// ---------------------------------------------------------------------------------------------

typedef int sg_i32;
typedef short sg_i16;
typedef long long sg_i64;
typedef unsigned int sg_u32;
typedef unsigned long long sg_u64;

namespace {

constexpr int WARP_SIZE = 32;
typedef unsigned int BallotMask;
constexpr BallotMask FULL_WARP_MASK = 0xFFFFFFFFu;
constexpr sg_i32 TOKEN_HIT = (sg_i32)0xFFFFFFFF;
constexpr sg_i32 HASH_EMPTY = -1;

// Knuth multiplicative hash for open-addressing table of size hash_size.
__device__ __forceinline__ int hash_slot(sg_i32 key, int hash_size) {
    return ((sg_u32)key * 2654435761u) % (sg_u32)hash_size;
}

__device__ __forceinline__ void transfer_item_warp(sg_i32 lane_id, const void* src_addr, void* dst_addr,
                                                   sg_i64 item_size_bytes) {
    // 128-bit bulk transfer via paired 64-bit loads (avoids alignment issues with uint4)
    const int total_pairs = item_size_bytes / 16;  // number of 16-byte chunks
    {
        const sg_u64* __restrict__ src = static_cast<const sg_u64*>(src_addr);
        sg_u64* __restrict__ dst = static_cast<sg_u64*>(dst_addr);
        for (int j = lane_id; j < total_pairs; j += WARP_SIZE) {
            sg_u64 lo, hi;
            const sg_u64* s = src + j * 2;
            asm volatile("ld.global.nc.v2.b64 {%0,%1},[%2];" : "=l"(lo), "=l"(hi) : "l"(s) : "memory");
            sg_u64* d = dst + j * 2;
            asm volatile("st.global.cg.v2.b64 [%0],{%1,%2};" ::"l"(d), "l"(lo), "l"(hi) : "memory");
        }
    }

    // Tail: 64-bit for remaining 8-byte chunk (if item_size not multiple of 16)
    const int tail_8B = (item_size_bytes - total_pairs * 16) / 8;
    if (tail_8B > 0 && lane_id < tail_8B) {
        const sg_u64* __restrict__ src8 =
            reinterpret_cast<const sg_u64*>(static_cast<const char*>(src_addr) + total_pairs * 16);
        sg_u64* __restrict__ dst8 = reinterpret_cast<sg_u64*>(static_cast<char*>(dst_addr) + total_pairs * 16);
        sg_u64 tmp;
        asm volatile("ld.global.nc.b64 %0,[%1];" : "=l"(tmp) : "l"(src8 + lane_id) : "memory");
        asm volatile("st.global.cg.b64 [%0],%1;" ::"l"(dst8 + lane_id), "l"(tmp) : "memory");
    }
}

__device__ __forceinline__ int popc_mask(BallotMask mask) { return __popc(mask); }

__device__ __forceinline__ int warp_inclusive_scan(int* s_data, int lane_id, int offset, int count, int accumulator) {
    int idx = lane_id + offset;
    int val = (idx < count) ? s_data[idx] : 0;

#pragma unroll
    for (int i = 1; i < WARP_SIZE; i *= 2) {
        int n = __shfl_up_sync(FULL_WARP_MASK, val, i);
        if (lane_id >= i) val += n;
    }
    val += accumulator;
    if (idx < count) {
        s_data[idx] = val;
    }
    accumulator = __shfl_sync(FULL_WARP_MASK, val, WARP_SIZE - 1);
    return accumulator;
}

// Shared memory size calculation for dynamic allocation.
// Layout: int32_t region (4-byte aligned) followed by int16_t region (2-byte aligned).
template <int NUM_TOP_K, int HOT_BUFFER_SIZE>
struct SmemLayout {
    static constexpr int HASH_SIZE = NUM_TOP_K * 2;
    static constexpr int NUM_BUFFER_CHUNKS = (HOT_BUFFER_SIZE + WARP_SIZE - 1) / WARP_SIZE;
    // int32_t region: top_k_tokens + chunk_offset + evict_chunk_offset + hash_keys + total_hits + newest_hit
    static constexpr int TOTAL_INT32 = NUM_TOP_K + (NUM_BUFFER_CHUNKS + 1) + (NUM_BUFFER_CHUNKS + 1) + HASH_SIZE + 2;
    // int16_t region: lru_slots_out + hash_vals
    static constexpr int TOTAL_INT16 = HOT_BUFFER_SIZE + HASH_SIZE;
    static constexpr unsigned long long BYTES = TOTAL_INT32 * sizeof(sg_i32) + TOTAL_INT16 * sizeof(sg_i16);
};

// Each block processes one request.
// Layout: [HOT_BUFFER_SIZE slots for LRU] + [page_size slots for newest token]
// newest_slot is at HOT_BUFFER_SIZE (first position of extra page)
template <int BLOCK_SIZE, int NUM_TOP_K, int HOT_BUFFER_SIZE, bool SKIP_COPY>
__device__ __forceinline__ void load_cache_to_device_buffer_kernel(
    const sg_i32* __restrict__ top_k_tokens, sg_i32* __restrict__ device_buffer_tokens,
    const sg_i64* __restrict__ host_cache_locs, const sg_i32* __restrict__ device_buffer_locs,
    const void* __restrict__ host_cache_k, void* __restrict__ device_buffer_k, sg_i32* __restrict__ top_k_device_locs,
    const sg_i32* __restrict__ req_pool_indices, const sg_i32* __restrict__ seq_lens, sg_i16* __restrict__ lru_slots,
    const sg_i32* __restrict__ num_real_reqs, sg_i64 buffer_stride_0, sg_i64 host_stride, sg_i64 lru_slot_stride_0,
    sg_i64 top_k_tokens_stride, sg_i64 top_k_device_locs_stride, sg_i64 page_size, sg_i64 item_size_bytes,
    sg_i64* __restrict__ miss_src_out, sg_i64* __restrict__ miss_dst_out, sg_i32* __restrict__ miss_count_out,
    sg_i64 plan_stride) {
    constexpr int NUM_WARPS = BLOCK_SIZE / WARP_SIZE;
    constexpr int NUM_TOKEN_CHUNKS = (NUM_TOP_K + WARP_SIZE - 1) / WARP_SIZE;
    constexpr int NUM_BUFFER_CHUNKS = (HOT_BUFFER_SIZE + WARP_SIZE - 1) / WARP_SIZE;

    const int bid = blockIdx.x;
    // Early exit for padded blocks (CUDA graph pads batch to a captured size)
    if (bid >= num_real_reqs[0]) return;

    const int tid = threadIdx.x;
    const int warp_id = tid / WARP_SIZE;
    const int lane_id = tid % WARP_SIZE;
    const BallotMask lanes_before = (BallotMask(1) << lane_id) - BallotMask(1);

    const sg_i64 rid = req_pool_indices[bid];
    const sg_i64 seq_len = seq_lens[bid];

    // Calculate offsets for this request
    const sg_i32* req_top_k_tokens = top_k_tokens + bid * top_k_tokens_stride;
    sg_i32* req_top_k_device_locs = top_k_device_locs + bid * top_k_device_locs_stride;

    const sg_i64 buffer_offset = rid * buffer_stride_0;
    sg_i32* req_device_buffer_tokens = device_buffer_tokens + buffer_offset;
    const sg_i32* req_device_buffer_locs = device_buffer_locs + buffer_offset;
    const sg_i64* req_host_cache_locs = host_cache_locs + rid * host_stride;
    sg_i16* req_lru_slots = lru_slots + rid * lru_slot_stride_0;

    // Fast path: short sequences have all tokens in the device buffer in order.
    if (seq_len <= HOT_BUFFER_SIZE) {
        const int count = (seq_len < NUM_TOP_K) ? static_cast<int>(seq_len) : NUM_TOP_K;
        for (int i = tid; i < count; i += BLOCK_SIZE) {
            sg_i32 token_pos = req_top_k_tokens[i];
            if (token_pos >= 0) {
                req_top_k_device_locs[i] = req_device_buffer_locs[token_pos];
            }
        }
        // Short sequences load nothing from host: an empty miss plan for this request.
        if (miss_count_out != nullptr && tid == 0) {
            miss_count_out[bid] = 0;
        }
        return;
    }

    // Dynamic shared memory layout: int32_t arrays first, then int16_t arrays.
    extern __shared__ char smem_raw[];
    using Layout = SmemLayout<NUM_TOP_K, HOT_BUFFER_SIZE>;
    constexpr int HASH_SIZE = Layout::HASH_SIZE;

    sg_i32* smem_i32 = reinterpret_cast<sg_i32*>(smem_raw);
    // Top-k token positions; reused as miss-token scratch in the copy phase
    sg_i32* s_top_k_tokens = smem_i32;
    // Prefix-sum offsets for hit counting and miss counting
    sg_i32* s_chunk_offset = s_top_k_tokens + NUM_TOP_K;
    // Prefix-sum offsets for evictable counting
    sg_i32* s_evict_chunk_offset = s_chunk_offset + (NUM_BUFFER_CHUNKS + 1);
    // Open-addressing hash table: top-k token_id -> top-k index (keys)
    sg_i32* s_hash_keys = s_evict_chunk_offset + (NUM_BUFFER_CHUNKS + 1);
    // Scalar counters
    sg_i32& s_total_hits = s_hash_keys[HASH_SIZE];
    sg_i32& s_newest_hit = s_hash_keys[HASH_SIZE + 1];

    sg_i16* smem_i16 = reinterpret_cast<sg_i16*>(smem_i32 + Layout::TOTAL_INT32);
    // Compacted slot ordering: [hits fwd->  ...  <-evictables bwd]
    sg_i16* s_lru_slots_out = smem_i16;
    // Open-addressing hash table: top-k token_id -> top-k index (values)
    sg_i16* s_hash_vals = s_lru_slots_out + HOT_BUFFER_SIZE;

    // Initialize shared memory: counters, hash table, prefix-sum offsets.
    if (tid == 0) {
        s_total_hits = 0;
        s_newest_hit = 0;
    }
    for (int i = tid; i < HASH_SIZE; i += BLOCK_SIZE) {
        s_hash_keys[i] = HASH_EMPTY;
    }
    for (int i = tid; i < NUM_BUFFER_CHUNKS + 1; i += BLOCK_SIZE) {
        s_chunk_offset[i] = 0;
        s_evict_chunk_offset[i] = 0;
    }
    __syncthreads();

    const int newest_slot = HOT_BUFFER_SIZE;
    const sg_i32 newest_token = seq_len - 1;

    // Insert top-k tokens into shared-memory hash table.
    for (int i = tid; i < NUM_TOP_K; i += BLOCK_SIZE) {
        sg_i32 token_idx = req_top_k_tokens[i];
        if (token_idx == newest_token) {
            // If topk includes the latest token, bind its canonical occurrence to newest_slot (at
            // HOT_BUFFER_SIZE) and mark it as a hit. newest_slot is at the first position of the extra
            // page, excluded from LRU tracking.
            s_top_k_tokens[i] = TOKEN_HIT;
            req_top_k_device_locs[i] = req_device_buffer_locs[newest_slot];
            s_newest_hit = 1;
        } else {
            int slot = hash_slot(token_idx, HASH_SIZE);
            while (true) {
                sg_i32 old = atomicCAS(&s_hash_keys[slot], HASH_EMPTY, token_idx);
                if (old == HASH_EMPTY || old == token_idx) {
                    s_hash_vals[slot] = static_cast<sg_i16>(i);
                    break;
                }
                slot = (slot + 1) % HASH_SIZE;
            }
            s_top_k_tokens[i] = token_idx;
        }
    }
    __syncthreads();

    constexpr int ITERATIONS_PER_WARP_BUFFER = (NUM_BUFFER_CHUNKS + NUM_WARPS - 1) / NUM_WARPS;
    int total_hit_count = 0;
    int total_evict_count = 0;
    for (int iter = 0; iter < ITERATIONS_PER_WARP_BUFFER; iter++) {
        int chunk_idx = warp_id + iter * NUM_WARPS;
        bool has_valid_chunk = chunk_idx < NUM_BUFFER_CHUNKS;

        const int slot_idx = chunk_idx * WARP_SIZE + lane_id;
        const bool has_valid_slot = has_valid_chunk && (slot_idx < HOT_BUFFER_SIZE);
        const sg_i16 buf_slot = has_valid_slot ? req_lru_slots[slot_idx] : -1;
        sg_i32 my_buffer_token = (buf_slot >= 0) ? req_device_buffer_tokens[buf_slot] : -1;
        int my_found_top_k_idx = -1;
        if (my_buffer_token >= 0) {
            int h = hash_slot(my_buffer_token, HASH_SIZE);
            while (true) {
                sg_i32 k = s_hash_keys[h];
                if (k == my_buffer_token) {
                    my_found_top_k_idx = static_cast<sg_i32>(s_hash_vals[h]);
                    break;
                }
                if (k == HASH_EMPTY) break;
                h = (h + 1) % HASH_SIZE;
            }
        }
        bool is_hit = my_found_top_k_idx >= 0;
        bool is_evictable = has_valid_slot && !is_hit;

        // Record hits
        if (is_hit) {
            s_top_k_tokens[my_found_top_k_idx] = TOKEN_HIT;
            req_top_k_device_locs[my_found_top_k_idx] = req_device_buffer_locs[buf_slot];
        }

        int local_hit_offset = 0;
        int local_evict_offset = 0;
        if (has_valid_chunk) {
            const BallotMask hit_mask = __ballot_sync(FULL_WARP_MASK, is_hit);
            const BallotMask evict_mask = __ballot_sync(FULL_WARP_MASK, is_evictable);
            local_hit_offset = popc_mask(hit_mask & lanes_before);
            local_evict_offset = popc_mask(evict_mask & lanes_before);
            if (lane_id == 0) {
                s_chunk_offset[chunk_idx + 1] = popc_mask(hit_mask);
                s_evict_chunk_offset[chunk_idx + 1] = popc_mask(evict_mask);
            }
        }
        __syncthreads();

        if (warp_id == 0) {
            total_hit_count =
                warp_inclusive_scan(s_chunk_offset, lane_id, chunk_idx + 1, NUM_BUFFER_CHUNKS + 1, total_hit_count);
            total_evict_count = warp_inclusive_scan(s_evict_chunk_offset, lane_id, chunk_idx + 1,
                                                    NUM_BUFFER_CHUNKS + 1, total_evict_count);
            if (tid == 0) {
                s_total_hits = total_hit_count;
            }
        }
        __syncthreads();

        // Hits grow forward from index 0
        if (is_hit) {
            int hit_offset = s_chunk_offset[chunk_idx] + local_hit_offset;
            s_lru_slots_out[hit_offset] = buf_slot;
        }
        // Evictables grow backward from HOT_BUFFER_SIZE - 1
        if (is_evictable) {
            int evict_offset = s_evict_chunk_offset[chunk_idx] + local_evict_offset;
            s_lru_slots_out[HOT_BUFFER_SIZE - 1 - evict_offset] = buf_slot;
        }
    }
    __syncthreads();

    // Reset offsets for the miss counting phase (only NUM_TOKEN_CHUNKS + 1 entries needed).
    for (int i = tid; i < NUM_TOKEN_CHUNKS + 1; i += BLOCK_SIZE) {
        s_chunk_offset[i] = 0;
    }
    __syncthreads();

    // Third pass to identify misses and their evictable slots
    int total_misses = 0;
    constexpr int ITERATIONS_PER_WARP_TOKEN = (NUM_TOKEN_CHUNKS + NUM_WARPS - 1) / NUM_WARPS;
    for (int iter = 0; iter < ITERATIONS_PER_WARP_TOKEN; iter++) {
        int chunk_idx = warp_id + iter * NUM_WARPS;
        bool has_valid_chunk = chunk_idx < NUM_TOKEN_CHUNKS;

        const int chunk_token_start = chunk_idx * WARP_SIZE;
        const int my_token_idx = chunk_token_start + lane_id;
        const bool has_valid_token = has_valid_chunk && (my_token_idx < NUM_TOP_K);

        sg_i32 my_token = 0;
        bool is_miss = false;
        int local_miss_offset = 0;

        if (has_valid_token) {
            is_miss = s_top_k_tokens[my_token_idx] != TOKEN_HIT;
            if (is_miss) {
                my_token = s_top_k_tokens[my_token_idx];
            }
        }

        if (has_valid_chunk) {
            const BallotMask miss_mask = __ballot_sync(FULL_WARP_MASK, is_miss);
            local_miss_offset = popc_mask(miss_mask & lanes_before);
            const int warp_miss_count = popc_mask(miss_mask);
            if (lane_id == 0) {
                s_chunk_offset[chunk_idx + 1] = warp_miss_count;
            }
        }
        __syncthreads();

        if (warp_id == 0) {
            total_misses =
                warp_inclusive_scan(s_chunk_offset, lane_id, chunk_idx + 1, NUM_TOKEN_CHUNKS + 1, total_misses);
        }
        __syncthreads();

        if (is_miss) {
            int miss_offset = s_chunk_offset[chunk_idx] + local_miss_offset;
            sg_i16 evict_slot = s_lru_slots_out[HOT_BUFFER_SIZE - 1 - miss_offset];
            // Reuse s_top_k_tokens as miss scratch: miss_offset < my_token_idx always
            // holds (hits are skipped), so compacted writes never overrun pending reads.
            s_top_k_tokens[miss_offset] = my_token;
            req_top_k_device_locs[my_token_idx] = req_device_buffer_locs[evict_slot];
            req_device_buffer_tokens[evict_slot] = my_token;
        }
    }
    __syncthreads();

    total_misses = NUM_TOP_K - s_total_hits - s_newest_hit;
    if (miss_count_out != nullptr && tid == 0) {
        miss_count_out[bid] = total_misses;
    }
    // Write back LRU order: evictables at front (LRU), hits at back (MRU).
    {
        const int total_evictable = HOT_BUFFER_SIZE - s_total_hits;
        for (int i = tid; i < HOT_BUFFER_SIZE; i += BLOCK_SIZE) {
            if (i < total_misses) {
                // Misses: just loaded from host, place right before hits
                req_lru_slots[total_evictable - total_misses + i] = s_lru_slots_out[HOT_BUFFER_SIZE - 1 - i];
            } else if (i < total_evictable) {
                // Remaining evictables: truly stale, dest at LRU front
                req_lru_slots[i - total_misses] = s_lru_slots_out[HOT_BUFFER_SIZE - 1 - i];
            } else {
                // Hits: source at forward end, dest at MRU back
                req_lru_slots[i] = s_lru_slots_out[i - total_evictable];
            }
        }
    }

    if (SKIP_COPY) return;  // tierkit: bookkeeping-only variant (timing)

    // each warp copies one miss directly, can be separated into a new kernel if parallelism is a concern
    for (int miss_idx = warp_id; miss_idx < total_misses; miss_idx += NUM_WARPS) {
        const sg_i32 miss_token = s_top_k_tokens[miss_idx];
        const sg_i16 evict_slot = s_lru_slots_out[HOT_BUFFER_SIZE - 1 - miss_idx];

        const sg_i64 src_loc = req_host_cache_locs[miss_token];
        const sg_i64 dst_loc = static_cast<sg_i64>(req_device_buffer_locs[evict_slot]);

        // Record the (host, device) locations so shared-index skip layers can replay
        // this exact copy without re-planning (device/host locs are layer-independent).
        if (miss_src_out != nullptr && lane_id == 0) {
            miss_src_out[bid * plan_stride + miss_idx] = src_loc;
            miss_dst_out[bid * plan_stride + miss_idx] = dst_loc;
        }

        // Generic path: device + host both linear, stride = item_size_bytes (MLA: K only).
        const char* src_k = static_cast<const char*>(host_cache_k) + src_loc * item_size_bytes;
        char* dst_k = static_cast<char*>(device_buffer_k) + dst_loc * item_size_bytes;
        transfer_item_warp(lane_id, src_k, dst_k, item_size_bytes);
    }
}

}  // namespace

// Entry points: sglang_hisparse_k<TOP_K>_h<HOT>[_nocopy], 960 threads per block (SGLang's coordinator),
// grid = batch, dynamic shared memory = sglang_hisparse_smem_bytes(TOP_K, HOT).
#define SGLANG_HISPARSE_ENTRY(TOPK, HOT, SKIP, NAME)                                                              \
    extern "C" __global__ void NAME(                                                                             \
        const sg_i32* top_k_tokens, sg_i32* device_buffer_tokens, const sg_i64* host_cache_locs,                 \
        const sg_i32* device_buffer_locs, const void* host_cache_k, void* device_buffer_k,                       \
        sg_i32* top_k_device_locs, const sg_i32* req_pool_indices, const sg_i32* seq_lens, sg_i16* lru_slots,    \
        const sg_i32* num_real_reqs, sg_i64 buffer_stride_0, sg_i64 host_stride, sg_i64 lru_slot_stride_0,       \
        sg_i64 top_k_tokens_stride, sg_i64 top_k_device_locs_stride, sg_i64 page_size, sg_i64 item_size_bytes) { \
        load_cache_to_device_buffer_kernel<960, TOPK, HOT, SKIP>(                                                \
            top_k_tokens, device_buffer_tokens, host_cache_locs, device_buffer_locs, host_cache_k,               \
            device_buffer_k, top_k_device_locs, req_pool_indices, seq_lens, lru_slots, num_real_reqs,            \
            buffer_stride_0, host_stride, lru_slot_stride_0, top_k_tokens_stride, top_k_device_locs_stride,      \
            page_size, item_size_bytes, nullptr, nullptr, nullptr, 0);                                           \
    }

SGLANG_HISPARSE_ENTRY(2048, 2048, false, sglang_hisparse_k2048_h2048)
SGLANG_HISPARSE_ENTRY(2048, 2048, true, sglang_hisparse_k2048_h2048_nocopy)
SGLANG_HISPARSE_ENTRY(2048, 4096, false, sglang_hisparse_k2048_h4096)
SGLANG_HISPARSE_ENTRY(2048, 4096, true, sglang_hisparse_k2048_h4096_nocopy)
SGLANG_HISPARSE_ENTRY(2048, 8192, false, sglang_hisparse_k2048_h8192)
SGLANG_HISPARSE_ENTRY(2048, 8192, true, sglang_hisparse_k2048_h8192_nocopy)
