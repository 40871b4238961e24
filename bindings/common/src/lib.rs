//! # tierkit-bindings
//!
//! What the Python package (`bindings/python`, PyO3) and the C ABI (`bindings/c`) share, so that
//! both front ends classify errors and read inputs the same way:
//!
//! - [`Code`]: the error classes of both front ends (the C ABI's `tierkit_code`, a Python exception
//!   type each), and [`classify_expert`] / [`classify_kv`] / [`classify_core`], which put every
//!   tier error in one; [`Failure`], a class and a message, what the shared helpers return.
//! - [`controller_config`]: a [`ControllerConfig`] from optional JSON (missing fields take their
//!   defaults, unknown fields are refused, the values are validated; the flat shape of older
//!   configs is read too); [`read_controller_config`], the same without the range checks, for a
//!   config handed to `Controller::new` (which checks it once).
//! - [`strided_len`]: the elements a strided `[tokens, k]` view spans (the front ends check their
//!   pointers with it; the view itself is [`expert_residency::RouterIds`], counted in place by
//!   [`expert_residency::PickCounters::record_layer_strided`]).
//! - [`Executor`]: the executors both front ends let a controller drive.
//! - [`panic_message`]: the text of a panic caught at a boundary.
//! - `DeviceOps` (feature `cuda`): one device's primary context and `cuda-kernels`' caller-owned
//!   launchers, opened once per process and device, what the torch ops and the C `*_cuda` entry
//!   points launch with.
//!
//! No FFI type lives here: this crate is plain Rust with plain tests.

#[cfg(feature = "cuda")]
mod ops;

#[cfg(feature = "cuda")]
pub use ops::DeviceOps;

use expert_residency::{ControllerConfig, ExpertError, MemoryExecutor, NullExecutor, SwapExecutor};
use kv_elastic::KvError;
use tier_core::CoreError;

/// The class of an error, as both front ends report it. The C ABI returns these numbers
/// (`tierkit_code`); Python raises `TypeError` ([`Code::TypeMismatch`]), `ValueError` (the input
/// classes), `tierkit.ClosedError`, `tierkit.InternalError` (panics) or `RuntimeError` (the rest).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(i32)]
pub enum Code {
    /// Success.
    Ok = 0,
    /// A required pointer argument was NULL (C only).
    NullArgument = 1,
    /// An argument is out of range or inconsistent (a bad id, length, shape, geometry, config,
    /// session, position...). Nothing changed.
    InvalidArgument = 2,
    /// An array has the wrong element type (Python: dtype; C: a type tag).
    TypeMismatch = 3,
    /// An array's data or strides are misaligned or not laid out as required (contiguity).
    Layout = 4,
    /// A handle that was closed or freed, or that is not a handle of the expected type.
    InvalidHandle = 5,
    /// The call is valid but the object's state refuses it now (a stale swap or plan, an
    /// executor that refused a move, a counter table gone backwards).
    State = 6,
    /// Not enough room (HBM pages, host memory).
    NoRoom = 7,
    /// A panic inside tierkit was caught at the boundary; the handle it happened in is poisoned.
    Panic = 8,
    /// The handle was poisoned by an earlier panic: free or close it.
    Poisoned = 9,
    /// Anything else.
    Internal = 10,
    /// The entry point needs a feature this build lacks (the GPU entry points of a build without
    /// the `cuda` feature), or a back-end the object lacks (transfers on a KV pool whose host
    /// store has no region, device-written appends on the CPU pool).
    Unsupported = 11,
    /// The host could not allocate memory the call needs (a copy of the input, a table the
    /// geometry sizes): Python's `MemoryError`. Nothing changed.
    OutOfMemory = 12,
}

/// A failure of a shared helper: its class and message (each front end raises or returns it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    /// The class.
    pub code: Code,
    /// What went wrong, naming the argument.
    pub message: String,
}

impl Failure {
    /// A failure of class `code`.
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        Failure {
            code,
            message: message.into(),
        }
    }
}

impl From<CoreError> for Failure {
    fn from(e: CoreError) -> Self {
        Failure::new(classify_core(&e), e.to_string())
    }
}

/// The class of a `tier-core` error: its allocation failures are [`Code::OutOfMemory`], the rest
/// bad input.
pub fn classify_core(e: &CoreError) -> Code {
    match e {
        CoreError::AllocationFailed { .. } => Code::OutOfMemory,
        _ => Code::InvalidArgument,
    }
}

/// The class of an `expert-residency` error.
pub fn classify_expert(e: &ExpertError) -> Code {
    use ExpertError as E;
    match e {
        E::InvalidGeometry(_)
        | E::HotExceedsExperts { .. }
        | E::ExpertOutOfRange { .. }
        | E::ExpertIdOutOfRange { .. }
        | E::InvalidRouterIds(_)
        | E::LayerOutOfRange { .. }
        | E::TopKTooWide { .. }
        | E::GeometryMismatch { .. }
        | E::LengthMismatch { .. }
        | E::BaselineWithoutCounters
        | E::InvalidRowMap(_)
        | E::EmptyTrace(_)
        | E::InvalidConfig(_)
        | E::Format(_) => Code::InvalidArgument,
        E::StaleSwap { .. } | E::InvalidSwap(_) | E::Executor(_) | E::CounterReset { .. } => {
            Code::State
        }
        E::OutOfMemory { .. } | E::Core(CoreError::AllocationFailed { .. }) => Code::OutOfMemory,
        _ => Code::Internal,
    }
}

/// The class of a `kv-elastic` error.
pub fn classify_kv(e: &KvError) -> Code {
    use KvError as E;
    match e {
        E::InvalidGeometry(_)
        | E::ArenaTooSmall { .. }
        | E::BudgetTooSmall { .. }
        | E::UnknownSession(_)
        | E::SessionFinished(_)
        | E::SessionExists(_)
        | E::EmptyHistory
        | E::RaggedRows { .. }
        | E::LengthMismatch { .. }
        | E::BadQueryStartLoc(_)
        | E::PositionOutOfRange { .. }
        | E::SeqLenOutOfRange { .. }
        | E::QuerySeqLenOutOfRange { .. }
        | E::DuplicateSession(_)
        | E::ScratchOverflow { .. }
        | E::TooManyCandidates { .. }
        | E::LayerOutOfRange { .. }
        | E::BlockPositionsOutOfRange { .. }
        | E::LayerOutsideGroup { .. }
        | E::HistoryTooLong { .. }
        | E::SessionImporting(_)
        | E::NoImport(_)
        | E::OverlappingReserve { .. }
        | E::RowsBeyondRegion { .. }
        | E::ImportIncomplete { .. }
        | E::NoExport(_)
        | E::InvalidConfig(_) => Code::InvalidArgument,
        E::StalePlan { .. } | E::HotCacheOverflow { .. } | E::ImportExpired(_) => Code::State,
        E::NoRoom { .. } | E::StoreCapacity { .. } => Code::NoRoom,
        E::Unsupported(_) => Code::Unsupported,
        E::OutOfMemory { .. } | E::Core(CoreError::AllocationFailed { .. }) => Code::OutOfMemory,
        _ => Code::Internal,
    }
}

/// A controller configuration from JSON (`None`: the defaults; an empty or blank string is an
/// error), checked
/// ([`ControllerConfig::validate`]). Missing fields take their defaults; an unknown field, a
/// wrong type or an out-of-range value is an [`ExpertError::InvalidConfig`] naming it. Both
/// JSON shapes are read: the policy as an object (`{"policy": {"kind": "ratio", "ratio":
/// 1.5}}`) and the flat shape of older configs (`{"policy": "ratio", "ratio": 1.5}`).
pub fn controller_config(json: Option<&str>) -> Result<ControllerConfig, ExpertError> {
    let cfg = read_controller_config(json)?;
    cfg.validate()?;
    Ok(cfg)
}

/// As [`controller_config`], without the range checks: for a config handed straight to
/// `Controller::new`, which checks each part once itself (so a controller built from JSON is not
/// checked twice).
///
/// # Errors
/// [`ExpertError::InvalidConfig`] for bad JSON, a wrong type or an unknown field.
pub fn read_controller_config(json: Option<&str>) -> Result<ControllerConfig, ExpertError> {
    Ok(match json.map(str::trim) {
        None => ControllerConfig::default(),
        // An empty string is no JSON object: a caller who meant the defaults passes None / NULL
        // (`Controller(map, "")` used to take the defaults silently).
        Some("") => {
            return Err(ExpertError::InvalidConfig(
                "controller config JSON is empty: pass a JSON object, or None / NULL for the \
                 defaults"
                    .into(),
            ))
        }
        Some(j) => serde_json::from_str(j)
            .map_err(|e| ExpertError::InvalidConfig(format!("controller config JSON: {e}")))?,
    })
}

/// The executors a front end hands to a controller: the in-memory one (checksummed byte moves,
/// standing in for the GPU bank) or the null one (moves nothing).
#[derive(Debug)]
pub enum Executor {
    /// [`MemoryExecutor`].
    Memory(MemoryExecutor),
    /// [`NullExecutor`].
    Null(NullExecutor),
}

impl Executor {
    /// The executor as the controller takes it.
    pub fn as_dyn(&mut self) -> &mut dyn SwapExecutor {
        match self {
            Executor::Memory(m) => m,
            Executor::Null(n) => n,
        }
    }

    /// The in-memory executor, or `None` for the null one.
    pub fn memory(&self) -> Option<&MemoryExecutor> {
        match self {
            Executor::Memory(m) => Some(m),
            Executor::Null(_) => None,
        }
    }
}

/// The text of a caught panic's payload (`&str` or `String`; a fixed text otherwise).
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic with a non-string payload".into())
}

/// Elements a strided `[rows, k]` view spans (the library's, re-exported for the front ends'
/// pointer checks).
pub use expert_residency::strided_len;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_json_defaults_unknown_fields_and_ranges() {
        assert_eq!(
            controller_config(None).unwrap(),
            ControllerConfig::default()
        );
        // An empty or blank string is no config (it used to mean the defaults, silently).
        for blank in ["", " ", "\n\t"] {
            let e = controller_config(Some(blank)).unwrap_err();
            assert_eq!(classify_expert(&e), Code::InvalidArgument, "{blank:?}: {e}");
            assert!(e.to_string().contains("empty"), "{e}");
        }
        let c = controller_config(Some(r#"{"drain_every": 4}"#)).unwrap();
        assert_eq!(c.drain_every, 4);
        for bad in [
            r#"{"drain_evry": 4}"#,
            r#"{"drain_every": 0}"#,
            "[",
            r#"{"ratio": "x"}"#,
        ] {
            let e = controller_config(Some(bad)).unwrap_err();
            assert_eq!(classify_expert(&e), Code::InvalidArgument, "{bad}: {e}");
        }
    }

    /// What Python's `Controller(boot, cfg)` and C's `tierkit_controller_new` were given before
    /// the per-policy configs still reads (the flat shape), and the new shape reads too.
    #[test]
    fn config_json_of_both_shapes() {
        use expert_residency::{PolicyConfig, RatioConfig};
        let ratio = |r| PolicyConfig::Ratio(RatioConfig { ratio: r });
        let flat = r#"{"policy": "ratio", "adaptive": null, "drain_every": 4, "ratio": 1.25}"#;
        let c = read_controller_config(Some(flat)).unwrap();
        assert_eq!((c.policy, c.drain_every), (ratio(1.25), 4));
        let new = r#"{"policy": {"kind": "ratio", "ratio": 1.25}, "drain_every": 4}"#;
        assert_eq!(controller_config(Some(new)).unwrap().policy, ratio(1.25));
        // read_ checks types and names, not ranges; controller_config checks ranges too.
        let bad = r#"{"policy": {"kind": "ratio", "ratio": 0.5}}"#;
        assert!(read_controller_config(Some(bad)).is_ok());
        let e = controller_config(Some(bad)).unwrap_err();
        assert_eq!(classify_expert(&e), Code::InvalidArgument, "{e}");
        let mixed = r#"{"policy": {"kind": "ratio"}, "ratio": 1.25}"#;
        let e = read_controller_config(Some(mixed)).unwrap_err();
        assert_eq!(classify_expert(&e), Code::InvalidArgument, "{e}");
        assert!(e.to_string().contains(r#""kind": "ratio""#), "{e}");
    }

    #[test]
    fn config_arrays_are_refused_not_bound_by_position() {
        // `[4, 500.0]` used to read as drain_every 4, half_life_steps 500 (Python and C alike).
        for bad in ["[4, 500.0]", "[]", r#"{"shift_response": [2.0, 0.1]}"#] {
            let e = controller_config(Some(bad)).unwrap_err();
            assert_eq!(classify_expert(&e), Code::InvalidArgument, "{bad}: {e}");
            assert!(
                e.to_string().contains("object of named fields"),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn classes() {
        assert_eq!(
            classify_kv(&KvError::UnknownSession(3)),
            Code::InvalidArgument
        );
        assert_eq!(
            classify_kv(&KvError::NoRoom {
                needed: 1,
                available: 0
            }),
            Code::NoRoom
        );
        let oom = KvError::OutOfMemory {
            what: "history",
            bytes: 1 << 40,
        };
        assert_eq!(classify_kv(&oom), Code::OutOfMemory);
        let oom = ExpertError::OutOfMemory {
            what: "counters",
            bytes: 1 << 40,
        };
        assert_eq!(classify_expert(&oom), Code::OutOfMemory);
        let core = CoreError::AllocationFailed {
            what: "t",
            bytes: 1,
        };
        assert_eq!(Failure::from(core).code, Code::OutOfMemory);
        assert_eq!(
            classify_expert(&ExpertError::Executor("busy".into())),
            Code::State
        );
    }
}
