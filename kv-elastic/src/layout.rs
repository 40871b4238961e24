//! Layout: token rows, the per-request fixed region (hot cache, tail, scratch) and elastic pages
//! carved out of one contiguous device arena.

use crate::error::{KvError, Result};

/// The shape of one pool: row size, layers, page size and how the arena is carved.
///
/// The device arena is `arena_pages × page_rows` rows of `row_bytes` bytes, one plane per layer
/// (every layer uses the same row indices, so one resolve serves all layers of a group). It is one
/// contiguous range because sparse-attention kernels (FlashMLA) index a single array. Pages are
/// the unit of allocation: each admitted request takes [`Geometry::fixed_pages`] pages for its
/// fixed rows (hot cache, tail, scratch), and the rest is lent as elastic history pages.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Geometry {
    /// Bytes per token row per layer (656 for DeepSeek fp8 MLA, 1152 for bf16 576-dim).
    pub row_bytes: u32,
    /// Layers (arena planes); a token's KV is `layers × row_bytes` bytes.
    pub layers: u32,
    /// Rows per page (the elastic tier's unit; FlashMLA's block size is 64).
    pub page_rows: u32,
    /// Pages in the device arena.
    pub arena_pages: u32,
    /// Hot-cache rows per request (e.g. 2 × top-k).
    pub hot_rows: u32,
    /// Tail rows per request: the newest committed positions, always resident (ring buffer).
    pub tail_rows: u32,
    /// Scratch rows per request: speculative (draft) KV not yet accepted.
    pub scratch_rows: u32,
}

impl Geometry {
    /// Checks every field; `KvError::InvalidGeometry` / `ArenaTooSmall` otherwise.
    pub fn validate(&self) -> Result<()> {
        if self.row_bytes == 0 {
            return Err(KvError::InvalidGeometry("row_bytes must be > 0"));
        }
        if self.layers == 0 {
            return Err(KvError::InvalidGeometry("layers must be > 0"));
        }
        if self.page_rows == 0 {
            return Err(KvError::InvalidGeometry("page_rows must be > 0"));
        }
        if self.hot_rows == 0 {
            return Err(KvError::InvalidGeometry("hot_rows must be > 0"));
        }
        if self.tail_rows == 0 {
            return Err(KvError::InvalidGeometry(
                "tail_rows must be > 0 (the newest token is pinned there)",
            ));
        }
        if self.arena_rows() > i32::MAX as u64 {
            return Err(KvError::InvalidGeometry(
                "arena rows must fit in int32 row indices",
            ));
        }
        if self.fixed_pages() > self.arena_pages {
            return Err(KvError::ArenaTooSmall {
                arena_pages: self.arena_pages,
                needed_pages: self.fixed_pages(),
            });
        }
        Ok(())
    }

    /// Fixed rows per request: `hot_rows + tail_rows + scratch_rows`.
    pub fn fixed_rows(&self) -> u32 {
        self.hot_rows + self.tail_rows + self.scratch_rows
    }

    /// Pages one request's fixed rows take (rounded up).
    pub fn fixed_pages(&self) -> u32 {
        self.fixed_rows().div_ceil(self.page_rows)
    }

    /// Rows in the arena (`arena_pages × page_rows`).
    pub fn arena_rows(&self) -> u64 {
        self.arena_pages as u64 * self.page_rows as u64
    }

    /// Bytes of one token across all layers (`layers × row_bytes`).
    pub fn token_bytes(&self) -> usize {
        self.layers as usize * self.row_bytes as usize
    }

    /// Bytes of one arena plane (one layer).
    pub fn plane_bytes(&self) -> usize {
        self.arena_rows() as usize * self.row_bytes as usize
    }
}

/// Fills `out` with bytes derived from `(session, position, layer)` (splitmix64 stream), so a
/// row read from a wrong address (other session, position or layer) is always caught in tests.
pub fn pattern_row(session: u64, position: u32, layer: u32, out: &mut [u8]) {
    let mut state = session
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add((position as u64) << 20)
        .wrapping_add(layer as u64)
        ^ 0xD1B5_4A32_D192_ED03;
    for chunk in out.chunks_mut(8) {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        let bytes = z.to_le_bytes();
        chunk.copy_from_slice(&bytes[..chunk.len()]);
    }
}

/// Builds `tokens` committed rows for positions `start..start + tokens` of `session` in the host
/// layout (`[tokens][layers][row_bytes]`), each row filled by [`pattern_row`].
pub fn pattern_tokens(geometry: &Geometry, session: u64, start: u32, tokens: u32) -> Vec<u8> {
    let rb = geometry.row_bytes as usize;
    let mut out = vec![0u8; tokens as usize * geometry.token_bytes()];
    for t in 0..tokens {
        for l in 0..geometry.layers {
            let off = (t as usize * geometry.layers as usize + l as usize) * rb;
            pattern_row(session, start + t, l, &mut out[off..off + rb]);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn g() -> Geometry {
        Geometry {
            row_bytes: 16,
            layers: 2,
            page_rows: 4,
            arena_pages: 8,
            hot_rows: 6,
            tail_rows: 4,
            scratch_rows: 2,
        }
    }

    #[test]
    fn fixed_pages_round_up() {
        assert_eq!(g().fixed_rows(), 12);
        assert_eq!(g().fixed_pages(), 3);
        assert_eq!(g().arena_rows(), 32);
        assert_eq!(g().token_bytes(), 32);
        g().validate().unwrap();
    }

    #[test]
    fn arena_too_small_is_typed() {
        let small = Geometry {
            arena_pages: 2,
            ..g()
        };
        assert_eq!(
            small.validate(),
            Err(KvError::ArenaTooSmall {
                arena_pages: 2,
                needed_pages: 3
            })
        );
        assert!(matches!(
            Geometry {
                row_bytes: 0,
                ..g()
            }
            .validate(),
            Err(KvError::InvalidGeometry(_))
        ));
    }

    #[test]
    fn pattern_differs_by_every_key() {
        let mut a = [0u8; 16];
        let mut b = [0u8; 16];
        pattern_row(1, 2, 0, &mut a);
        for (s, p, l) in [(2, 2, 0), (1, 3, 0), (1, 2, 1)] {
            pattern_row(s, p, l, &mut b);
            assert_ne!(a, b);
        }
        pattern_row(1, 2, 0, &mut b);
        assert_eq!(a, b);
    }
}
