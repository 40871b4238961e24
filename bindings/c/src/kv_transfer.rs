//! The KV tier's transfer half of the C API: a pool whose host store is one registrable region,
//! its descriptor, zero-copy imports (`reserve` / `commit` / `abort`) and pinned exports, and
//! teardown callbacks (a transfer agent's deregistration) run before the region is freed.

use std::ffi::c_void;

use kv_elastic::{ElasticPool, PoolConfig, Reserve, RowSpan, StoreConfig};

use crate::ffi::{
    call, new_handle, out, out_opt, view, writable, writable_opt, TierkitCode, TierkitError,
};
use crate::kv::{with_pool, TierkitKvAdmission, TierkitKvPool};
use crate::kv_geometry::TierkitKvGeometry;

/// `tierkit_kv_region::kind`: host memory (NIXL's `DRAM_SEG`).
pub const TIERKIT_MEM_DRAM: u32 = 0;

/// A pool's host-store region and the layout of its rows: register `addr .. addr + len` with a
/// transfer agent once. Byte offset of (slot, position, layer) from `addr`:
/// `((slot * max_history + position) * layers + layer) * row_bytes`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct TierkitKvRegion {
    /// Virtual address of the first byte.
    pub addr: u64,
    /// Bytes.
    pub len: u64,
    /// Bytes of one token (`layers * row_bytes`).
    pub item_len: u64,
    /// `TIERKIT_MEM_DRAM`.
    pub kind: u32,
    /// NUMA node of the first page, -1 when unknown (a NIXL `dev_id` of 0 then).
    pub numa_node: i32,
    /// Session slots.
    pub max_slots: u32,
    /// Positions per slot.
    pub max_history: u32,
    /// Layers per token.
    pub layers: u32,
    /// Bytes per row.
    pub row_bytes: u32,
}

/// Rows `start .. end` of a session in the region: `len` bytes at `addr` (one contiguous run).
/// From `tierkit_kv_pool_reserve`, `reserved` is false (and the rest zero but `pending`) while
/// the session's fixed pages wait for readers.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct TierkitKvRowSpan {
    /// Session.
    pub session: u64,
    /// First position.
    pub start: u32,
    /// One past the last position.
    pub end: u32,
    /// The session's slot.
    pub slot: u32,
    /// Whether the rows are reserved (always true from `tierkit_kv_pool_export`).
    pub reserved: bool,
    /// Pages waiting behind reader fences (not reserved).
    pub pending: u32,
    /// Byte offset from the region's start.
    pub offset: u64,
    /// Address of the first byte.
    pub addr: u64,
    /// Bytes.
    pub len: u64,
}

impl From<RowSpan> for TierkitKvRowSpan {
    fn from(s: RowSpan) -> Self {
        TierkitKvRowSpan {
            session: s.session,
            start: s.start,
            end: s.end,
            slot: s.slot,
            reserved: true,
            pending: 0,
            offset: s.offset,
            addr: s.addr,
            len: s.len,
        }
    }
}

/// A new pool of `geometry` whose host store is one region of `max_sessions * max_history *
/// layers * row_bytes` bytes (page-aligned; locked in RAM with `lock`): the layout transfer
/// agents register (`tierkit_kv_pool_region`) and write imports into / read exports from.
///
/// # Safety
/// As `tierkit_kv_pool_new`.
#[no_mangle]
pub unsafe extern "C" fn tierkit_kv_pool_new_with_store(
    geometry: *const TierkitKvGeometry,
    elastic: bool,
    max_sessions: u32,
    max_history: u32,
    lock: bool,
    out_pool: *mut *mut TierkitKvPool,
    err: *mut *mut TierkitError,
) -> TierkitCode {
    // SAFETY: forwarded contracts.
    unsafe {
        call(err, || {
            writable(out_pool, "out_pool")?;
            let g = view(geometry, 1, "geometry")?[0].read_geometry()?;
            let store = StoreConfig {
                max_sessions,
                max_history,
                lock,
            };
            let pool = ElasticPool::with_store(g, PoolConfig { elastic }, store)?;
            out(out_pool, new_handle(TierkitKvPool::wrap(pool)), "out_pool")
        })
    }
}

/// The pool's host-store region (`TIERKIT_ERR_UNSUPPORTED` for a pool made by
/// `tierkit_kv_pool_new`, whose store keeps a buffer per session).
///
/// # Safety
/// `pool` is NULL or a pool handle; `region` valid for a write; `err` NULL or valid for a
/// pointer write.
#[no_mangle]
pub unsafe extern "C" fn tierkit_kv_pool_region(
    pool: *const TierkitKvPool,
    region: *mut TierkitKvRegion,
    err: *mut *mut TierkitError,
) -> TierkitCode {
    // SAFETY: forwarded contracts.
    unsafe {
        call(err, || {
            let (d, l) = with_pool(pool, |s| {
                Ok(s.pool.region().ok_or(kv_elastic::KvError::Unsupported(
                    "the pool's host store has no region (tierkit_kv_pool_new_with_store)",
                ))?)
            })?;
            let r = TierkitKvRegion {
                addr: d.addr,
                len: d.len,
                item_len: d.item_len,
                kind: TIERKIT_MEM_DRAM,
                numa_node: d.numa_node.map_or(-1, |n| n as i32),
                max_slots: l.max_slots,
                max_history: l.max_history,
                layers: l.layers,
                row_bytes: l.row_bytes,
            };
            out(region, r, "region")
        })
    }
}

/// Reserves rows `start .. end` of a new or importing session for a transfer agent to write in
/// place (`kv_elastic::ElasticPool::reserve`): the session is invisible until
/// `tierkit_kv_pool_commit`; an import not committed within the import timeout of
/// `tierkit_kv_pool_between_steps` calls expires. Errors change nothing:
/// `TIERKIT_ERR_INVALID_ARGUMENT` (overlapping, empty or out-of-region rows, a live id),
/// `TIERKIT_ERR_NO_ROOM` (no free slot or pages), `TIERKIT_ERR_STATE` (expired).
///
/// # Safety
/// `pool` is NULL or a pool handle; `span` valid for a write; `err` NULL or valid for a pointer
/// write.
#[no_mangle]
pub unsafe extern "C" fn tierkit_kv_pool_reserve(
    pool: *const TierkitKvPool,
    session: u64,
    start: u32,
    end: u32,
    span: *mut TierkitKvRowSpan,
    err: *mut *mut TierkitError,
) -> TierkitCode {
    // SAFETY: forwarded contracts.
    unsafe {
        call(err, || {
            writable(span, "span")?;
            let r = with_pool(pool, |s| Ok(s.pool.reserve(session, start..end)?))?;
            let v = match r {
                Reserve::Reserved(s) => TierkitKvRowSpan::from(s),
                Reserve::Waiting { pending } => TierkitKvRowSpan {
                    session,
                    pending,
                    ..Default::default()
                },
            };
            out(span, v, "span")
        })
    }
}

/// Publishes an import once its writes completed: the reserved rows (covering `0 .. n`) become
/// the session's history, admitted with no host copy. `admission` may be NULL.
///
/// # Safety
/// `pool` is NULL or a pool handle; `admission` NULL or valid for a write; `err` NULL or valid
/// for a pointer write.
#[no_mangle]
pub unsafe extern "C" fn tierkit_kv_pool_commit(
    pool: *const TierkitKvPool,
    session: u64,
    admission: *mut TierkitKvAdmission,
    err: *mut *mut TierkitError,
) -> TierkitCode {
    // SAFETY: forwarded contracts.
    unsafe {
        call(err, || {
            writable_opt(admission, "admission")?;
            let a = with_pool(pool, |s| Ok(s.pool.commit(session)?))?;
            out_opt(admission, TierkitKvAdmission::from(a), "admission")
        })
    }
}

/// Drops an import whose writer is gone (failed, cancelled, timed out): the pool is as before it.
///
/// # Safety
/// `pool` is NULL or a pool handle; `err` NULL or valid for a pointer write.
#[no_mangle]
pub unsafe extern "C" fn tierkit_kv_pool_abort(
    pool: *const TierkitKvPool,
    session: u64,
    err: *mut *mut TierkitError,
) -> TierkitCode {
    // SAFETY: forwarded contracts.
    unsafe { call(err, || with_pool(pool, |s| Ok(s.pool.abort(session)?))) }
}

/// Sets after how many `tierkit_kv_pool_between_steps` calls without a reserve an import expires
/// (default 1000; at least 1).
///
/// # Safety
/// `pool` is NULL or a pool handle; `err` NULL or valid for a pointer write.
#[no_mangle]
pub unsafe extern "C" fn tierkit_kv_pool_set_import_timeout(
    pool: *const TierkitKvPool,
    steps: u32,
    err: *mut *mut TierkitError,
) -> TierkitCode {
    // SAFETY: forwarded contracts.
    unsafe {
        call(err, || {
            with_pool(pool, |s| Ok(s.pool.set_import_timeout(steps)?))
        })
    }
}

/// Pins a live session's committed rows for a transfer agent to read; they stay in place, even
/// after `tierkit_kv_pool_finish`, until `tierkit_kv_pool_export_done`.
///
/// # Safety
/// `pool` is NULL or a pool handle; `span` valid for a write; `err` NULL or valid for a pointer
/// write.
#[no_mangle]
pub unsafe extern "C" fn tierkit_kv_pool_export(
    pool: *const TierkitKvPool,
    session: u64,
    span: *mut TierkitKvRowSpan,
    err: *mut *mut TierkitError,
) -> TierkitCode {
    // SAFETY: forwarded contracts.
    unsafe {
        call(err, || {
            writable(span, "span")?;
            let s = with_pool(pool, |s| Ok(s.pool.export(session)?))?;
            out(span, TierkitKvRowSpan::from(s), "span")
        })
    }
}

/// The transfer reading an export of `session` completed.
///
/// # Safety
/// `pool` is NULL or a pool handle; `err` NULL or valid for a pointer write.
#[no_mangle]
pub unsafe extern "C" fn tierkit_kv_pool_export_done(
    pool: *const TierkitKvPool,
    session: u64,
    err: *mut *mut TierkitError,
) -> TierkitCode {
    // SAFETY: forwarded contracts.
    unsafe {
        call(err, || {
            with_pool(pool, |s| Ok(s.pool.export_done(session)?))
        })
    }
}

/// A teardown callback: `(user, addr, len)` of the region.
pub type TierkitTeardownFn = Option<unsafe extern "C" fn(user: *mut c_void, addr: u64, len: u64)>;

/// `user` travels to the callback on the thread that frees the pool.
struct UserData(*mut c_void);

// SAFETY: the caller's contract of `tierkit_kv_pool_on_teardown`: `user` may be used from the
// thread that frees the pool.
unsafe impl Send for UserData {}

/// Calls `callback(user, addr, len)` when the pool is freed, before its region is unlocked and
/// unmapped (a transfer agent's deregistration); callbacks run newest first.
/// `TIERKIT_ERR_UNSUPPORTED` for a pool without a region; `TIERKIT_ERR_INVALID_ARGUMENT` for a
/// NULL callback.
///
/// # Safety
/// `pool` is NULL or a pool handle; `callback` safe to call once with `user` from the thread
/// that calls `tierkit_kv_pool_free`; `err` NULL or valid for a pointer write.
#[no_mangle]
pub unsafe extern "C" fn tierkit_kv_pool_on_teardown(
    pool: *const TierkitKvPool,
    callback: TierkitTeardownFn,
    user: *mut c_void,
    err: *mut *mut TierkitError,
) -> TierkitCode {
    // SAFETY: forwarded contracts.
    unsafe {
        call(err, || {
            let Some(f) = callback else {
                return Err(crate::ffi::fail(
                    tierkit_bindings::Code::InvalidArgument,
                    "callback: NULL",
                ));
            };
            let hook = teardown_hook(f, UserData(user));
            with_pool(pool, |s| Ok(s.pool.on_teardown(hook)?))
        })
    }
}

/// The hook calling `f(user, addr, len)` once.
fn teardown_hook(
    f: unsafe extern "C" fn(*mut c_void, u64, u64),
    user: UserData,
) -> kv_elastic::TeardownHook {
    Box::new(move |d| {
        let user = user;
        // SAFETY: `tierkit_kv_pool_on_teardown`'s contract: `f` may be called once with `user`
        // from the thread that frees the pool, which runs the hook.
        unsafe { f(user.0, d.addr, d.len) }
    })
}
