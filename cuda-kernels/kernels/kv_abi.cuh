// tierkit: the KV kernels' ABI, shared by the production kernels (kv_resolve.cu) and the host
// (cuda-kernels/src/kv): every struct the host passes by value or through a buffer, the error
// words, the stats row, the output layouts and the limits the host sizes launches by. One test
// (cuda-kernels/src/kv/abi.rs) checks each #define against its Rust constant and each struct,
// field by field (name, offset), against its Rust `repr(C)` mirror: change both together.

// Table sentinels.
#define KV_NONE (-1)             // pos_slot / slot_pos / page_tab: nothing there
#define KV_UNCLAIMED 0x7fffffff  // first[]: no pick of the current call claimed the position

// Error words (err[i], u32, cumulative until the host clears them): KV_ERR_WORDS of them.
#define KV_ERR_WORDS 8
#define KV_ERR_BAD_SESSION 0   // session slot out of range / not live / named twice, or seq_len out of range
#define KV_ERR_BAD_POSITION 1  // pick < -1 or >= its row's bound (written as -1)
#define KV_ERR_OVERFLOW 2      // distinct misses without an evictable hot row (written -1; served as far as rows last)
#define KV_ERR_BAD_QSL 3       // query_start_loc malformed (every row written as -1)
#define KV_ERR_STALE_PLAN 4    // replay check: destination row no longer holds the position; fetch: entry out of range

// The stats row of one entry (stats[entry][KV_STATS], u32).
#define KV_STATS 8
#define KV_STAT_PICKS 0    // valid outputs
#define KV_STAT_TAIL 1     // served by the tail
#define KV_STAT_SCRATCH 2  // served by the draft scratch
#define KV_STAT_PAGE 3     // served by borrowed pages
#define KV_STAT_HOT 4      // served by the hot cache (this call's installs included)
#define KV_STAT_MISSES 5   // distinct positions fetched (placed)
#define KV_STAT_DIRECT 6   // 1 when the whole history is resident (direct path, nothing missed)
#define KV_STAT_INVALID 7  // picks < -1 or at or beyond their bound

// Output layouts (KvCall::layout).
#define KV_LAYOUT_IN_PLACE 0  // each row in its pick's column, -1 where invalid or unserved
#define KV_LAYOUT_PACKED 1    // valid entries packed to the front (FlashMLA's topk_length)

// Replay modes (tierkit_kv_replay's `check`).
#define KV_REPLAY_COPY 0   // copy every entry (page fills: the caller owns the rows)
#define KV_REPLAY_CHECK 1  // copy nothing, count entries whose row no longer holds the position
#define KV_REPLAY_FRESH 2  // copy only entries the tables still map to their rows, count the others

// Limits the host sizes launches by.
#define KV_LEAN_BLOCK 1024          // threads of tierkit_kv_resolve_lean (the prefetch's launch bound)
#define KV_LEAN512_BLOCK 512        // threads of tierkit_kv_resolve_lean512
#define KV_CLASSIC_BLOCK 512        // threads of tierkit_kv_resolve (tables over the lean limits)
#define KV_FAST_PER 4               // picks one lean thread holds in registers
#define KV_FAST_MAX_ROWS 64         // query rows of one entry the lean path takes
#define KV_LEAN_VICTIM_MAX 8192u    // hot rows up to which the lean kernels keep a rank -> victim table
#define KV_LEAN_MAX_HOT_ROWS 65536u // lean kernels: hot rows at most (candidate bitmaps in shared memory)
#define KV_LEAN_MAX_FIXED_PAGES 4096u  // lean kernels: fixed pages per slot at most (shared memory)

// Row formats (KvDims::fmt): where a row's bytes lie in its arena page (kv_row_segs).
#define KV_FMT_CONTIGUOUS 0   // one segment: row r of a plane at r x row_bytes (value_bytes = row_bytes, scale_bytes = 0)
#define KV_FMT_PAGED_SPLIT 1  // DeepSeek-V4: a page's values, then its scales, padded to fmt_page_bytes

// Extents of the device tables (all counts; row_bytes, value_bytes, scale_bytes and fmt_page_bytes
// in bytes). A host row is value ‖ scale (row_bytes = value_bytes + scale_bytes); an arena plane is
// (arena_rows / page_rows) pages of fmt_page_bytes (page_rows x row_bytes for KV_FMT_CONTIGUOUS).
struct KvDims {
    unsigned int row_bytes, layers, page_rows, hot_rows;
    unsigned int tail_rows, scratch_rows, fixed_pages, max_slots;
    unsigned int max_history, max_pages, arena_rows, fmt;
    unsigned int value_bytes, scale_bytes;
    unsigned long long fmt_page_bytes;
};

// A divisor with its multiplier and shift (cuda-kernels/src/kv/fastdiv.rs computes them per
// launch; Granlund and Montgomery's 33-bit multiplier 2^32 + mul): x / d == (umulhi(x, mul) + x) >> shr
// for 0 <= x < 2^31 (the sum cannot overflow there), d == 1 included (mul = 1, shr = 0).
struct KvDiv {
    unsigned int d, mul, shr, pad;
};
struct KvDivs {
    KvDiv page, tail, k;  // page_rows, tail_rows, the call's output row width (KvCall::k)
    KvDiv blk;            // positions per block id (KvCall::block; 1 for position picks)
    // The lean engines' launch-time batch shape (cuda-kernels/src/kv/fastdiv.rs): m = query rows
    // per entry of a uniform batch (rows = m x sessions, 1 <= m <= KV_FAST_MAX_ROWS, m x k <=
    // KV_FAST_PER x blockDim), 0 when the batch is not uniform; gper = picks per thread of such an
    // entry (min(KV_FAST_PER, ceil(m x k / blockDim))); fp_max = the largest fixed page whose last
    // row fits an int ((2^31 - 1 - (page_rows - 1)) / page_rows).
    unsigned int m, gper, fp_max, pad;
};

// One session slot's placement as the host last published it.
struct KvSlotDesc {
    unsigned int live, committed, scratch_len, full;
    unsigned int tail_start, pad[3];
};

// Device addresses of every table. The hot-cache tables (pos_slot, slot_pos, mark, stamp, hand,
// call) are one layer group's: kv-elastic passes the group's tables of the layer it resolves.
struct KvTables {
    const KvSlotDesc* desc;
    const int* fixed_pages;
    const int* page_tab;
    int* pos_slot;
    int* slot_pos;
    unsigned long long* mark;
    unsigned long long* stamp;
    unsigned int* hand;
    int* first;
    unsigned long long* call;  // [max_slots]: each slot's last accepted resolve call (starts at 1)
    unsigned char* arena;
    unsigned char* host;
    unsigned int* err;
    // Null, or a u32 the owner of the tables sets to 1 only while every live slot's descriptor has
    // full = 1 (kv-elastic's pool, at publish): the resolve then reads no position table and takes
    // no hot-cache path (a slot that is not full after all gets -1 for its hot-cache picks, never a
    // wrong row).
    const unsigned int* direct;
};

// One row copy of a plan: (slot, position) of the host store <-> arena row dst_row.
struct KvCopy {
    unsigned int slot, position, dst_row, pad;
};

// A table patch: `count` u32 words at device address `dst` set to `value`.
struct KvFill {
    unsigned long long dst;
    unsigned int count, value;
};

// One fused resolve call (by value; the buffers are the caller's). Shapes: topk int32 [rows, topk_k]
// (positions, or block ids when block > 1: id b stands for positions b x block .. b x block + block,
// read block-major, so k = topk_k x block; block = 1 and topk_k = k for position picks),
// query_start_loc int32 [sessions + 1], seq_lens / session_slot int32 [sessions], indices int32
// [idx_len >= rows * k] (row stride k), valid_count int32 [valid_len >= rows], plan KvCopy
// [sessions][hot_rows] with plan_count u32 [pc_len >= sessions], stats u32 [sessions][KV_STATS],
// qseq int32 [rows] or null (per-query causal bounds). fetch = n > 0: gather the misses into layers
// [layer, layer + n) now; 0: leave the copies to the caller (DMA). With block ids, a block's position
// at or beyond its row's bound is -1 and not invalid (the block straddles the end); an id < -1 is
// invalid, counted once per position it stands for.
struct KvCall {
    const int* topk;
    const int* qsl;
    const int* seq_lens;
    const int* session_slot;
    int* indices;
    int* valid_count;
    KvCopy* plan;
    unsigned int* plan_count;
    unsigned int* stats;
    const int* qseq;
    unsigned long long idx_len, valid_len, pc_len;
    unsigned int sessions, rows, k, layer;
    unsigned int fetch, layout, block, topk_k;
};
