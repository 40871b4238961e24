//! # tierkit-python
//!
//! The native module `tierkit._native` of the `tierkit` Python package (PyO3, abi3 for CPython
//! ≥ 3.9, built by maturin: `pip install ./bindings/python`). The Python modules
//! `tierkit.experts` and `tierkit.kv` re-export its classes under their public names, and
//! `tierkit.sim` the lab's functions where the wheel was built with the `lab` feature (the base
//! wheel depends on the tiers only); see `bindings/python/README.md`.
//!
//! Boundaries, the same for every method:
//! - **Arrays** come in as numpy arrays, CPU tensors through DLPack (torch, jax, cupy-on-host...)
//!   or buffer-protocol objects; dtype, shape, alignment and (for outputs) contiguity and
//!   writability are checked: `TypeError` for a dtype, `ValueError` for the rest (`src/arrays.rs`).
//! - **Errors** of the tiers become `ValueError` (bad input), `MemoryError` (the host could not
//!   allocate what the call needs) or `RuntimeError` (state, room), after the classes shared with
//!   the C ABI (`tierkit_bindings::Code`).
//! - **Panics** are caught in every method and raised as `tierkit.InternalError` (a
//!   `RuntimeError`); the object that panicked is poisoned (closed), every other object goes on.
//! - **Lifetimes**: every resource object has `close()` (and is a context manager); a closed
//!   object raises `tierkit.ClosedError`. No method starts a thread that outlives it (the
//!   scoreboard's replay threads are scoped and joined before it returns), so nothing of ours
//!   runs after `close()` or at interpreter exit.
//! - **Concurrency**: an object used by two Python threads at once raises `RuntimeError` in the
//!   second instead of blocking (objects are locked with `try_lock`, never while Python code may
//!   run).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Mutex, TryLockError};

use pyo3::exceptions::{PyMemoryError, PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use tierkit_bindings::{panic_message, Code};

mod arrays;
mod experts;
#[cfg(feature = "cuda")]
mod gpu;
#[cfg(feature = "cuda")]
mod gpu_kv;
mod ints;
mod kv;
mod kv_transfer;
#[cfg(feature = "lab")]
mod sim;

pyo3::create_exception!(
    tierkit,
    ClosedError,
    PyRuntimeError,
    "An object used after close() (or poisoned by an earlier internal error)."
);
pyo3::create_exception!(
    tierkit,
    InternalError,
    PyRuntimeError,
    "A panic inside tierkit, caught at the boundary; the object it happened in is closed."
);

/// The Python exception of an error class.
pub(crate) fn raise(code: Code, message: String) -> PyErr {
    match code {
        Code::TypeMismatch => PyTypeError::new_err(message),
        Code::NullArgument | Code::InvalidArgument | Code::Layout => PyValueError::new_err(message),
        Code::InvalidHandle | Code::Poisoned => ClosedError::new_err(message),
        Code::Panic => InternalError::new_err(message),
        Code::OutOfMemory => PyMemoryError::new_err(message),
        Code::Ok | Code::State | Code::NoRoom | Code::Internal | Code::Unsupported => {
            PyRuntimeError::new_err(message)
        }
    }
}

/// An `expert-residency` error as a Python exception.
pub(crate) fn expert_err(e: expert_residency::ExpertError) -> PyErr {
    raise(tierkit_bindings::classify_expert(&e), e.to_string())
}

/// A shared helper's failure as a Python exception.
pub(crate) fn failure(f: tierkit_bindings::Failure) -> PyErr {
    raise(f.code, f.message)
}

/// A `tier-core` error (an allocation of ours that failed: `MemoryError`) as a Python exception.
pub(crate) fn core_err(e: tier_core::CoreError) -> PyErr {
    failure(e.into())
}

/// A `kv-elastic` error as a Python exception.
pub(crate) fn kv_err(e: kv_elastic::KvError) -> PyErr {
    raise(tierkit_bindings::classify_kv(&e), e.to_string())
}

/// Runs `f`, turning a panic into `InternalError` (never PyO3's `PanicException`, which is a
/// `BaseException` that `except Exception` would not catch).
pub(crate) fn guard<T>(f: impl FnOnce() -> PyResult<T>) -> PyResult<T> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|p| {
        Err(InternalError::new_err(format!(
            "panic inside tierkit: {}",
            panic_message(&*p)
        )))
    })
}

enum State<T> {
    Open(T),
    Closed,
    Poisoned(String),
}

/// The Rust object behind a Python resource object: open, closed, or poisoned by a panic.
pub(crate) struct Slot<T> {
    name: &'static str,
    state: Mutex<State<T>>,
}

impl<T> Slot<T> {
    pub(crate) fn new(name: &'static str, value: T) -> Self {
        Slot {
            name,
            state: Mutex::new(State::Open(value)),
        }
    }

    /// Runs `f` on the open object. Closed or poisoned: `ClosedError`; in use by another thread:
    /// `RuntimeError`; a panic in `f`: `InternalError`, and the object is poisoned (dropped).
    /// `f` must not run Python code that could release the GIL (the lock is held).
    pub(crate) fn with<R>(&self, f: impl FnOnce(&mut T) -> PyResult<R>) -> PyResult<R> {
        let mut state = match self.state.try_lock() {
            Ok(g) => g,
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
            Err(TryLockError::WouldBlock) => {
                return Err(PyRuntimeError::new_err(format!(
                    "{} is in use by another thread",
                    self.name
                )))
            }
        };
        let value = match &mut *state {
            State::Open(v) => v,
            State::Closed => return Err(ClosedError::new_err(format!("{} is closed", self.name))),
            State::Poisoned(m) => {
                return Err(ClosedError::new_err(format!(
                    "{} was closed by an earlier internal error ({m})",
                    self.name
                )))
            }
        };
        match catch_unwind(AssertUnwindSafe(|| f(value))) {
            Ok(r) => r,
            Err(p) => {
                let msg = panic_message(&*p);
                let old = std::mem::replace(&mut *state, State::Poisoned(msg.clone()));
                // A destructor that panics too must not unwind into Python.
                let _ = catch_unwind(AssertUnwindSafe(move || drop(old)));
                Err(InternalError::new_err(format!(
                    "panic inside tierkit: {msg}; {} is closed",
                    self.name
                )))
            }
        }
    }

    /// Drops the object (idempotent).
    pub(crate) fn close(&self) -> PyResult<()> {
        let old = self.take_state()?;
        guard(move || {
            drop(old);
            Ok(())
        })
    }

    /// Marks the object closed and hands back its value if it was open (`None` when it was
    /// closed or poisoned already): for owners that must free it later (idempotent).
    #[cfg(feature = "cuda")]
    pub(crate) fn take(&self) -> PyResult<Option<T>> {
        Ok(match self.take_state()? {
            State::Open(v) => Some(v),
            State::Closed | State::Poisoned(_) => None,
        })
    }

    fn take_state(&self) -> PyResult<State<T>> {
        Ok(match self.state.try_lock() {
            Ok(mut g) => std::mem::replace(&mut *g, State::Closed),
            Err(TryLockError::Poisoned(p)) => {
                std::mem::replace(&mut *p.into_inner(), State::Closed)
            }
            Err(TryLockError::WouldBlock) => {
                return Err(PyRuntimeError::new_err(format!(
                    "{} is in use by another thread",
                    self.name
                )))
            }
        })
    }

    /// Whether the object is closed (or poisoned).
    pub(crate) fn is_closed(&self) -> bool {
        match self.state.try_lock() {
            Ok(g) => !matches!(*g, State::Open(_)),
            Err(TryLockError::Poisoned(_)) => true,
            Err(TryLockError::WouldBlock) => false,
        }
    }
}

/// A JSON-serialisable value as the matching Python object (dicts, lists, numbers...).
pub(crate) fn to_py<'py>(
    py: Python<'py>,
    v: &impl serde::Serialize,
) -> PyResult<Bound<'py, PyAny>> {
    let s = serde_json::to_string(v).map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
    py.import("json")?.call_method1("loads", (s,))
}

/// A JSON argument `what` given as a string, a dict (or any JSON-serialisable object), or None.
/// An object `json.dumps` refuses (bytes, a set, a circular dict, NaN...) is a `TypeError` /
/// `ValueError` naming `what`.
pub(crate) fn json_arg(obj: Option<&Bound<'_, PyAny>>, what: &str) -> PyResult<Option<String>> {
    match obj {
        None => Ok(None),
        Some(o) if o.is_none() => Ok(None),
        Some(o) => match o.extract::<String>() {
            Ok(s) => Ok(Some(s)),
            Err(_) => {
                let py = o.py();
                let kw = pyo3::types::PyDict::new(py);
                // NaN and infinities are no JSON: refused here, not sent as `NaN`.
                kw.set_item("allow_nan", false)?;
                let dumped = py
                    .import("json")?
                    .call_method("dumps", (o,), Some(&kw))
                    .map_err(|e| {
                        let msg = format!(
                            "{what} must be a JSON string or a JSON-serialisable dict: {}",
                            e.value(py)
                        );
                        if e.is_instance_of::<PyTypeError>(py) {
                            PyTypeError::new_err(msg)
                        } else {
                            PyValueError::new_err(msg)
                        }
                    })?;
                Ok(Some(dumped.extract()?))
            }
        },
    }
}

/// Panics on purpose inside tierkit (for tests of the panic boundary): raises `InternalError`.
#[pyfunction]
fn _test_panic() -> PyResult<()> {
    guard(|| {
        let table: Vec<u32> = Vec::new();
        let i = table.len() + 3;
        panic!("test panic: index {i} of an empty table")
    })
}

/// Whether this build has the GPU entry points of `tierkit.torch` (false: built without the
/// `cuda` feature).
#[cfg(not(feature = "cuda"))]
#[pyfunction]
fn has_cuda_ops() -> bool {
    false
}

/// Whether this build has the lab (`tierkit.sim`: the replay scoreboard, trace readers and link
/// model of `tierkit-sim`); false in the base wheel, built without the `lab` feature.
#[pyfunction]
fn has_lab() -> bool {
    cfg!(feature = "lab")
}

/// Whether this build has the test hooks (`--features test-hooks`: `KvPool(...,
/// settle_readers=True)`); false in every wheel meant for engines.
#[pyfunction]
fn has_test_hooks() -> bool {
    cfg!(feature = "test-hooks")
}

/// The native module.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("ClosedError", py.get_type::<ClosedError>())?;
    m.add("InternalError", py.get_type::<InternalError>())?;
    m.add_function(wrap_pyfunction!(_test_panic, m)?)?;
    m.add_function(wrap_pyfunction!(has_lab, m)?)?;
    m.add_function(wrap_pyfunction!(has_test_hooks, m)?)?;
    experts::register(m)?;
    kv::register(m)?;
    #[cfg(feature = "lab")]
    sim::register(m)?;
    #[cfg(feature = "cuda")]
    gpu::register(m)?;
    #[cfg(feature = "cuda")]
    gpu_kv::register(m)?;
    #[cfg(not(feature = "cuda"))]
    m.add_function(wrap_pyfunction!(has_cuda_ops, m)?)?;
    Ok(())
}
