// Entry points: SGLang's launch (grid = batch, SGLANG_BLOCK threads, SmemLayout<...>::BYTES of
// dynamic shared memory), the MLA variant (K only) on the generic linear layout, int64 seq_lens and
// request pool indices (the dtypes SGLang's scheduler hands the coordinator), no miss plan; token top-k (SGLANG_ENTRY: K positions per row) or block ids
// (SGLANG_BLOCK_ENTRY: K ids of BS positions each, TopKIsBlocks with SPARSE_BLOCK_SIZE = BS, K x BS
// output columns). `_nocopy`: SkipIO (the peer's own timing probe: everything but the byte movement).
#define SGLANG_BLOCK 960
#define SGLANG_ENTRY_OF(NAME, K, HOT, BS, BLOCKS, SKIP)                                                    \
    extern "C" __global__ void __launch_bounds__(SGLANG_BLOCK, 1)                                         \
        NAME(const int32_t* top_k, int32_t* device_buffer_tokens, const int64_t* host_cache_locs,          \
             const int32_t* device_buffer_locs, const void* host_cache_k, void* device_buffer_k,           \
             int32_t* top_k_device_locs, const int64_t* req_pool_indices, const int64_t* seq_lens,         \
             int16_t* lru_slots, const int32_t* num_real_reqs, int64_t buffer_stride_0,                    \
             int64_t host_stride, int64_t lru_slot_stride_0, int64_t top_k_stride,                         \
             int64_t top_k_device_locs_stride, int64_t page_size, int64_t item_size_bytes) {               \
        sglang::load_cache_to_device_buffer_kernel<SGLANG_BLOCK, K, HOT, true, false, BS, BLOCKS, false, SKIP, \
                                                   int64_t, int64_t>(                                      \
            top_k, device_buffer_tokens, host_cache_locs, device_buffer_locs, host_cache_k, nullptr,        \
            device_buffer_k, nullptr, top_k_device_locs, req_pool_indices, seq_lens, lru_slots,             \
            num_real_reqs, buffer_stride_0, host_stride, lru_slot_stride_0, top_k_stride,                  \
            top_k_device_locs_stride, page_size, item_size_bytes, nullptr, nullptr, nullptr, 0);            \
    }                                                                                                      \
    extern "C" __global__ void NAME##_smem(int32_t* out) {                                                 \
        *out = (int32_t)sglang::SmemLayout<(BLOCKS) ? (K) * (BS) : (K), HOT>::BYTES;                       \
    }
#define SGLANG_ENTRY(NAME, K, HOT, SKIP) SGLANG_ENTRY_OF(NAME, K, HOT, 1, false, SKIP)
#define SGLANG_BLOCK_ENTRY(NAME, K, BS, HOT, SKIP) SGLANG_ENTRY_OF(NAME, K, HOT, BS, true, SKIP)

SGLANG_ENTRY(sglang_hisparse_k2048_h2048, 2048, 2048, false)
SGLANG_ENTRY(sglang_hisparse_k2048_h2048_nocopy, 2048, 2048, true)
SGLANG_ENTRY(sglang_hisparse_k2048_h4096, 2048, 4096, false)
SGLANG_ENTRY(sglang_hisparse_k2048_h4096_nocopy, 2048, 4096, true)
SGLANG_ENTRY(sglang_hisparse_k2048_h8192, 2048, 8192, false)
SGLANG_ENTRY(sglang_hisparse_k2048_h8192_nocopy, 2048, 8192, true)
// Block ids: 32 ids of 64 positions (2048 output columns, as the token entries).
SGLANG_BLOCK_ENTRY(sglang_hisparse_b64x32_h2048, 32, 64, 2048, false)
SGLANG_BLOCK_ENTRY(sglang_hisparse_b64x32_h2048_nocopy, 32, 64, 2048, true)
SGLANG_BLOCK_ENTRY(sglang_hisparse_b64x32_h4096, 32, 64, 4096, false)
SGLANG_BLOCK_ENTRY(sglang_hisparse_b64x32_h4096_nocopy, 32, 64, 4096, true)
