//! The KV tier's C API: pool sizing, the elastic pool's session lifecycle, the CPU resolver.
//!
//! A resolve hands back a *read id* instead of a plan and a ticket object: the pool keeps the
//! plan (for `tierkit_kv_pool_replay`, a re-copy into one layer of its layer group) and the reader registration
//! until `tierkit_kv_pool_end_read`, so no per-step handle is allocated and a read id used after
//! its end is an error, never a dangling pointer.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Mutex;

use kv_elastic::{
    Admission, ElasticPool, OutputLayout, PoolConfig, ReadTicket, ResolveInput, ResolveOptions,
    ResolveOutput, ResolvePlan, Resolver,
};
use tierkit_bindings::{strided_len, Code};

use crate::ffi::{
    call, disjoint, fail, free_handle, live, lock, new_handle, out, out_opt, view, view_mut,
    writable, writable_opt, Kind, Object, TierkitCode, TierkitError, R,
};
use crate::kv_geometry::TierkitKvGeometry;

/// `tierkit_kv_batch::flags`: write each row's valid entries packed to the front (FlashMLA's
/// `topk_length` layout); without it each entry stays in its pick's column.
pub const TIERKIT_KV_PACKED: u32 = 1;

/// Most positions per block id (`tierkit_kv_batch::block_positions`), 2^16 (kv-elastic's
/// `MAX_BLOCK_POSITIONS`: block-sparse indexers use blocks of 64 to 4,096 positions).
pub const TIERKIT_KV_MAX_BLOCK_POSITIONS: u32 = 1 << 16;

/// Most reads a pool keeps open at once (resolves not yet ended by `tierkit_kv_pool_end_read`).
pub const TIERKIT_KV_MAX_OPEN_READS: usize = 4096;

/// One decode step's selections (vLLM's batch description, FlashMLA's `int32 [rows, k]` top-k).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct TierkitKvBatch {
    /// Session of each batch entry, `[reqs]` (each at most once).
    pub sessions: *const u64,
    /// Batch entries.
    pub reqs: usize,
    /// Query rows of each entry, `int32 [reqs + 1]`, from 0 to `rows`.
    pub query_start_loc: *const i32,
    /// Positions visible to each entry, `int32 [reqs]`.
    pub seq_lens: *const i32,
    /// The indexer's top-k positions, `int32 [rows, k]`, `-1` = padding; row `r` starts at
    /// element `r * topk_row_stride`. Block ids with `block_positions > 1`.
    pub topk: *const i32,
    /// Query rows (`query_start_loc[reqs]`).
    pub rows: usize,
    /// Picks per row.
    pub k: usize,
    /// Elements between rows of `topk` (`>= k`; `k` for a contiguous array).
    pub topk_row_stride: usize,
    /// Optional per-query causal bounds, `int32 [rows]`, or NULL.
    pub query_seq_lens: *const i32,
    /// The layer whose plane the misses are copied into.
    pub layer: u32,
    /// `TIERKIT_KV_PACKED` or 0.
    pub flags: u32,
    /// Positions per top-k entry: 0 or 1 for positions (a zero-initialized field); `B > 1`
    /// when `topk` holds *block ids* (MiniMax-M3's block top-k): id `b` stands for positions `b
    /// * B .. b * B + B`, read block-major, so the outputs have `k * B` columns (`indices` at
    /// least `rows * k * B` entries); a block's positions at or beyond the row's bound come out
    /// `-1` (not an error), an id below `-1` is `TIERKIT_ERR_INVALID_ARGUMENT`. At most
    /// `TIERKIT_KV_MAX_BLOCK_POSITIONS`: a larger `B` is `TIERKIT_ERR_INVALID_ARGUMENT`, its
    /// message naming `block_positions` and the range.
    pub block_positions: u32,
}

/// What one resolve found (per pick unless said otherwise).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct TierkitKvStats {
    /// Valid (non `-1`) picks.
    pub picks: u64,
    /// Picks served by the tail.
    pub tail_hits: u64,
    /// Picks served by the scratch (drafts).
    pub scratch_hits: u64,
    /// Picks served by borrowed elastic pages.
    pub page_hits: u64,
    /// Picks served by the hot cache.
    pub hot_hits: u64,
    /// Distinct positions fetched from host memory.
    pub misses: u64,
    /// Sessions on the direct path (whole history resident).
    pub direct_sessions: u64,
    /// Valid picks written `-1` because the hot cache could not hold them this step.
    pub unserved: u64,
    /// Copies in the read's plan (what `tierkit_kv_pool_replay` applies to another layer).
    pub plan_copies: u64,
}

/// The outcome of an admission.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct TierkitKvAdmission {
    /// Whether the session was admitted. If not, pages wait behind reads still open: end them,
    /// call `tierkit_kv_pool_between_steps`, and admit again.
    pub admitted: bool,
    /// Elastic pages borrowed at admission (admitted).
    pub borrowed_pages: u32,
    /// Pages waiting behind reader fences (not admitted).
    pub pending: u32,
}

impl From<Admission> for TierkitKvAdmission {
    fn from(a: Admission) -> Self {
        match a {
            Admission::Admitted { borrowed_pages } => TierkitKvAdmission {
                admitted: true,
                borrowed_pages,
                pending: 0,
            },
            Admission::Waiting { pending } => TierkitKvAdmission {
                admitted: false,
                borrowed_pages: 0,
                pending,
            },
        }
    }
}

/// What `tierkit_kv_pool_between_steps` did.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct TierkitKvMaintenance {
    /// Pages of finished sessions handed back.
    pub handed_back: u32,
    /// Pending pages freed now that their readers completed.
    pub collected: u32,
    /// Pages lent to sessions missing history.
    pub grown: u32,
}

#[derive(Debug)]
struct OpenRead {
    plan: ResolvePlan,
    /// Ended (the pages may be reused) when dropped.
    _ticket: ReadTicket,
}

#[derive(Debug)]
pub(crate) struct PoolState {
    pub(crate) pool: ElasticPool,
    reads: HashMap<u64, OpenRead>,
    next_read: u64,
}

/// The elastic KV pool (CPU arena). Free with `tierkit_kv_pool_free` (which ends its open reads).
#[derive(Debug)]
pub struct TierkitKvPool(Mutex<PoolState>);

impl TierkitKvPool {
    /// A handle's value for `pool` (no read open).
    pub(crate) fn wrap(pool: ElasticPool) -> Self {
        TierkitKvPool(Mutex::new(PoolState {
            pool,
            reads: HashMap::new(),
            next_read: 1,
        }))
    }
}

impl Object for TierkitKvPool {
    const KIND: Kind = Kind::Pool;
    const NAME: &'static str = "tierkit_kv_pool";
}

/// A new pool of `geometry` (its layer groups included, see `tierkit_kv_geometry`); `elastic`
/// lends free HBM as history pages (Adaptive HiSparse), false keeps the fixed hot cache only
/// (HiSparse).
///
/// # Safety
/// `geometry` points to a readable geometry (and, when its `group_count > 0`, its `group_sizes`
/// to `group_count` readable `uint32_t`); `out_pool` valid for a pointer write; `err` NULL or
/// valid for a write.
#[no_mangle]
pub unsafe extern "C" fn tierkit_kv_pool_new(
    geometry: *const TierkitKvGeometry,
    elastic: bool,
    out_pool: *mut *mut TierkitKvPool,
    err: *mut *mut TierkitError,
) -> TierkitCode {
    // SAFETY: forwarded contracts.
    unsafe {
        call(err, || {
            writable(out_pool, "out_pool")?;
            let g = view(geometry, 1, "geometry")?[0].read_geometry()?;
            let pool = ElasticPool::new(g, PoolConfig { elastic })?;
            out(out_pool, new_handle(TierkitKvPool::wrap(pool)), "out_pool")
        })
    }
}

/// Runs `f` on the locked pool state.
///
/// # Safety
/// `pool` is NULL or a pool handle.
pub(crate) unsafe fn with_pool<T>(
    pool: *const TierkitKvPool,
    f: impl FnOnce(&mut PoolState) -> R<T>,
) -> R<T> {
    let live = live();
    let mut state = lock(&live.get(pool, "pool")?.0, "pool")?;
    f(&mut state)
}

/// Admits a session with its committed history (`len` bytes: whole tokens of
/// `layers * row_bytes` bytes, layer-major per token). `admission` may be NULL.
///
/// # Safety
/// `pool` is NULL or a pool handle; `history` points to `len` readable bytes; `admission` NULL or
/// valid for a write; `err` NULL or valid for a pointer write.
#[no_mangle]
pub unsafe extern "C" fn tierkit_kv_pool_admit(
    pool: *const TierkitKvPool,
    session: u64,
    history: *const u8,
    len: usize,
    admission: *mut TierkitKvAdmission,
    err: *mut *mut TierkitError,
) -> TierkitCode {
    // SAFETY: forwarded contracts.
    unsafe {
        call(err, || {
            writable_opt(admission, "admission")?;
            let history = view(history, len, "history")?;
            let a = with_pool(pool, |s| Ok(s.pool.admit(session, history)?))?;
            out_opt(admission, TierkitKvAdmission::from(a), "admission")
        })
    }
}

/// Appends committed tokens (whole tokens, as in admit) to a session; `committed` (may be NULL)
/// receives its new length in tokens.
///
/// # Safety
/// `pool` is NULL or a pool handle; `tokens` points to `len` readable bytes; `committed` NULL or
/// valid for a write; `err` NULL or valid for a pointer write.
#[no_mangle]
pub unsafe extern "C" fn tierkit_kv_pool_append(
    pool: *const TierkitKvPool,
    session: u64,
    tokens: *const u8,
    len: usize,
    committed: *mut u32,
    err: *mut *mut TierkitError,
) -> TierkitCode {
    // SAFETY: forwarded contracts.
    unsafe {
        call(err, || {
            writable_opt(committed, "committed")?;
            let tokens = view(tokens, len, "tokens")?;
            let n = with_pool(pool, |s| Ok(s.pool.append(session, tokens)?))?;
            out_opt(committed, n, "committed")
        })
    }
}

/// Finishes a session: its pages go back in bounded chunks at `tierkit_kv_pool_between_steps`.
///
/// # Safety
/// `pool` is NULL or a pool handle; `err` NULL or valid for a pointer write.
#[no_mangle]
pub unsafe extern "C" fn tierkit_kv_pool_finish(
    pool: *const TierkitKvPool,
    session: u64,
    err: *mut *mut TierkitError,
) -> TierkitCode {
    // SAFETY: forwarded contracts.
    unsafe { call(err, || with_pool(pool, |s| Ok(s.pool.finish(session)?))) }
}

/// Between steps: hands back up to `chunk` pages of finished sessions, frees pages whose readers
/// completed, lends free pages to sessions missing history. `maintenance` may be NULL.
///
/// # Safety
/// `pool` is NULL or a pool handle; `maintenance` NULL or valid for a write; `err` NULL or valid
/// for a pointer write.
#[no_mangle]
pub unsafe extern "C" fn tierkit_kv_pool_between_steps(
    pool: *const TierkitKvPool,
    chunk: u32,
    maintenance: *mut TierkitKvMaintenance,
    err: *mut *mut TierkitError,
) -> TierkitCode {
    // SAFETY: forwarded contracts.
    unsafe {
        call(err, || {
            writable_opt(maintenance, "maintenance")?;
            let m = with_pool(pool, |s| Ok(s.pool.between_steps(chunk)?))?;
            let m = TierkitKvMaintenance {
                handed_back: m.handed_back,
                collected: m.collected,
                grown: m.grown,
            };
            out_opt(maintenance, m, "maintenance")
        })
    }
}

/// Resolves one step's top-k positions to arena rows (the exact CPU resolver): writes
/// `indices` (`int32 [>= rows * k]`, row stride `k`; entries past `rows * k` are written `-1`)
/// and `valid_count` (`int32 [>= rows]`, entries past `rows` written 0), resolves against the hot
/// cache of `batch->layer`'s layer group and fetches misses into every layer of that group (so the
/// group's layers read the same indices, with no replay), and opens a read: `*read` receives its
/// id. End it with
/// `tierkit_kv_pool_end_read` once the attention that reads the rows is done: until then the
/// rows' pages are not reused. `stats` may be NULL. On error nothing changes and no read is
/// opened (the outputs are filled with `-1` / 0 when long enough). `indices` and `valid_count`
/// overlapping each other or the batch's arrays is `TIERKIT_ERR_INVALID_ARGUMENT`.
///
/// # Safety
/// `pool` is NULL or a pool handle; `batch` points to a readable batch whose pointers are
/// valid for the lengths it gives; `indices` and `valid_count` point to `indices_len` and
/// `valid_len` writable `int32_t`; `stats` NULL or valid for a write; `read` valid for a write;
/// `err` NULL or valid for a pointer write.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn tierkit_kv_pool_resolve(
    pool: *const TierkitKvPool,
    batch: *const TierkitKvBatch,
    indices: *mut i32,
    indices_len: usize,
    valid_count: *mut i32,
    valid_len: usize,
    stats: *mut TierkitKvStats,
    read: *mut u64,
    err: *mut *mut TierkitError,
) -> TierkitCode {
    // SAFETY: forwarded contracts.
    unsafe {
        call(err, || {
            writable_opt(stats, "stats")?;
            writable(read, "read")?;
            let b = view(batch, 1, "batch")?[0];
            if b.flags & !TIERKIT_KV_PACKED != 0 {
                return Err(fail(
                    Code::InvalidArgument,
                    format!("unknown flags {:#x}", b.flags),
                ));
            }
            if b.rows > 0 && b.k > 0 && b.topk_row_stride < b.k {
                return Err(fail(
                    Code::Layout,
                    format!("topk_row_stride {} is below k {}", b.topk_row_stride, b.k),
                ));
            }
            let sessions = view(b.sessions, b.reqs, "batch.sessions")?;
            let qsl_len = b
                .reqs
                .checked_add(1)
                .ok_or_else(|| fail(Code::InvalidArgument, "batch.reqs overflows"))?;
            let qsl = view(b.query_start_loc, qsl_len, "batch.query_start_loc")?;
            let seq_lens = view(b.seq_lens, b.reqs, "batch.seq_lens")?;
            let span = strided_len(b.rows, b.k, b.topk_row_stride.max(b.k))
                .ok_or_else(|| fail(Code::InvalidArgument, "batch.topk size overflows"))?;
            let topk_view = view(b.topk, span, "batch.topk")?;
            // A strided top-k is gathered into rows of stride k (the pool's input layout).
            let gathered: Vec<i32>;
            let topk = if b.topk_row_stride == b.k || b.rows <= 1 {
                &topk_view[..b.rows * b.k]
            } else {
                gathered = tier_core::alloc::try_collect(
                    b.rows * b.k,
                    (0..b.rows)
                        .flat_map(|r| &topk_view[r * b.topk_row_stride..][..b.k])
                        .copied(),
                    "gathered batch.topk",
                )?;
                &gathered
            };
            let qsls = match b.query_seq_lens.is_null() {
                true => None,
                false => Some(view(b.query_seq_lens, b.rows, "batch.query_seq_lens")?),
            };
            // The outputs are written while the inputs are read: no byte may be both.
            let outs = [
                (indices.cast_const(), indices_len, "indices"),
                (valid_count.cast_const(), valid_len, "valid_count"),
            ];
            disjoint(outs[0], outs[1])?;
            for o in outs {
                disjoint(o, (sessions.as_ptr(), sessions.len(), "batch.sessions"))?;
                disjoint(o, (qsl.as_ptr(), qsl.len(), "batch.query_start_loc"))?;
                disjoint(o, (seq_lens.as_ptr(), seq_lens.len(), "batch.seq_lens"))?;
                disjoint(o, (topk_view.as_ptr(), topk_view.len(), "batch.topk"))?;
                if let Some(q) = qsls {
                    disjoint(o, (q.as_ptr(), q.len(), "batch.query_seq_lens"))?;
                }
                disjoint(o, (batch, 1, "batch"))?;
            }
            let indices = view_mut(indices, indices_len, "indices")?;
            let valid_count = view_mut(valid_count, valid_len, "valid_count")?;
            let input = ResolveInput {
                sessions,
                query_start_loc: qsl,
                seq_lens,
                topk,
                k: b.k,
                layer: b.layer,
            };
            let opts = ResolveOptions {
                layout: match b.flags & TIERKIT_KV_PACKED {
                    0 => OutputLayout::InPlace,
                    _ => OutputLayout::Packed,
                },
                query_seq_lens: qsls,
                block_positions: b.block_positions,
            };
            let (id, s, copies) = with_pool(pool, |st| {
                if st.reads.len() >= TIERKIT_KV_MAX_OPEN_READS {
                    return Err(fail(
                        Code::NoRoom,
                        format!(
                            "{TIERKIT_KV_MAX_OPEN_READS} reads are open: end them with \
                             tierkit_kv_pool_end_read"
                        ),
                    ));
                }
                let mut outs = ResolveOutput {
                    indices,
                    valid_count,
                };
                let done = st.pool.resolve_with(&input, &opts, &mut outs)?;
                let id = st.next_read;
                st.next_read += 1;
                let copies = done.plan.copies.len() as u64;
                st.reads.insert(
                    id,
                    OpenRead {
                        plan: done.plan,
                        _ticket: done.ticket,
                    },
                );
                Ok((id, done.stats, copies))
            })?;
            let s = TierkitKvStats {
                picks: s.picks,
                tail_hits: s.tail_hits,
                scratch_hits: s.scratch_hits,
                page_hits: s.page_hits,
                hot_hits: s.hot_hits,
                misses: s.misses,
                direct_sessions: s.direct_sessions,
                unserved: s.unserved,
                plan_copies: copies,
            };
            out_opt(stats, s, "stats")?;
            out(read, id, "read")
        })
    }
}

/// Copies an open read's rows again into one layer of its layer group (never needed: the resolve
/// filled every layer of the group). A layer of another group is refused
/// (`TIERKIT_ERR_INVALID_ARGUMENT`: its planes hold other positions at those rows).
///
/// # Safety
/// `pool` is NULL or a pool handle; `err` NULL or valid for a pointer write.
#[no_mangle]
pub unsafe extern "C" fn tierkit_kv_pool_replay(
    pool: *const TierkitKvPool,
    read: u64,
    layer: u32,
    err: *mut *mut TierkitError,
) -> TierkitCode {
    // SAFETY: forwarded contracts.
    unsafe {
        call(err, || {
            with_pool(pool, |st| {
                let plan = &st.reads.get(&read).ok_or_else(|| unknown_read(read))?.plan;
                Ok(st.pool.replay(plan, layer)?)
            })
        })
    }
}

fn unknown_read(read: u64) -> crate::ffi::Fail {
    fail(
        Code::InvalidHandle,
        format!("read {read} is not open: it was never opened or already ended"),
    )
}

/// Ends a read: the attention that reads its rows is done; its pages may be reused from now on.
///
/// # Safety
/// `pool` is NULL or a pool handle; `err` NULL or valid for a pointer write.
#[no_mangle]
pub unsafe extern "C" fn tierkit_kv_pool_end_read(
    pool: *const TierkitKvPool,
    read: u64,
    err: *mut *mut TierkitError,
) -> TierkitCode {
    // SAFETY: forwarded contracts.
    unsafe {
        call(err, || {
            with_pool(pool, |st| {
                st.reads
                    .remove(&read)
                    .map(drop)
                    .ok_or_else(|| unknown_read(read))
            })
        })
    }
}

/// The bytes of arena row `row` in `layer` (what attention reads at a resolved index), in place:
/// `row_bytes` bytes, valid until the next call that changes the pool, or its free. Contiguous
/// row formats only: a paged split row (DeepSeek-V4) is two segments in the arena, so this
/// refuses it with `TIERKIT_ERR_INVALID_ARGUMENT`; read it with `tierkit_kv_pool_read_row`,
/// which copies either format into the caller's buffer.
///
/// # Safety
/// `pool` is NULL or a pool handle; `data` and `len` valid for writes; `err` NULL or valid for a
/// pointer write.
#[no_mangle]
pub unsafe extern "C" fn tierkit_kv_pool_arena_row(
    pool: *const TierkitKvPool,
    layer: u32,
    row: i32,
    data: *mut *const u8,
    len: *mut usize,
    err: *mut *mut TierkitError,
) -> TierkitCode {
    // SAFETY: forwarded contracts.
    unsafe {
        call(err, || {
            let (p, n) = with_pool(pool, |st| match arena_row(st, layer, row)? {
                Cow::Borrowed(b) => Ok((b.as_ptr(), b.len())),
                Cow::Owned(_) => Err(fail(
                    Code::InvalidArgument,
                    "a paged split row is two segments in the arena, not one span: \
                     read it with tierkit_kv_pool_read_row",
                )),
            })?;
            out(len, n, "len")?;
            out(data, p, "data")
        })
    }
}

/// Copies arena row `row` of `layer` (what attention reads at a resolved index) into `buf` as the
/// token's `value ‖ scale`: `row_bytes` bytes, for either row format (a paged split row's two
/// segments gathered). `*len` gets the bytes written; `cap` smaller than the row's bytes is
/// `TIERKIT_ERR_INVALID_ARGUMENT` (nothing written). Unlike `tierkit_kv_pool_arena_row`, nothing
/// of the pool is lent out, so the copy stays valid after any later call.
///
/// # Safety
/// `pool` is NULL or a pool handle; `buf` NULL or valid for `cap` byte writes; `len` valid for a
/// write; `err` NULL or valid for a pointer write.
#[no_mangle]
pub unsafe extern "C" fn tierkit_kv_pool_read_row(
    pool: *const TierkitKvPool,
    layer: u32,
    row: i32,
    buf: *mut u8,
    cap: usize,
    len: *mut usize,
    err: *mut *mut TierkitError,
) -> TierkitCode {
    // SAFETY: forwarded contracts.
    unsafe {
        call(err, || {
            // Before the copy: an error leaves `buf` untouched.
            writable(len, "len")?;
            let n = with_pool(pool, |st| {
                let bytes = arena_row(st, layer, row)?;
                if cap < bytes.len() {
                    return Err(fail(
                        Code::InvalidArgument,
                        format!("cap {cap} is below the row's {} bytes", bytes.len()),
                    ));
                }
                // SAFETY: the caller's contract on `buf` and `cap`; `bytes` lives in the pool
                // (or is an owned gather), not in the caller's buffer.
                let dst = view_mut(buf, bytes.len(), "buf")?;
                dst.copy_from_slice(&bytes);
                Ok(bytes.len())
            })?;
            out(len, n, "len")
        })
    }
}

/// Arena row `row` of `layer`, or the caller's error naming both.
fn arena_row(st: &PoolState, layer: u32, row: i32) -> R<Cow<'_, [u8]>> {
    st.pool.arena_row(layer, row).ok_or_else(|| {
        fail(
            Code::InvalidArgument,
            format!("no arena row {row} in layer {layer}"),
        )
    })
}

/// Checks the pool's invariants (pages, loans and tables agree); `TIERKIT_ERR_INTERNAL` with
/// the first violation otherwise.
///
/// # Safety
/// `pool` is NULL or a pool handle; `err` NULL or valid for a pointer write.
#[no_mangle]
pub unsafe extern "C" fn tierkit_kv_pool_check_invariants(
    pool: *const TierkitKvPool,
    err: *mut *mut TierkitError,
) -> TierkitCode {
    // SAFETY: forwarded contracts.
    unsafe {
        call(err, || {
            with_pool(pool, |st| {
                st.pool
                    .check_invariants()
                    .map_err(|m| fail(Code::Internal, m))
            })
        })
    }
}

/// Frees a pool (its open reads end). NULL, a freed pool or another handle type is ignored.
///
/// # Safety
/// `pool` is NULL or a pointer tierkit returned; pointers from `tierkit_kv_pool_arena_row` are
/// invalid afterwards.
#[no_mangle]
pub unsafe extern "C" fn tierkit_kv_pool_free(pool: *mut TierkitKvPool) {
    free_handle(pool);
}
