//! The host store: every session's committed history, append-only, in host memory, once.
//!
//! [`HostStore`] keeps the books (which sessions are live or finished, their lengths, the checks
//! and typed errors); where the bytes live is its [`HostBytes`] backing: [`VecBytes`] (one `Vec`
//! per session, the CPU pool) or the GPU pool's mapped pinned store (`gpu::PinnedBytes`, feature
//! `cuda`), which the kernels read in place, so the GPU pool holds the history once.

use hashbrown::{HashMap, HashSet};
use tier_core::alloc::try_reserve;

use crate::data::region::{HostMemory, RegionDesc, StoreLayout, TeardownHook};
use crate::error::{KvError, Result};
use crate::layout::MAX_HISTORY;

/// Session id (the engine's request id; one word in this crate: session): any `u64`.
pub type SessionId = u64;

pub(crate) mod sealed {
    /// Seals [`super::HostBytes`] and `crate::DataPlane`: the pool's invariants depend on them.
    pub trait Sealed {}
}

/// Where a [`HostStore`] keeps the bytes of each live session's committed history
/// (`[tokens][layers][row_bytes]`, token-major). Sealed: implemented by [`VecBytes`] and, with
/// feature `cuda`, by the GPU pool's pinned store. The store checks every call first (session
/// live or new, whole tokens), so implementations only move bytes.
pub trait HostBytes: sealed::Sealed + Send + std::fmt::Debug {
    /// Whether a new session of `history_bytes` committed bytes fits (the pinned store's slots and
    /// per-slot capacity). Errors: a capacity error naming the limit.
    fn check_room(&self, history_bytes: usize) -> Result<()>;
    /// Allocates the host memory a new session of `history_bytes` committed bytes needs, so the
    /// [`HostBytes::create`] that follows allocates nothing (the pool calls it before it changes
    /// anything, so an admission the host cannot hold changes nothing). Errors: `OutOfMemory`.
    /// The default allocates nothing (a backing whose memory was allocated up front).
    fn reserve_new(&mut self, history_bytes: usize) -> Result<()> {
        let _ = history_bytes;
        Ok(())
    }
    /// Frees what [`HostBytes::reserve_new`] allocated when no `create` follows (the admission
    /// waits for pages).
    fn release_reserved(&mut self) {}
    /// A new session with its first committed bytes (after [`HostBytes::check_room`]). Errors:
    /// `OutOfMemory` where [`HostBytes::reserve_new`] did not reserve the room.
    fn create(&mut self, session: SessionId, history: &[u8]) -> Result<()>;
    /// Appends committed bytes. Errors: `OutOfMemory` (nothing appended).
    fn append(&mut self, session: SessionId, bytes: &[u8]) -> Result<()>;
    /// Grows the committed history by `bytes` bytes whose contents a device kernel writes
    /// (write-back); a backing that cannot be written by the device refuses (`Unsupported`).
    fn extend_device_written(&mut self, session: SessionId, bytes: usize) -> Result<()>;
    /// The committed bytes of a live session, once no queued device work writes them (the
    /// pinned store waits for its last write-back). Errors: the wait's CUDA error.
    fn bytes(&self, session: SessionId) -> Result<&[u8]>;
    /// Drops a finished session's bytes (an exported slot keeps them until its last export
    /// ends).
    fn remove(&mut self, session: SessionId);
    /// The registrable region and the layout of the rows in it; `None` for a backing without
    /// one ([`VecBytes`]: a `Vec` per session, which moves as it grows).
    fn region(&self) -> Option<(RegionDesc, StoreLayout)> {
        None
    }
    /// The slot of a session holding one (live, importing), for the layout's offsets.
    fn slot(&self, session: SessionId) -> Option<u32> {
        let _ = session;
        None
    }
    /// Takes a slot for an import of `session` (not live: no byte view until
    /// [`HostBytes::commit_import`]). Errors: `Unsupported` without a region, a capacity error
    /// when no slot is free.
    fn reserve_import(&mut self, session: SessionId) -> Result<u32> {
        let _ = session;
        Err(KvError::Unsupported(
            "imports need a region-backed host store (max_sessions / max_history)",
        ))
    }
    /// The import's first `bytes` bytes become the session's committed history.
    fn commit_import(&mut self, session: SessionId, bytes: usize) {
        let _ = (session, bytes);
    }
    /// Frees an import's slot (nobody writes it any more).
    fn drop_import(&mut self, session: SessionId) {
        let _ = session;
    }
    /// One more export reads a live session's slot. Errors: `Unsupported` without a region.
    fn pin_export(&mut self, session: SessionId) -> Result<()> {
        let _ = session;
        Err(KvError::Unsupported(
            "exports need a region-backed host store (max_sessions / max_history)",
        ))
    }
    /// Open exports of a session (live or finished).
    fn exports_of(&self, session: SessionId) -> u32 {
        let _ = session;
        0
    }
    /// One export of `session` ended; `false` when none was open.
    fn unpin_export(&mut self, session: SessionId) -> bool {
        let _ = session;
        false
    }
    /// Host memory the backing holds, by its own accounting.
    fn memory(&self) -> HostMemory;
    /// Adds a teardown hook (a transfer agent's deregistration), run before the region's memory
    /// is unlocked and freed. Errors: `Unsupported` without a region.
    fn on_teardown(&mut self, hook: TeardownHook) -> Result<()> {
        drop(hook);
        Err(KvError::Unsupported(
            "teardown hooks need a region-backed host store",
        ))
    }
}

/// The CPU backing of a [`HostStore`]: one `Vec<u8>` per live session, allocated fallibly (the
/// host refusing a history is `OutOfMemory`, never an abort).
#[derive(Debug, Clone, Default)]
pub struct VecBytes {
    sessions: HashMap<SessionId, Vec<u8>>,
    /// The next session's buffer, allocated by [`HostBytes::reserve_new`].
    reserved: Vec<u8>,
}

impl sealed::Sealed for VecBytes {}

/// What a session's history buffer is called in `OutOfMemory`.
const HISTORY: &str = "a session's history (host store)";

impl HostBytes for VecBytes {
    fn check_room(&self, _history_bytes: usize) -> Result<()> {
        Ok(())
    }

    fn reserve_new(&mut self, history_bytes: usize) -> Result<()> {
        self.reserved = Vec::new();
        reserve_entry(&mut self.sessions, "host store session table")?;
        try_reserve(&mut self.reserved, history_bytes, HISTORY)?;
        Ok(())
    }

    fn release_reserved(&mut self) {
        self.reserved = Vec::new();
    }

    fn create(&mut self, session: SessionId, history: &[u8]) -> Result<()> {
        let mut v = std::mem::take(&mut self.reserved);
        v.clear();
        try_reserve(&mut v, history.len(), HISTORY)?;
        reserve_entry(&mut self.sessions, "host store session table")?;
        v.extend_from_slice(history);
        self.sessions.insert(session, v);
        Ok(())
    }

    fn append(&mut self, session: SessionId, bytes: &[u8]) -> Result<()> {
        let v = self.sessions.get_mut(&session).expect("checked live");
        try_reserve(v, bytes.len(), HISTORY)?;
        v.extend_from_slice(bytes);
        Ok(())
    }

    fn extend_device_written(&mut self, _session: SessionId, _bytes: usize) -> Result<()> {
        Err(KvError::Unsupported(
            "device-written appends need the GPU pool's pinned store",
        ))
    }

    fn bytes(&self, session: SessionId) -> Result<&[u8]> {
        Ok(&self.sessions[&session])
    }

    fn remove(&mut self, session: SessionId) {
        self.sessions.remove(&session);
    }

    fn memory(&self) -> HostMemory {
        let (used, cap) = self
            .sessions
            .values()
            .chain(std::iter::once(&self.reserved))
            .fold((0, 0), |(u, c), v| {
                (u + v.len() as u64, c + v.capacity() as u64)
            });
        HostMemory {
            store_bytes: used,
            allocated_bytes: cap,
            pinned_bytes: 0,
        }
    }
}

/// Room for one more entry in `map` (so the insert that follows allocates nothing).
fn reserve_entry<K, V>(map: &mut HashMap<K, V>, what: &'static str) -> Result<()>
where
    K: std::hash::Hash + Eq,
{
    map.try_reserve(1).map_err(|_| KvError::OutOfMemory {
        what,
        bytes: ((map.len() as u64) + 1).saturating_mul(std::mem::size_of::<(K, V)>() as u64),
    })
}

/// Every session's committed KV history in host memory (the GPU back-end pins it), append-only.
///
/// Layout per session: `[tokens][layers][row_bytes]` bytes, token-major, so one token's rows for
/// all layers are contiguous (one write-back per token). Finished sessions drop their bytes but
/// stay known, so late calls get [`KvError::SessionFinished`] instead of `UnknownSession`.
#[derive(Debug, Clone)]
pub struct HostStore<B: HostBytes = VecBytes> {
    row_bytes: usize,
    layers: usize,
    /// Committed tokens of each live session.
    live: HashMap<SessionId, u32>,
    finished: HashSet<SessionId>,
    /// Sessions whose rows are reserved for an import (not live yet).
    importing: HashSet<SessionId>,
    bytes: B,
}

impl HostStore {
    /// An empty store for rows of `row_bytes` bytes and `layers` layers.
    pub fn new(row_bytes: u32, layers: u32) -> Self {
        Self::with_backing(row_bytes, layers, VecBytes::default())
    }
}

impl<B: HostBytes> HostStore<B> {
    /// An empty store on `bytes` (which holds no session).
    pub(crate) fn with_backing(row_bytes: u32, layers: u32, bytes: B) -> Self {
        Self {
            row_bytes: row_bytes as usize,
            layers: layers as usize,
            live: HashMap::new(),
            finished: HashSet::new(),
            importing: HashSet::new(),
            bytes,
        }
    }

    /// The byte backing.
    pub fn backing(&self) -> &B {
        &self.bytes
    }

    pub(crate) fn backing_mut(&mut self) -> &mut B {
        &mut self.bytes
    }

    /// Bytes per token (`layers × row_bytes`).
    pub fn token_bytes(&self) -> usize {
        self.row_bytes * self.layers
    }

    /// Checks that a session id may be created (`SessionExists`; `SessionImporting` while an
    /// import of it is in flight).
    pub fn check_new(&self, session: SessionId) -> Result<()> {
        if self.importing.contains(&session) {
            return Err(KvError::SessionImporting(session));
        }
        if self.live.contains_key(&session) || self.finished.contains(&session) {
            return Err(KvError::SessionExists(session));
        }
        Ok(())
    }

    /// Checks that `bytes` is a whole, non-zero number of tokens, at most [`MAX_HISTORY`];
    /// returns the token count.
    pub fn check_tokens(&self, bytes: &[u8], allow_empty: bool) -> Result<u32> {
        let tb = self.token_bytes();
        if !bytes.len().is_multiple_of(tb) {
            return Err(KvError::RaggedRows {
                token_bytes: tb,
                actual: bytes.len(),
            });
        }
        if bytes.is_empty() && !allow_empty {
            return Err(KvError::EmptyHistory);
        }
        let n = bytes.len() / tb;
        if n > MAX_HISTORY as usize {
            return Err(KvError::HistoryTooLong {
                tokens: n as u64,
                max: MAX_HISTORY,
            });
        }
        Ok(n as u32)
    }

    /// The length a live session's history would reach with `more` tokens, checked against
    /// [`MAX_HISTORY`] (`HistoryTooLong`).
    fn grown_len(&self, session: SessionId, more: u32) -> Result<u32> {
        let len = self.live[&session] as u64 + more as u64;
        if len > MAX_HISTORY as u64 {
            return Err(KvError::HistoryTooLong {
                tokens: len,
                max: MAX_HISTORY,
            });
        }
        Ok(len as u32)
    }

    /// Allocates what [`HostStore::create`] of a session with `history_bytes` committed bytes
    /// needs, so that it then allocates nothing (see [`HostBytes::reserve_new`]). Errors:
    /// `OutOfMemory` (nothing changed).
    pub fn reserve_new(&mut self, history_bytes: usize) -> Result<()> {
        reserve_entry(&mut self.live, "host store session table")?;
        self.bytes.reserve_new(history_bytes)
    }

    /// Frees what [`HostStore::reserve_new`] allocated (no `create` follows).
    pub fn release_reserved(&mut self) {
        self.bytes.release_reserved();
    }

    /// Creates a session with its first committed tokens (`[tokens][layers][row_bytes]`).
    /// Errors: `SessionExists`, `RaggedRows`, `EmptyHistory`, `OutOfMemory` (unless
    /// [`HostStore::reserve_new`] reserved the room); nothing changes on an error.
    pub fn create(&mut self, session: SessionId, history: &[u8]) -> Result<u32> {
        self.check_new(session)?;
        let n = self.check_tokens(history, false)?;
        reserve_entry(&mut self.live, "host store session table")?;
        self.bytes.create(session, history)?;
        self.live.insert(session, n);
        Ok(n)
    }

    /// Checks a session is live (`UnknownSession`, `SessionFinished`, `SessionImporting`).
    pub fn check_live(&self, session: SessionId) -> Result<()> {
        if self.live.contains_key(&session) {
            Ok(())
        } else if self.importing.contains(&session) {
            Err(KvError::SessionImporting(session))
        } else if self.finished.contains(&session) {
            Err(KvError::SessionFinished(session))
        } else {
            Err(KvError::UnknownSession(session))
        }
    }

    /// Appends committed tokens; returns the new length in tokens.
    /// Errors: `UnknownSession`, `SessionFinished`, `RaggedRows`, `HistoryTooLong` (past
    /// [`MAX_HISTORY`]), `OutOfMemory` (nothing changed).
    pub fn append(&mut self, session: SessionId, tokens: &[u8]) -> Result<u32> {
        self.check_live(session)?;
        let n = self.check_tokens(tokens, true)?;
        let new = self.grown_len(session, n)?;
        self.bytes.append(session, tokens)?;
        *self.live.get_mut(&session).expect("checked live") = new;
        Ok(new)
    }

    /// Appends `tokens` committed tokens whose bytes a device kernel writes into the backing
    /// (the GPU pool's write-back); returns the new length. Their bytes may be read only once
    /// that kernel has run. Errors: session errors, `Unsupported` on the CPU backing.
    pub fn append_device_written(&mut self, session: SessionId, tokens: u32) -> Result<u32> {
        self.check_live(session)?;
        let new = self.grown_len(session, tokens)?;
        self.bytes
            .extend_device_written(session, tokens as usize * self.token_bytes())?;
        *self.live.get_mut(&session).expect("checked live") = new;
        Ok(new)
    }

    /// Committed length of a live session, in tokens.
    pub fn len(&self, session: SessionId) -> Result<u32> {
        self.check_live(session)?;
        Ok(self.live[&session])
    }

    /// Whether no session is live.
    pub fn is_empty(&self) -> bool {
        self.live.is_empty()
    }

    /// Live sessions.
    pub fn live_count(&self) -> usize {
        self.live.len()
    }

    /// One row (`row_bytes` bytes) of a live session. Errors: `UnknownSession`,
    /// `SessionFinished`, `LayerOutOfRange`, `PositionOutOfRange`.
    pub fn row(&self, session: SessionId, position: u32, layer: u32) -> Result<&[u8]> {
        self.check_live(session)?;
        if layer as usize >= self.layers {
            return Err(KvError::LayerOutOfRange {
                layer,
                layers: self.layers as u32,
            });
        }
        let v = self.bytes.bytes(session)?;
        let off = (position as usize * self.layers + layer as usize) * self.row_bytes;
        v.get(off..off + self.row_bytes)
            .ok_or(KvError::PositionOutOfRange {
                row: 0,
                position: position as i32,
                seq_len: (v.len() / self.token_bytes()) as i32,
            })
    }

    /// All layers of one token (`layers × row_bytes` bytes).
    pub fn token(&self, session: SessionId, position: u32) -> Result<&[u8]> {
        self.check_live(session)?;
        let v = self.bytes.bytes(session)?;
        let tb = self.token_bytes();
        let off = position as usize * tb;
        v.get(off..off + tb).ok_or(KvError::PositionOutOfRange {
            row: 0,
            position: position as i32,
            seq_len: (v.len() / tb) as i32,
        })
    }

    /// The registrable region and its row layout (`None` for a backing without one).
    pub fn region(&self) -> Option<(RegionDesc, StoreLayout)> {
        self.bytes.region()
    }

    /// The slot of a live or importing session in the region's layout.
    pub fn slot(&self, session: SessionId) -> Option<u32> {
        self.bytes.slot(session)
    }

    /// Whether an import of `session` is in flight (rows reserved, not committed).
    pub fn is_importing(&self, session: SessionId) -> bool {
        self.importing.contains(&session)
    }

    /// Takes a slot for an import of a new session; its rows are invisible (every call naming
    /// the session gets `SessionImporting`) until [`HostStore::commit_import`]. Returns the slot.
    /// Errors: `SessionExists`, `SessionImporting`, `Unsupported` (no region), `StoreCapacity`
    /// / a capacity error (no free slot), `OutOfMemory`; nothing changes on an error.
    pub fn reserve_import(&mut self, session: SessionId) -> Result<u32> {
        self.check_new(session)?;
        self.importing
            .try_reserve(1)
            .map_err(|_| KvError::OutOfMemory {
                what: "host store import set",
                bytes: (self.importing.len() as u64 + 1) * 8,
            })?;
        let slot = self.bytes.reserve_import(session)?;
        self.importing.insert(session);
        Ok(slot)
    }

    /// An import's first `tokens` rows become the session's committed history (it is live from
    /// now on). Errors: `NoImport`, `HistoryTooLong`, `OutOfMemory`; nothing changes on an error.
    pub fn commit_import(&mut self, session: SessionId, tokens: u32) -> Result<()> {
        if !self.importing.contains(&session) {
            return Err(KvError::NoImport(session));
        }
        if tokens > MAX_HISTORY {
            return Err(KvError::HistoryTooLong {
                tokens: tokens as u64,
                max: MAX_HISTORY,
            });
        }
        reserve_entry(&mut self.live, "host store session table")?;
        self.bytes
            .commit_import(session, tokens as usize * self.token_bytes());
        self.importing.remove(&session);
        self.live.insert(session, tokens);
        Ok(())
    }

    /// Drops an import (its slot is free again; the session id was never live and may be
    /// reserved again). Errors: `NoImport`.
    pub fn abort_import(&mut self, session: SessionId) -> Result<()> {
        if !self.importing.remove(&session) {
            return Err(KvError::NoImport(session));
        }
        self.bytes.drop_import(session);
        Ok(())
    }

    /// Pins a live session's rows for an export (a transfer agent reading them): its slot is not
    /// reused, even after the session finishes, until [`HostStore::export_done`]. Errors:
    /// session errors, `Unsupported` (no region).
    pub fn export(&mut self, session: SessionId) -> Result<()> {
        self.check_live(session)?;
        self.bytes.pin_export(session)
    }

    /// One export of `session` completed. Errors: `NoExport`.
    pub fn export_done(&mut self, session: SessionId) -> Result<()> {
        if self.bytes.unpin_export(session) {
            Ok(())
        } else {
            Err(KvError::NoExport(session))
        }
    }

    /// Open exports of a session (live or finished).
    pub fn exports_of(&self, session: SessionId) -> u32 {
        self.bytes.exports_of(session)
    }

    /// Host memory the store holds, by its own accounting.
    pub fn memory(&self) -> HostMemory {
        self.bytes.memory()
    }

    /// Adds a teardown hook (a transfer agent's deregistration), run before the region's memory
    /// is unlocked and freed. Errors: `Unsupported` without a region.
    pub fn on_teardown(&mut self, hook: TeardownHook) -> Result<()> {
        self.bytes.on_teardown(hook)
    }

    /// Room to remember one more finished session, so the [`HostStore::finish`] that follows
    /// allocates nothing. Errors: `OutOfMemory`.
    pub fn reserve_finish(&mut self) -> Result<()> {
        self.finished
            .try_reserve(1)
            .map_err(|_| KvError::OutOfMemory {
                what: "host store finished-session set",
                bytes: (self.finished.len() as u64 + 1) * 8,
            })
    }

    /// Marks a session finished and drops its bytes. Errors: `UnknownSession`, `SessionFinished`,
    /// `OutOfMemory` (unless [`HostStore::reserve_finish`] reserved the room); nothing changes on
    /// an error.
    pub fn finish(&mut self, session: SessionId) -> Result<()> {
        self.check_live(session)?;
        self.reserve_finish()?;
        self.live.remove(&session);
        self.bytes.remove(session);
        self.finished.insert(session);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn append_only_with_typed_errors() {
        let mut h = HostStore::new(4, 2);
        assert_eq!(h.create(1, &[]), Err(KvError::EmptyHistory));
        assert_eq!(
            h.create(1, &[0; 7]),
            Err(KvError::RaggedRows {
                token_bytes: 8,
                actual: 7
            })
        );
        // Every u64 is a session id (fixed pages are reserved, not lent under a tagged id).
        assert_eq!(h.create(u64::MAX, &[0; 8]), Ok(1));
        assert_eq!(h.create(1, &[1; 16]), Ok(2));
        assert_eq!(h.create(1, &[1; 8]), Err(KvError::SessionExists(1)));
        assert_eq!(h.append(1, &[2; 8]), Ok(3));
        assert_eq!(h.row(1, 2, 1), Ok(&[2u8; 4][..]));
        assert!(matches!(
            h.row(1, 3, 0),
            Err(KvError::PositionOutOfRange { .. })
        ));
        assert_eq!(h.append(2, &[0; 8]), Err(KvError::UnknownSession(2)));
        h.finish(1).unwrap();
        assert_eq!(h.append(1, &[0; 8]), Err(KvError::SessionFinished(1)));
        assert_eq!(h.finish(1), Err(KvError::SessionFinished(1)));
        assert_eq!(h.create(1, &[1; 8]), Err(KvError::SessionExists(1)));
    }

    #[test]
    fn histories_stop_at_max_history_instead_of_wrapping() {
        let mut h = HostStore::new(4, 2);
        h.create(7, &[0; 8]).unwrap();
        // As if the session held MAX_HISTORY - 1 tokens (without allocating them).
        *h.live.get_mut(&7).unwrap() = MAX_HISTORY - 1;
        let too_long = Err(KvError::HistoryTooLong {
            tokens: MAX_HISTORY as u64 + 1,
            max: MAX_HISTORY,
        });
        assert_eq!(h.append(7, &[0; 16]), too_long);
        assert_eq!(h.append_device_written(7, 2), too_long);
        assert_eq!(h.len(7), Ok(MAX_HISTORY - 1), "nothing changed");
        assert_eq!(h.append(7, &[0; 8]), Ok(MAX_HISTORY));
    }
}
