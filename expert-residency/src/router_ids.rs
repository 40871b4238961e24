//! A router's top-k expert ids as engines hand them over: `[tokens, k]` of `u32`, `i32` or
//! `i64` (vLLM and SGLang `topk_ids` are int32, torch `topk` indices int64), row `t` starting at
//! element `t * row_stride` (a view into a wider array: llama.cpp's `ffn_moe_topk` tensor has
//! `row_stride = nb[1] / sizeof(int32_t)`). [`crate::PickCounters::record_layer_strided`] counts
//! them in place, with no conversion and no allocation per step; the C and Python entry points
//! use the same view.

use crate::error::{ExpertError, Result};

/// Elements a strided `[rows, k]` view spans: `(rows - 1) * row_stride + k` (0 for no rows), or
/// `None` on overflow.
pub fn strided_len(rows: usize, k: usize, row_stride: usize) -> Option<usize> {
    match rows {
        0 => Some(0),
        r => (r - 1).checked_mul(row_stride)?.checked_add(k),
    }
}

/// A strided `[tokens, k]` view of expert ids (`T`: any integer type convertible to `i64`:
/// `u8`..`u32`, `i8`..`i64`).
#[derive(Clone, Copy, Debug)]
pub struct RouterIds<'a, T> {
    ids: &'a [T],
    tokens: usize,
    k: usize,
    row_stride: usize,
}

impl<'a, T: Copy + Into<i64>> RouterIds<'a, T> {
    /// `tokens` rows of `k` ids, row `t` at `ids[t * row_stride..][..k]`.
    ///
    /// Errors: [`ExpertError::InvalidRouterIds`] when `row_stride < k` (with rows) or `ids` is
    /// shorter than the view spans ([`strided_len`]).
    pub fn new(ids: &'a [T], tokens: usize, k: usize, row_stride: usize) -> Result<Self> {
        if tokens > 0 && k > 0 {
            if row_stride < k {
                return Err(ExpertError::InvalidRouterIds(format!(
                    "row_stride {row_stride} is below k {k}"
                )));
            }
            let need = strided_len(tokens, k, row_stride).ok_or_else(|| {
                ExpertError::InvalidRouterIds(format!(
                    "{tokens} rows of stride {row_stride} overflow"
                ))
            })?;
            if ids.len() < need {
                return Err(ExpertError::InvalidRouterIds(format!(
                    "ids hold {} elements, {tokens} rows of stride {row_stride} and width {k} \
                     need {need}",
                    ids.len()
                )));
            }
        }
        Ok(RouterIds {
            ids,
            tokens,
            k,
            row_stride,
        })
    }

    /// A contiguous `[ids.len() / k, k]` view.
    ///
    /// Errors: [`ExpertError::InvalidRouterIds`] for `k == 0` with ids, or a length that is not
    /// a multiple of `k`.
    pub fn contiguous(ids: &'a [T], k: usize) -> Result<Self> {
        if k == 0 {
            return match ids.len() {
                0 => Self::new(ids, 0, 0, 0),
                n => Err(ExpertError::InvalidRouterIds(format!("{n} ids with k = 0"))),
            };
        }
        if !ids.len().is_multiple_of(k) {
            return Err(ExpertError::InvalidRouterIds(format!(
                "{} ids are not whole rows of k = {k}",
                ids.len()
            )));
        }
        Self::new(ids, ids.len() / k, k, k)
    }

    /// Rows (tokens).
    pub fn tokens(&self) -> usize {
        self.tokens
    }

    /// Ids per row (top-k).
    pub fn k(&self) -> usize {
        self.k
    }

    /// The rows, in token order.
    pub fn rows(&self) -> impl Iterator<Item = &'a [T]> + '_ {
        let (ids, k, s) = (self.ids, self.k, self.row_stride);
        (0..if k == 0 { 0 } else { self.tokens }).map(move |t| &ids[t * s..][..k])
    }

    /// Checks every id against `0..experts`.
    ///
    /// Errors: [`ExpertError::ExpertIdOutOfRange`] naming the first bad id's `[token, column]`.
    pub fn check(&self, experts: u32) -> Result<()> {
        for (t, row) in self.rows().enumerate() {
            for (j, &id) in row.iter().enumerate() {
                let id: i64 = id.into();
                if !(0..experts as i64).contains(&id) {
                    return Err(ExpertError::ExpertIdOutOfRange {
                        at: format!("[{t}, {j}]"),
                        id,
                        experts,
                    });
                }
            }
        }
        Ok(())
    }

    /// The ids as `u32` picks, row after row (`out` cleared first, left empty on error).
    ///
    /// Errors: as [`RouterIds::check`].
    pub fn gather_into(&self, experts: u32, out: &mut Vec<u32>) -> Result<()> {
        out.clear();
        self.check(experts)?;
        out.reserve(self.tokens * self.k);
        for row in self.rows() {
            out.extend(row.iter().map(|&id| Into::<i64>::into(id) as u32));
        }
        Ok(())
    }
}

/// The error for an id outside `0..experts` at `at`.
pub(crate) fn out_of_range(id: i64, experts: u32, at: impl FnOnce() -> String) -> ExpertError {
    match u32::try_from(id) {
        Ok(expert) => ExpertError::ExpertOutOfRange { expert, experts },
        Err(_) => ExpertError::ExpertIdOutOfRange {
            at: at(),
            id,
            experts,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strided_views_check_and_gather() {
        // Two tokens, top-2, row stride 3 (a view into [tokens, 3]).
        let ids: [i32; 5] = [1, 2, 99, 3, 0];
        let v = RouterIds::new(&ids, 2, 2, 3).unwrap();
        let mut out = Vec::new();
        v.gather_into(4, &mut out).unwrap();
        assert_eq!(out, [1, 2, 3, 0]);
        let bad: [i64; 5] = [1, 2, 0, -1, 0];
        let e = RouterIds::new(&bad, 2, 2, 3)
            .unwrap()
            .gather_into(4, &mut out)
            .unwrap_err();
        assert!(
            e.to_string().contains("[1, 0]") && e.to_string().contains("-1"),
            "{e}"
        );
        assert!(out.is_empty());
        assert!(RouterIds::new(&ids, 2, 2, 1).is_err()); // stride < k
        assert!(RouterIds::new(&ids, 3, 2, 3).is_err()); // too short
        assert!(RouterIds::<u32>::contiguous(&[1, 2, 3], 2).is_err());
        assert_eq!(RouterIds::<u32>::contiguous(&[], 0).unwrap().tokens(), 0);
        assert_eq!(strided_len(usize::MAX, 2, 2), None);
        let e = RouterIds::<u32>::contiguous(&[5], 1)
            .unwrap()
            .check(4)
            .unwrap_err();
        assert!(
            matches!(&e, ExpertError::ExpertIdOutOfRange { id: 5, experts: 4, at } if at == "[0, 0]"),
            "{e}"
        );
    }
}
