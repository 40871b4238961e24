//! Which resolve kernel a call launches. The library always runs [`ResolveEngine::Auto`]; the
//! other variants are a test hook (feature `test-hooks`): the tests run every kernel on the same
//! inputs to check they give identical results.

use super::abi::{KV_FAST_PER, KV_LEAN512_BLOCK};

/// The resolve kernels. All implement the same contract (`DESIGN.md`, KV resolve kernel contract)
/// and give identical outputs, plans, stats and table updates.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
#[cfg_attr(not(feature = "test-hooks"), allow(dead_code))]
pub enum ResolveEngine {
    /// `tierkit_kv_resolve`: every entry through the classic path (three passes over the picks,
    /// victims by one warp). What `Auto` launches for tables over the lean kernels' shared-memory
    /// limits (hot rows over 65,536 or fixed pages over 4,096 per slot).
    Classic,
    /// `tierkit_kv_resolve_lean`, 1024 threads per entry.
    Lean,
    /// `tierkit_kv_resolve_lean512`, 512 threads per entry.
    Lean512,
    /// The library's choice: [`ResolveEngine::Lean512`] for a decode-shaped call (no more query
    /// rows than sessions, `k ≤ 2048`: every entry fits its 512 threads), else
    /// [`ResolveEngine::Lean`]. Chosen at launch from the call's host-side sizes, so a captured
    /// graph keeps its choice. Entries too large for the lean path (over 4 picks per thread or 64
    /// query rows) take the classic path inside the lean kernels.
    #[default]
    Auto,
}

/// Most picks of one entry the 512-thread lean kernel takes on its own path.
const KV_LEAN512_MAX_PICKS: u32 = KV_FAST_PER * KV_LEAN512_BLOCK;

#[cfg_attr(not(feature = "test-hooks"), allow(dead_code))]
impl ResolveEngine {
    /// Every concrete engine (tests run them side by side; [`ResolveEngine::Auto`] launches one).
    pub const ALL: [ResolveEngine; 3] = [
        ResolveEngine::Classic,
        ResolveEngine::Lean,
        ResolveEngine::Lean512,
    ];

    /// The concrete engine a call of `rows` query rows over `sessions` entries with `k` picks per
    /// row launches: `Auto` decides, every other engine is itself.
    pub fn for_call(self, rows: u32, sessions: u32, k: u32) -> ResolveEngine {
        match self {
            ResolveEngine::Auto if rows <= sessions && k <= KV_LEAN512_MAX_PICKS => {
                ResolveEngine::Lean512
            }
            ResolveEngine::Auto => ResolveEngine::Lean,
            e => e,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_takes_lean512_for_decode_shaped_calls_only() {
        let auto = ResolveEngine::default();
        assert_eq!(auto, ResolveEngine::Auto);
        assert_eq!(auto.for_call(64, 64, 2048), ResolveEngine::Lean512);
        assert_eq!(auto.for_call(3, 4, 16), ResolveEngine::Lean512);
        assert_eq!(auto.for_call(128, 64, 2048), ResolveEngine::Lean); // speculative rows
        assert_eq!(auto.for_call(64, 64, 4096), ResolveEngine::Lean);
        for e in ResolveEngine::ALL {
            assert_eq!(e.for_call(128, 64, 4096), e);
        }
    }
}
