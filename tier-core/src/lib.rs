//! # tier-core
//!
//! The mechanisms every tierkit tier shares, in plain Rust with no GPU
//! dependency:
//! - [`PagePool`]: fixed-capacity pages (or slots) in one [`Tier`], O(1)
//!   alloc/free, generation-tagged [`PageHandle`]s (a stale handle is an
//!   error, never an alias);
//! - [`PageMap`]: a logical-to-physical block table, one flat `i32` table
//!   (`-1` = not resident) you can copy to the GPU as-is, with a generation
//!   that rejects planned moves when the map moved under them;
//! - [`Lender`]: revocable loans of free pages to borrowers (requests),
//!   reclaimed under a pluggable [`ReclaimPolicy`] and handed back in bounded
//!   chunks, always through an [`EpochFence`];
//! - [`EpochFence`] + [`Retired`]: epoch-based reader fences; a GPU completion
//!   signal ([`CompletionSignal`]) stands in for a CPU reader;
//! - [`DecayingCounters`]: EMA heat counters with a half-life in steps;
//! - [`alloc`]: fallible allocation for tables sized by caller input
//!   ([`CoreError::AllocationFailed`] instead of an abort);
//! - [`read_json`], [`read_capped`], [`CappedReader`]: bounded reads of side-input files
//!   (configs, maps, dumps, reports): a size cap, never an unbounded read.
//!
//! Errors are one [`CoreError`] enum (file reads: [`ReadError`]); no call panics on caller input, and a
//! failed call changes nothing. See `DESIGN.md` for the fence and the loan
//! lifecycle.
//!
//! ```
//! use tier_core::{BorrowerId, Lender, PageMap, Tier};
//!
//! let mut lender = Lender::new(Tier::DeviceHbm, 8)?;
//! let req = BorrowerId(42);
//! let mut map = PageMap::new(4)?; // the request's block table
//! for loan in lender.lend(req, &[0, 1, 2, 3])? {
//!     map.set(loan.logical, loan.handle.page())?;
//! }
//! let fence = lender.shared_fence();
//! let reader = fence.enter();           // a reader sees the table
//! for loan in lender.reclaim(2)? {     // pressure: oldest pages first
//!     map.clear(loan.logical)?;          // unmap before collecting
//! }
//! assert_eq!(lender.collect(), 0);       // the reader may still use them
//! drop(reader);
//! assert_eq!(lender.collect(), 2);       // now they are free again
//! assert_eq!(map.table(), &[-1, -1, 2, 3]);
//! # Ok::<(), tier_core::CoreError>(())
//! ```

#![warn(missing_docs)]

pub mod alloc;
mod capped;
mod ema;
mod error;
mod fence;
mod loan;
mod map;
mod page;
mod pool;
mod sync;

pub use capped::{open_capped, read_capped, read_json, show_bytes, CappedReader, ReadError};
pub use ema::DecayingCounters;
pub use error::{CoreError, Result};
pub use fence::{
    CompletionSignal, EpochFence, FlagSignal, ReaderGuard, Retired, DEFAULT_READER_SLOTS,
};
pub use loan::{BorrowerId, Lender, Loan, ProportionalOldestFirst, ReclaimPolicy};
pub use map::{PageMap, MAX_GENERATION, MAX_MAPPED_PAGE, NOT_RESIDENT};
pub use page::{PageHandle, PageId, Tier};
pub use pool::PagePool;
