//! An up-front estimate of the host memory one run of the serving simulation
//! ([`crate::kv::serving::simulate_placement`]) allocates, computed from the numbers that size its
//! tables ([`SimConfig::geometry`]'s pages and rows, the batch cap, the hot cache, the trace's
//! longest request), so that a caller can refuse a geometry that would allocate until the host
//! runs out (e.g. a tiny `kv_bytes_per_token` with pages of one row: billions of pages).
//!
//! Placements run one after another and each drops its pool before the next starts, so the
//! estimate is the largest placement's. It is an estimate, not a bound: it counts the tables that
//! grow with the geometry (per page, per arena row, per admitted session) at their element sizes
//! and allows for map overhead, and leaves out what does not grow with it (the trace itself, a
//! few MiB of fixed state).

use crate::kv::config::SimConfig;
use crate::kv::trace::ArrivalTrace;

/// Host bytes per arena page of every placement: the page pool's free list, generation and state
/// (`u32 + u32 + u8`).
pub const PAGE_POOL_BYTES: u64 = 9;

/// Host bytes per page a pool lends or reserves: the lender's loan or reservation (a B-tree entry
/// of a `u32` key and an 8-byte handle, ~20 B with node overhead) and the borrower's page-map
/// entry (`i32`), rounded up.
pub const LOAN_BYTES: u64 = 28;

/// Host bytes per page the fully resident placement holds for a running request (its handle).
pub const RESIDENT_HANDLE_BYTES: u64 = 8;

/// Host bytes per hot-cache row of an admitted session (CLOCK state: slot → position `i32`,
/// reference bit, stamp `u64`).
pub const HOT_ROW_BYTES: u64 = 13;

/// Host bytes per history token of an admitted session, rounded up: the hot cache's position →
/// slot table (`i32`), the host store's 1-byte row, the selection generator's bit set, the page
/// map's share.
pub const HISTORY_TOKEN_BYTES: u64 = 10;

/// Host bytes per top-k pick of a session in one step (picks, resolved indices, the generator's
/// current set: three `i32`).
pub const PICK_BYTES: u64 = 12;

/// The estimate, by part (bytes). [`MemoryEstimate::total`] is what a caller compares with its
/// bound; [`MemoryEstimate::largest_part`] says which flags would bring it down.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryEstimate {
    /// Pages in the arena (`budget_rows / page_rows`).
    pub arena_pages: u64,
    /// Page tables: the page pool, loans and reservations, resident handles, bytes.
    pub page_bytes: u64,
    /// The pools' arena (1-byte rows, one layer: `arena_pages × page_rows` bytes).
    pub arena_bytes: u64,
    /// Sessions admitted at once at most (the batch cap, the arena's room for fixed rows and the
    /// trace's requests, whichever is smallest).
    pub sessions: u64,
    /// Per-session state of those sessions (hot cache, history tables, picks), bytes.
    pub session_bytes: u64,
}

/// What dominates a [`MemoryEstimate`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    /// Page tables and the arena: too many pages (budget ÷ token bytes ÷ page rows).
    Pages,
    /// Per-session state: too many sessions × hot rows / history.
    Sessions,
}

impl MemoryEstimate {
    /// Bytes in all (saturating).
    pub fn total(&self) -> u64 {
        self.page_bytes
            .saturating_add(self.arena_bytes)
            .saturating_add(self.session_bytes)
    }

    /// The part that holds the most bytes.
    pub fn largest_part(&self) -> Part {
        if self.page_bytes.saturating_add(self.arena_bytes) >= self.session_bytes {
            Part::Pages
        } else {
            Part::Sessions
        }
    }
}

/// Estimates the host bytes the largest placement of a simulation of `trace` under `cfg` allocates
/// (see the module doc). Any configuration is accepted (the geometry need not be valid; products
/// saturate), so a caller can check this before [`SimConfig::validate`] or after it.
pub fn estimate(cfg: &SimConfig, trace: &ArrivalTrace) -> MemoryEstimate {
    let g = cfg.geometry();
    let pages = g.arena_pages as u64;
    let fixed_pages = (g.fixed_pages() as u64).max(1);
    let history = trace
        .requests
        .iter()
        .map(|q| q.input_length as u64 + q.output_length as u64)
        .max()
        .unwrap_or(0);
    let sessions = (cfg.max_batch as u64)
        .min(pages / fixed_pages)
        .min(trace.requests.len() as u64);
    // Pages a pool ever lends (at most `chunk_pages` per step) or reserves for fixed rows.
    let lent = cfg
        .max_steps
        .saturating_mul(cfg.chunk_pages as u64)
        .saturating_add(sessions.saturating_mul(fixed_pages))
        .min(pages);
    let pool_pages = pages
        .saturating_mul(PAGE_POOL_BYTES)
        .saturating_add(lent.saturating_mul(LOAN_BYTES));
    let resident_pages = pages.saturating_mul(PAGE_POOL_BYTES + RESIDENT_HANDLE_BYTES);
    let per_session = (g.hot_rows as u64 * HOT_ROW_BYTES)
        .saturating_add(history.saturating_mul(HISTORY_TOKEN_BYTES))
        .saturating_add(cfg.selection.top_k as u64 * PICK_BYTES)
        .saturating_add(fixed_pages.saturating_mul(LOAN_BYTES));
    MemoryEstimate {
        arena_pages: pages,
        page_bytes: pool_pages.max(resident_pages),
        arena_bytes: g.arena_rows(),
        sessions,
        session_bytes: sessions.saturating_mul(per_session),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_scenario_is_small_and_one_row_pages_of_tiny_tokens_are_not() {
        let trace = ArrivalTrace::synthetic(2000, 3.0, 1);
        let e = estimate(&SimConfig::default(), &trace);
        assert!(e.total() < 256 << 20, "{e:?}");
        // 24 GiB of 13-byte tokens in pages of one row: ~2e9 pages, ~18 GB of page pool alone.
        let big = SimConfig {
            kv_bytes_per_token: 13,
            page_rows: 1,
            ..SimConfig::default()
        };
        let e = estimate(&big, &trace);
        assert_eq!(e.arena_pages, (24u64 << 30) / 13);
        assert!(e.total() > e.arena_pages * PAGE_POOL_BYTES, "{e:?}");
        assert_eq!(e.largest_part(), Part::Pages);
    }

    #[test]
    fn huge_hot_caches_count_per_admitted_session() {
        let trace = ArrivalTrace::synthetic(2000, 3.0, 1);
        let cfg = SimConfig {
            kv_bytes_per_token: 1,
            hbm_budget_bytes: 2_000_000_000,
            hot_rows: 16_000_000,
            ..SimConfig::default()
        };
        let e = estimate(&cfg, &trace);
        // 2e9 rows hold 124 sessions of 16,000,064 fixed rows (250,001 pages of 64).
        assert_eq!(e.sessions, 124);
        assert!(e.session_bytes >= 124 * 16_000_000 * HOT_ROW_BYTES, "{e:?}");
        assert_eq!(e.largest_part(), Part::Sessions);
    }
}
