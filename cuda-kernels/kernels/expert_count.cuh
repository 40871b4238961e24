// tierkit: expert pick counting, fused path (paste or #include into your own router kernel).
//
// Which call to use. Added GPU time per 40-layer step, measured on the H200 with stand-in routers
// (one warp per token, 40 layers x 256 tokens x top-6 of 64, CUDA graphs; benches/README.md,
// "Fused header path" and "Forked count"; "gate" = a router that also writes the top-k softmax
// weights):
//   CHEAPEST, where the layers' topk_ids are kept in one [layers, tokens, k] step buffer: only the
//     LAST layer's router calls tierkit_count_pick_striped at its end; the host forks the count
//     of the earlier layers onto a branch stream right before that router
//     (PickCounterGpu::count_forked, joined at the step's end with join_forked)   0.18-0.45 us
//     Without the Rust API: two events and a second stream: record event A on the step stream,
//     the branch stream waits on A, launch tierkit_count_i32/_i64 (count.cu) over layers
//     0 ..= layers-2 (all but the last) on the branch, record event B on the branch, the step stream waits on B at
//     the step's end (all capturable; keep the ids unwritten until then).
//   tierkit_count_pick_striped at every router's end, a stripe per warp (RECOMMENDED without a
//     step buffer)
//                                                                    4.5-5.3 us (router and gate)
//   step form: tierkit_step_picks_* in the last layer's router only, + its own picks striped
//     (needs every layer's topk_ids kept in one [layers, tokens, k] buffer)
//                                                                    2.2-3.9 us gate, 4.2-5.8 us router
//   tierkit_count_pick inside the top-k loop, into the table        9.8-11.4 us
//   tierkit_count_prev_layer (previous-layer path)                   9.6-13.2 us
//   tierkit_count_pick_striped at the end into the table itself     16-23.5 us
//   (for scale: one more plain 4-byte store per pick at the end      1.9-2.5 us)
// The striped forms need PickCounterGpu::with_stripes; its drain folds the stripes into the table.
//
// Table layout (the `expert-residency` PickCounters layout): u32 [layers][experts], row-major,
// cumulative (wraps at 2^32; the host takes wrap-safe deltas between drains).
// `err` is one u32 that counts rejected picks (layer >= layers, expert < 0 or expert >= experts):
// a bad id is never written out of bounds, it is counted here and the host reads it at the drain.
// Atomics are relaxed (plain atomicAdd whose result is unused: a fire-and-forget reduction); the
// counts are only read after a stream-ordered drain.
#pragma once

// ---------------------------------------------------------------------------------------------
// Counting controls: the counter's control block, u32 ctl[TIERKIT_CTL_WORDS] in device memory at
// a fixed address (PickCounterGpu::control_ptr). Read at run time by every controlled call, so a
// captured CUDA graph sees whatever was written before each replay (PickCounterGpu::
// set_enabled_async / set_valid_tokens_async on the stream, or the engine's own write, e.g. a
// torch copy_ into the block).
//   ctl[TIERKIT_CTL_ENABLED]      0: count nothing (warm-up, profiling, draft passes); else count.
//   ctl[TIERKIT_CTL_VALID_TOKENS] token rows t >= this value are padding or dummy rows: skipped in
//                                 every layer (0xFFFFFFFF, the default: every row counts).
//   ctl[2], ctl[3]                reserved, 0.
// A skipped pick is neither counted nor rejected. After vLLM's EPLB recorder (a fused record
// gated by a device flag, over the unpadded tokens) and TensorRT-LLM's MoE load balancer (its
// statistics skip warm-up iterations).
#define TIERKIT_CTL_WORDS 4u
#define TIERKIT_CTL_ENABLED 0u
#define TIERKIT_CTL_VALID_TOKENS 1u

// Whether the picks of token row `token` are counted under `ctl` (ctl == nullptr: always). Hoist
// it: call it once per token (or per warp) and skip the count calls when false.
__device__ __forceinline__ bool tierkit_count_token_counted(const unsigned int* ctl, unsigned int token) {
    return ctl == nullptr || (ctl[TIERKIT_CTL_ENABLED] != 0u && token < ctl[TIERKIT_CTL_VALID_TOKENS]);
}

// One pick added to the table directly: one bounds check and one relaxed add, branch-free. Every
// warp of a layer adds to the same few cache lines, so the adds queue: prefer
// tierkit_count_pick_striped (about half the cost inside the top-k loop, a quarter at the end).
__device__ __forceinline__ void tierkit_count_pick(unsigned int* table, unsigned int* err,
                                                   unsigned int layer, unsigned int layers,
                                                   long long expert, unsigned int experts) {
    const bool ok = layer < layers && (unsigned long long)expert < (unsigned long long)experts;
    // branch-free: one select, one add
    unsigned int* p = ok ? table + ((unsigned long long)layer * experts + (unsigned int)expert) : err;
    atomicAdd(p, 1u);
}

// Warp-aggregated variant: lanes of a warp that pick the same (layer, expert) add once, so a hot
// expert does not queue a whole warp's adds on one address. Costs a __match_any_sync; use it
// where many lanes of a warp count the same expert (the standalone kernel does).
__device__ __forceinline__ void tierkit_count_pick_aggregated(unsigned int* table, unsigned int* err,
                                                              unsigned int layer, unsigned int layers,
                                                              long long expert, unsigned int experts) {
    const bool ok = layer < layers && (unsigned long long)expert < (unsigned long long)experts;
    const unsigned int key = ok ? layer * experts + (unsigned int)expert : 0xFFFFFFFFu;
    const unsigned int active = __activemask();
    const unsigned int peers = __match_any_sync(active, key);
    const unsigned int lane = threadIdx.x & 31u;
    const unsigned int leader = __ffs(peers) - 1u;
    if (lane == leader) {
        const unsigned int n = __popc(peers);
        if (ok) {
            atomicAdd(table + key, n);
        } else {
            atomicAdd(err, n);
        }
    }
}

// Fire-and-forget form of the add: `red.relaxed.gpu.global.add.u32` (no returned value, so no
// register waits on it). Same table semantics as tierkit_count_pick. Measured on the H200 (first
// session): into the table inside the top-k loop it was slower than atomicAdd (13.2 vs 9.4 us per
// 40-layer step), in tierkit_count_prev_layer 0.7-1 us faster. tierkit_count_pick_striped uses it
// (an atomicAdd form of the striped call was not measured).
__device__ __forceinline__ void tierkit_red_add_u32(unsigned int* p, unsigned int v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
    // no "memory" clobber: a relaxed add with no result orders nothing, and the clobber would
    // stop the compiler from moving the kernel's own loads across it
    asm volatile("red.relaxed.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(v));
#else
    atomicAdd(p, v);
#endif
}

// As tierkit_count_pick, issued as a `red` (fire-and-forget) reduction.
__device__ __forceinline__ void tierkit_count_pick_red(unsigned int* table, unsigned int* err,
                                                       unsigned int layer, unsigned int layers,
                                                       long long expert, unsigned int experts) {
    const bool ok = layer < layers && (unsigned long long)expert < (unsigned long long)experts;
    unsigned int* p = ok ? table + ((unsigned long long)layer * experts + (unsigned int)expert) : err;
    tierkit_red_add_u32(p, 1u);
}

// Previous-layer counting: layer l's router kernel counts layer l-1's picks at its START, reading
// the topk_ids that layer l-1's router already wrote (stream order makes them visible), so the
// adds overlap the whole kernel instead of holding its tail. Call it right AFTER the kernel issues
// its first loads (the logits), not before them: the add waits for the prev_ids load, and placed
// first it puts that load's latency in front of the logits loads. prev_layer = l - 1 for l >= 1
// (skip it in layer 0), and count the LAST layer's own picks in its own kernel
// (tierkit_count_pick_red as each pick is known): after every step the table then holds that
// step's exact counts. prev_ids: [picks_per_layer] (int32 or int64) of layer prev_layer; the
// calling thread counts pick `pick` (picks >= picks_per_layer do nothing). If the router reuses
// one ids buffer for every layer, each pick must be read here by the same thread that later
// overwrites it (e.g. warp `token`, lane j < k counts pick token * k + j), so no read races a write.
// Superseded by the striped forms: measured on the H200 at 9.6-13.2 us added per 40-layer step
// with one kernel per form (6.5-7.4 us in the first session's switch kernel, whose baseline was
// slower; benches/README.md, "Fused header path").
template <typename T>
__device__ __forceinline__ void tierkit_count_prev_layer(unsigned int* table, unsigned int* err,
                                                         const T* prev_ids, unsigned int pick,
                                                         unsigned int picks_per_layer,
                                                         unsigned int prev_layer, unsigned int layers,
                                                         unsigned int experts) {
    if (pick < picks_per_layer)
        tierkit_count_pick_red(table, err, prev_layer, layers, (long long)prev_ids[pick], experts);
}


// ---------------------------------------------------------------------------------------------
// Striped counting: the RECOMMENDED fused path.
//
// Adds one pick to a stripe: a copy of the table, u32 `stripes` [layers][num_stripes][experts]
// (PickCounterGpu::with_stripes allocates it and hands out its pointer). The drain folds the
// stripes into the table (PickCounterGpu::drain_async launches tierkit_fold_stripes on the step
// stream before its copy: table += sum of stripes, stripes zeroed), so after every drain the table
// holds exactly the same counts as the unstriped forms. Give each router warp its own stripe
// (stripe = the warp's index in the launch, e.g. (blockIdx.x * blockDim.x + threadIdx.x) >> 5
// for 1-D blocks): then no two warps add to one address, and the adds of a layer do not queue on
// the table's few cache lines. Sharing a stripe is still exact (the add is atomic), only slower.
// A stripe index >= num_stripes (including num_stripes = 0) adds to the table itself: exact, but
// that is the slowest form (see the table above). So size num_stripes to the warps of the batches
// that matter (decode), or, for launches with more warps than stripes (large prefill batches),
// pass warp & (num_stripes - 1) with a power-of-two num_stripes, so the warps share stripes
// instead of the table. Memory and the drain's fold grow with num_stripes (layers x num_stripes x
// experts x 4 bytes). Rejected picks (layer >= layers, expert < 0 or >= experts) are added to
// `err`, never written to the table or a stripe. Padding rows of a graph-captured batch are
// counted like real ones: do not call it for them, or call tierkit_count_pick_striped_ctl (below).
// Where: at the END of the router kernel, from every lane that holds a pick (for example right
// after the kernel stores topk_ids), each lane once per pick. Measured on the H200 (stand-in
// router, 40 layers x 256 tokens x top-6 of 64, CUDA graph): benches/README.md, "Fused header
// path": the end is cheaper than inside the top-k loop, and stripes are cheaper than the table.
// Idea: privatised sub-histograms merged later (Podlozhnyuk, "Histogram calculation in CUDA",
// NVIDIA 2007), here one per warp, merged at the drain.
__device__ __forceinline__ void tierkit_count_pick_striped(unsigned int* stripes, unsigned int num_stripes,
                                                           unsigned int stripe, unsigned int* table,
                                                           unsigned int* err, unsigned int layer,
                                                           unsigned int layers, long long expert,
                                                           unsigned int experts) {
    const bool ok = layer < layers && (unsigned long long)expert < (unsigned long long)experts;
    const unsigned int e = (unsigned int)expert;
    unsigned int* p = !ok                   ? err
                      : stripe < num_stripes ? stripes + ((unsigned long long)layer * num_stripes + stripe) * experts + e
                                             : table + (unsigned long long)layer * experts + e;
    tierkit_red_add_u32(p, 1u);
}

// tierkit_count_pick_striped under the control block: counts the pick of token row `token` only
// if tierkit_count_token_counted(ctl, token) (two cached loads per call; with several picks per
// lane, hoist tierkit_count_token_counted instead). The recommended fused call for graph-captured
// batches with padding rows: pass PickCounterGpu::control_ptr() as `ctl`.
__device__ __forceinline__ void tierkit_count_pick_striped_ctl(const unsigned int* ctl, unsigned int token,
                                                               unsigned int* stripes, unsigned int num_stripes,
                                                               unsigned int stripe, unsigned int* table,
                                                               unsigned int* err, unsigned int layer,
                                                               unsigned int layers, long long expert,
                                                               unsigned int experts) {
    if (tierkit_count_token_counted(ctl, token))
        tierkit_count_pick_striped(stripes, num_stripes, stripe, table, err, layer, layers, expert, experts);
}

// ---------------------------------------------------------------------------------------------
// Step form: one router kernel (the LAST MoE layer's) counts the whole step, from the step's ids.
//
// Where the router writes each layer's topk_ids into its own slice of one step buffer
// `step_ids`, packed [layers, tokens, k] (layer l's picks at l * tokens * k, tokens = this
// batch's rows: a buffer sized for the largest batch must still be written packed), the layers
// before the last need no counting code at all: the last layer's router loads the picks of
// layers [0, layers_before) right after its own first loads (tierkit_step_picks_load), adds them
// to the stripes (tierkit_step_picks_count, after the loads) while its own top-k runs, and counts
// its own picks at its end with tierkit_count_pick_striped. Work split: `threads` threads of the
// launch call both functions, once each, with `thread` taking every value 0 .. threads - 1
// exactly once (threads that return early must not be counted in `threads`); thread t takes
// picks t, t + threads, ... (n = layers_before * tokens * k picks in all, picks_per_layer =
// tokens * k). threads == 0 or picks_per_layer == 0 counts nothing. PER_THREAD should be >=
// ceil(n / threads): picks beyond PER_THREAD * threads are counted by a slower loop (still
// exact). Stripe: as in tierkit_count_pick_striped (the warp's index). Measured on the H200:
// 2.2-3.9 us per 40-layer step on a router that also writes top-k weights, 4.2-5.8 us on an
// ids-only router (benches/README.md). Controls: the step form has no controlled variant. Guard
// both calls with `if (ctl[TIERKIT_CTL_ENABLED] != 0u)` for the enable flag; its padding rows are
// counted, so where a captured batch has padding prefer the forked count, whose kernel applies
// the whole control block.
template <typename T, unsigned int PER_THREAD>
struct TierkitStepPicks {
    T id[PER_THREAD];
};

template <typename T, unsigned int PER_THREAD>
__device__ __forceinline__ void tierkit_step_picks_load(TierkitStepPicks<T, PER_THREAD>& p, const T* step_ids,
                                                        unsigned int n, unsigned int thread, unsigned int threads) {
#pragma unroll
    for (unsigned int m = 0; m < PER_THREAD; ++m) {
        const unsigned long long i = thread + (unsigned long long)m * threads;
        p.id[m] = i < n ? step_ids[i] : (T)0;
    }
}

template <typename T, unsigned int PER_THREAD>
__device__ __forceinline__ void tierkit_step_picks_count(const TierkitStepPicks<T, PER_THREAD>& p, const T* step_ids,
                                                         unsigned int n, unsigned int picks_per_layer,
                                                         unsigned int thread, unsigned int threads,
                                                         unsigned int* stripes, unsigned int num_stripes,
                                                         unsigned int stripe, unsigned int* table, unsigned int* err,
                                                         unsigned int layers, unsigned int experts) {
    if (threads == 0u || picks_per_layer == 0u) return;
#pragma unroll
    for (unsigned int m = 0; m < PER_THREAD; ++m) {
        const unsigned long long i = thread + (unsigned long long)m * threads;
        if (i < n)  // i < n <= 2^32 - 1: 32-bit division
            tierkit_count_pick_striped(stripes, num_stripes, stripe, table, err, (unsigned int)i / picks_per_layer,
                                       layers, (long long)p.id[m], experts);
    }
    for (unsigned long long i = thread + (unsigned long long)PER_THREAD * threads; i < n; i += threads)
        tierkit_count_pick_striped(stripes, num_stripes, stripe, table, err, (unsigned int)i / picks_per_layer,
                                   layers, (long long)step_ids[i], experts);
}

