//! One place that picks the atomics and locks: `std`'s normally, `loom`'s
//! under `--cfg loom` so the loom tests explore every interleaving of the
//! fence (as crossbeam-epoch does).

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{fence, AtomicBool, AtomicU64};
#[cfg(loom)]
pub(crate) use loom::sync::{Arc, Mutex, MutexGuard};

#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{fence, AtomicBool, AtomicU64};
#[cfg(not(loom))]
pub(crate) use std::sync::{Arc, Mutex, MutexGuard};

pub(crate) use std::sync::atomic::Ordering;

/// Locks `m`, ignoring poisoning: the data behind our mutexes (reader
/// epochs, signals) stays consistent even if a holder panicked, because every
/// critical section is a single push/remove.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(poisoned) => poisoned.into_inner(),
    }
}
