//! The boundary machinery every entry point goes through: the error object, the panic boundary,
//! the handle registry (so a freed handle is an error, not a use after free), and checked views
//! of caller memory (NULL, alignment, length).

use std::collections::HashMap;
use std::ffi::{c_char, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{LazyLock, Mutex, MutexGuard, RwLock, RwLockReadGuard};

use tierkit_bindings::{panic_message, Code};

/// A status code: `TIERKIT_OK` (0) or one of the `TIERKIT_ERR_*` classes. Every fallible entry
/// point returns one; the `tierkit_error` written to its `err` argument carries the same code
/// and a message.
pub type TierkitCode = i32;

/// Success.
pub const TIERKIT_OK: TierkitCode = 0;
/// A required pointer argument was NULL.
pub const TIERKIT_ERR_NULL_ARGUMENT: TierkitCode = 1;
/// An argument is out of range or inconsistent (id, length, shape, geometry, config, session,
/// position...). Nothing changed.
pub const TIERKIT_ERR_INVALID_ARGUMENT: TierkitCode = 2;
/// An array has the wrong element type (the class of Python's `TypeError`; the C signatures fix
/// their element types, so no CPU entry point returns it today).
pub const TIERKIT_ERR_TYPE_MISMATCH: TierkitCode = 3;
/// An array pointer is misaligned for its element type, or a stride is invalid.
pub const TIERKIT_ERR_LAYOUT: TierkitCode = 4;
/// A handle that was freed, never created, or is of another type.
pub const TIERKIT_ERR_INVALID_HANDLE: TierkitCode = 5;
/// The object's state refuses the call now (stale swap or plan, executor refusal, ...).
pub const TIERKIT_ERR_STATE: TierkitCode = 6;
/// Not enough room (HBM pages, open reads).
pub const TIERKIT_ERR_NO_ROOM: TierkitCode = 7;
/// A panic inside tierkit was caught at the boundary. A handle that was being changed when it
/// happened is poisoned (`TIERKIT_ERR_POISONED` from then on); other handles are unaffected.
pub const TIERKIT_ERR_PANIC: TierkitCode = 8;
/// The handle was poisoned by an earlier panic; free it.
pub const TIERKIT_ERR_POISONED: TierkitCode = 9;
/// Anything else.
pub const TIERKIT_ERR_INTERNAL: TierkitCode = 10;
/// The entry point needs a feature this library was built without: the GPU entry points
/// (`*_cuda`) of a build without the `cuda` feature.
pub const TIERKIT_ERR_UNSUPPORTED: TierkitCode = 11;
/// The host could not allocate memory the call needs (a copy of the input, a table the geometry
/// sizes). Nothing changed; the call may succeed once memory is freed.
pub const TIERKIT_ERR_OUT_OF_MEMORY: TierkitCode = 12;

/// An error: a code and a message. Returned through the `tierkit_error **err` argument of a
/// failing call (when `err` is not NULL); read it with `tierkit_error_code` and
/// `tierkit_error_message`, free it with `tierkit_error_free`.
#[derive(Debug)]
pub struct TierkitError {
    code: Code,
    message: CString,
}

/// The code of a class (the constants above are its literal values, for cbindgen).
pub(crate) const fn code_of(c: Code) -> TierkitCode {
    c as i32
}

/// The failure of an entry point before it becomes a [`TierkitError`].
#[derive(Debug)]
pub(crate) struct Fail {
    pub(crate) code: Code,
    pub(crate) message: String,
}

/// Result of the safe body of an entry point.
pub(crate) type R<T> = Result<T, Fail>;

/// A failure of class `code`.
pub(crate) fn fail(code: Code, message: impl Into<String>) -> Fail {
    Fail {
        code,
        message: message.into(),
    }
}

impl From<expert_residency::ExpertError> for Fail {
    fn from(e: expert_residency::ExpertError) -> Self {
        fail(tierkit_bindings::classify_expert(&e), e.to_string())
    }
}

impl From<kv_elastic::KvError> for Fail {
    fn from(e: kv_elastic::KvError) -> Self {
        fail(tierkit_bindings::classify_kv(&e), e.to_string())
    }
}

impl From<tierkit_bindings::Failure> for Fail {
    fn from(f: tierkit_bindings::Failure) -> Self {
        fail(f.code, f.message)
    }
}

impl From<tier_core::CoreError> for Fail {
    fn from(e: tier_core::CoreError) -> Self {
        tierkit_bindings::Failure::from(e).into()
    }
}

/// Runs the body of an entry point: catches a panic (never unwinds into C), turns a failure
/// into its code and, when `err` is not NULL, a new error object written to `*err`. `*err` is
/// written only on failure.
///
/// # Safety
/// `err` is NULL or valid for one pointer write.
pub(crate) unsafe fn call(
    err: *mut *mut TierkitError,
    body: impl FnOnce() -> R<()>,
) -> TierkitCode {
    let result = catch_unwind(AssertUnwindSafe(body)).unwrap_or_else(|payload| {
        Err(fail(
            Code::Panic,
            format!("panic inside tierkit: {}", panic_message(&*payload)),
        ))
    });
    match result {
        Ok(()) => TIERKIT_OK,
        Err(f) => {
            let code = code_of(f.code);
            if !err.is_null() {
                // Interior NULs cannot come from our messages; replace them if they ever do.
                let message = CString::new(f.message.replace('\0', " "))
                    .unwrap_or_else(|_| c"error message unavailable".into());
                let e = new_handle(TierkitError {
                    code: f.code,
                    message,
                });
                // SAFETY: `err` is not NULL and, by this function's contract, valid for a write.
                unsafe { err.write(e) };
            }
            code
        }
    }
}

/// The types that live behind handles, each with its own tag in the registry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Error,
    Map,
    Counters,
    Controller,
    Executor,
    Pool,
}

/// A type handed to C as an opaque handle.
pub(crate) trait Object: Send + Sync + 'static {
    const KIND: Kind;
    /// The C type name, for messages.
    const NAME: &'static str;
}

impl Object for TierkitError {
    const KIND: Kind = Kind::Error;
    const NAME: &'static str = "tierkit_error";
}

/// Every live handle's address and type. Calls look handles up under the read lock and hold it
/// for their whole duration; `*_free` removes a handle under the write lock, so it waits for the
/// calls using it, and a handle used after its free is found missing instead of read.
/// Limitation: once freed, an address may be reused by a new handle of the same type; a stale
/// pointer then reaches that new object (never freed memory).
static LIVE: LazyLock<RwLock<HashMap<usize, Kind>>> = LazyLock::new(Default::default);

/// Boxes `value` and registers it as a live handle.
pub(crate) fn new_handle<T: Object>(value: T) -> *mut T {
    let p = Box::into_raw(Box::new(value));
    LIVE.write()
        .unwrap_or_else(|e| e.into_inner())
        .insert(p as usize, T::KIND);
    p
}

/// Unregisters and drops a handle; NULL, an unknown or already freed pointer, or a handle of
/// another type is left alone (returns false).
pub(crate) fn free_handle<T: Object>(p: *mut T) -> bool {
    if p.is_null() {
        return false;
    }
    let removed = {
        let mut live = LIVE.write().unwrap_or_else(|e| e.into_inner());
        match live.get(&(p as usize)) {
            Some(&k) if k == T::KIND => live.remove(&(p as usize)).is_some(),
            _ => false,
        }
    };
    if removed {
        // Drop outside `catch_unwind` would abort on a panic in a destructor; the tiers'
        // destructors do not panic, and a panic here is caught all the same.
        let _ = catch_unwind(AssertUnwindSafe(|| {
            // SAFETY: `p` came from `Box::into_raw` in `new_handle` (it was registered with
            // this type's tag) and was just unregistered under the write lock, which no call
            // holds: nobody else can reach it any more, so it is dropped exactly once.
            drop(unsafe { Box::from_raw(p) });
        }));
    }
    removed
}

/// The registry's read lock, held by one call while it uses handles.
pub(crate) struct Live(RwLockReadGuard<'static, HashMap<usize, Kind>>);

/// Takes the registry's read lock for one call (take it once per call: a second read lock in
/// the same thread could wait behind a queued free).
pub(crate) fn live() -> Live {
    Live(LIVE.read().unwrap_or_else(|e| e.into_inner()))
}

impl Live {
    /// The object behind a live handle of type `T`.
    pub(crate) fn get<'a, T: Object>(&'a self, p: *const T, what: &str) -> R<&'a T> {
        if p.is_null() {
            return Err(fail(
                Code::NullArgument,
                format!("{what} ({}) is NULL", T::NAME),
            ));
        }
        match self.0.get(&(p as usize)) {
            Some(&k) if k == T::KIND => {}
            Some(&k) => {
                return Err(fail(
                    Code::InvalidHandle,
                    format!("{what} is not a {} (it is a {k:?} handle)", T::NAME),
                ))
            }
            None => {
                return Err(fail(
                    Code::InvalidHandle,
                    format!(
                        "{what} is not a live {}: it was freed or never created",
                        T::NAME
                    ),
                ))
            }
        }
        // SAFETY: the pointer is registered with `T`'s tag, so it came from `new_handle::<T>` and
        // has not been freed: `free_handle` unregisters under the write lock, which cannot be
        // taken while `self` holds the read lock, so the object outlives the borrow.
        Ok(unsafe { &*p })
    }
}

/// Locks a handle's state; a handle poisoned by an earlier panic is refused.
pub(crate) fn lock<'a, T>(m: &'a Mutex<T>, name: &str) -> R<MutexGuard<'a, T>> {
    m.lock().map_err(|_| {
        fail(
            Code::Poisoned,
            format!("{name} was poisoned by an earlier panic inside tierkit; free it"),
        )
    })
}

/// A read-only view of `len` elements at `p` (empty when `len` is 0, whatever `p` is).
///
/// # Safety
/// When `len > 0` and `p` is non-NULL and aligned, `p` must point to `len` initialised elements
/// that stay valid and unwritten for the returned lifetime.
pub(crate) unsafe fn view<'a, T>(p: *const T, len: usize, what: &str) -> R<&'a [T]> {
    if len == 0 {
        return Ok(&[]);
    }
    check_ptr(p, len, what)?;
    // SAFETY: non-NULL, aligned, size within isize (checked); validity is the caller's contract.
    Ok(unsafe { std::slice::from_raw_parts(p, len) })
}

/// A writable view of `len` elements at `p` (empty when `len` is 0).
///
/// # Safety
/// When `len > 0` and `p` is non-NULL and aligned, `p` must point to `len` elements valid for
/// reads and writes, not accessed otherwise for the returned lifetime.
pub(crate) unsafe fn view_mut<'a, T>(p: *mut T, len: usize, what: &str) -> R<&'a mut [T]> {
    if len == 0 {
        return Ok(&mut []);
    }
    check_ptr(p, len, what)?;
    // SAFETY: as in `view`, plus exclusive access by the caller's contract.
    Ok(unsafe { std::slice::from_raw_parts_mut(p, len) })
}

fn check_ptr<T>(p: *const T, len: usize, what: &str) -> R<()> {
    if p.is_null() {
        return Err(fail(
            Code::NullArgument,
            match len {
                1 => format!("{what} is NULL"),
                _ => format!("{what} is NULL but its length is {len}"),
            },
        ));
    }
    let align = std::mem::align_of::<T>();
    if !(p as usize).is_multiple_of(align) {
        return Err(fail(
            Code::Layout,
            format!("{what} ({p:p}) is not aligned to {align} bytes"),
        ));
    }
    if len
        .checked_mul(std::mem::size_of::<T>())
        .is_none_or(|b| b > isize::MAX as usize)
    {
        return Err(fail(
            Code::InvalidArgument,
            format!("{what}: {len} elements overflow the address space"),
        ));
    }
    Ok(())
}

/// Checks an output argument (not NULL, aligned) before the call acts, so that a bad one is an
/// error that changes nothing: checked only at the write, a state-changing call (a reserve, an
/// export, a resolve opening a read, a new handle) had already acted and its result was lost.
pub(crate) fn writable<T>(p: *mut T, what: &str) -> R<()> {
    check_ptr(p, 1, what)
}

/// [`writable`] for an optional output argument (NULL is fine).
pub(crate) fn writable_opt<T>(p: *mut T, what: &str) -> R<()> {
    match p.is_null() {
        true => Ok(()),
        false => check_ptr(p, 1, what),
    }
}

/// Refuses an output array whose memory overlaps another argument's (`TIERKIT_ERR_INVALID_ARGUMENT`
/// naming both): an output the call writes while it reads or writes the other through a second
/// slice would be undefined behaviour in Rust (two live views of one byte, one of them
/// mutable), and the results garbage. Empty ranges overlap nothing.
pub(crate) fn disjoint<A, B>(
    out: (*const A, usize, &str),
    other: (*const B, usize, &str),
) -> R<()> {
    let span = |p: usize, n: usize, size: usize| (p, p.saturating_add(n.saturating_mul(size)));
    let (a, b) = (
        span(out.0 as usize, out.1, std::mem::size_of::<A>()),
        span(other.0 as usize, other.1, std::mem::size_of::<B>()),
    );
    if out.1 > 0 && other.1 > 0 && a.0 < b.1 && b.0 < a.1 {
        return Err(fail(
            Code::InvalidArgument,
            format!(
                "{} overlaps {} in memory: outputs need their own arrays",
                out.2, other.2
            ),
        ));
    }
    Ok(())
}

/// Writes `value` to an output argument.
///
/// # Safety
/// `p` is NULL or valid for one write of `T`.
pub(crate) unsafe fn out<T>(p: *mut T, value: T, what: &str) -> R<()> {
    check_ptr(p, 1, what)?;
    // SAFETY: non-NULL and aligned (checked); valid for a write by the caller's contract.
    unsafe { p.write(value) };
    Ok(())
}

/// Writes `value` to an optional output argument (nothing when `p` is NULL).
///
/// # Safety
/// `p` is NULL or valid for one write of `T`.
pub(crate) unsafe fn out_opt<T>(p: *mut T, value: T, what: &str) -> R<()> {
    if p.is_null() {
        return Ok(());
    }
    // SAFETY: forwarded contract.
    unsafe { out(p, value, what) }
}

/// A NUL-terminated UTF-8 string argument.
///
/// # Safety
/// `p` is NULL or points to a NUL-terminated string valid for the returned lifetime.
pub(crate) unsafe fn c_str<'a>(p: *const c_char, what: &str) -> R<&'a str> {
    if p.is_null() {
        return Err(fail(Code::NullArgument, format!("{what} is NULL")));
    }
    // SAFETY: non-NULL; NUL-terminated and valid by the caller's contract.
    unsafe { CStr::from_ptr(p) }
        .to_str()
        .map_err(|e| fail(Code::InvalidArgument, format!("{what} is not UTF-8: {e}")))
}

/// A string returned to C (free it with `tierkit_string_free`).
pub(crate) fn c_string(s: String) -> *mut c_char {
    CString::new(s.replace('\0', " "))
        .unwrap_or_default()
        .into_raw()
}

/// The code of an error (`TIERKIT_ERR_NULL_ARGUMENT` for NULL, `TIERKIT_ERR_INVALID_HANDLE`
/// for a freed one).
///
/// # Safety
/// `err` is NULL or a pointer returned through an `err` argument (freed ones are detected).
#[no_mangle]
pub unsafe extern "C" fn tierkit_error_code(err: *const TierkitError) -> TierkitCode {
    catch_unwind(|| match live().get(err, "err") {
        Ok(e) => e.code as TierkitCode,
        Err(f) => f.code as TierkitCode,
    })
    .unwrap_or(TIERKIT_ERR_PANIC)
}

/// The message of an error: a NUL-terminated string owned by the error, valid until
/// `tierkit_error_free`. A NULL or freed error gives a static message saying so.
///
/// # Safety
/// `err` is NULL or a pointer returned through an `err` argument (freed ones are detected).
#[no_mangle]
pub unsafe extern "C" fn tierkit_error_message(err: *const TierkitError) -> *const c_char {
    catch_unwind(|| match live().get(err, "err") {
        Ok(e) => e.message.as_ptr(),
        Err(_) => c"(no error: NULL or freed tierkit_error)".as_ptr(),
    })
    .unwrap_or(c"(panic while reading the error)".as_ptr())
}

/// Frees an error. NULL, an already freed error or a pointer that is no error is ignored.
///
/// # Safety
/// `err` is NULL or a pointer returned through an `err` argument; the message pointer taken from
/// it is invalid afterwards.
#[no_mangle]
pub unsafe extern "C" fn tierkit_error_free(err: *mut TierkitError) {
    free_handle(err);
}

/// Frees a string returned by tierkit (e.g. `tierkit_residency_map_to_json`). NULL is ignored.
///
/// # Safety
/// `s` is NULL or a string returned by tierkit and not yet freed (strings are not registered
/// handles: freeing one twice is undefined behaviour, as with `free`).
#[no_mangle]
pub unsafe extern "C" fn tierkit_string_free(s: *mut c_char) {
    if !s.is_null() {
        // SAFETY: `s` came from `CString::into_raw` (`c_string`) by the caller's contract.
        drop(unsafe { CString::from_raw(s) });
    }
}
