//! Fallible allocation for tables sized by caller input: each helper returns
//! [`CoreError::AllocationFailed`] (naming what was being allocated and how many bytes) where
//! `vec![v; n]`, `to_vec` or `extend_from_slice` would abort the process when the allocator
//! refuses, or panic on a size overflow. Built on the standard library's `try_reserve`;
//! the tiers map the error to their own `OutOfMemory`.

use crate::error::{CoreError, Result};

/// Bytes of `n` values of `T`, saturated at `u64::MAX` (for error messages).
fn bytes_of<T>(n: usize) -> u64 {
    (n as u64).saturating_mul(std::mem::size_of::<T>() as u64)
}

/// Reserves room for at least `additional` more elements in `v`, growing as `Vec::reserve` does
/// (amortised doubling, so appends in small steps stay O(1) each; from empty, about exactly
/// `additional`); where the doubled buffer cannot be had, exactly what is needed. Nothing changes
/// on an error.
///
/// # Errors
/// [`CoreError::AllocationFailed`] naming `what` and the bytes the grown buffer needs, when the
/// size overflows or the allocator refuses.
pub fn try_reserve<T>(v: &mut Vec<T>, additional: usize, what: &'static str) -> Result<()> {
    v.try_reserve(additional)
        .or_else(|_| v.try_reserve_exact(additional))
        .map_err(|_| CoreError::AllocationFailed {
            what,
            bytes: bytes_of::<T>(v.len().saturating_add(additional)),
        })
}

/// A `Vec` of `n` copies of `v`.
///
/// # Errors
/// [`CoreError::AllocationFailed`] as for [`try_reserve`].
pub fn try_filled<T: Clone>(n: usize, v: T, what: &'static str) -> Result<Vec<T>> {
    let mut out = Vec::new();
    try_reserve(&mut out, n, what)?;
    out.resize(n, v);
    Ok(out)
}

/// A copy of `s` in a new `Vec`.
///
/// # Errors
/// [`CoreError::AllocationFailed`] as for [`try_reserve`].
pub fn try_copied<T: Clone>(s: &[T], what: &'static str) -> Result<Vec<T>> {
    let mut out = Vec::new();
    try_reserve(&mut out, s.len(), what)?;
    out.extend_from_slice(s);
    Ok(out)
}

/// The items of `it` in a new `Vec` of exactly `n` elements' capacity (at most `n` are taken).
///
/// # Errors
/// [`CoreError::AllocationFailed`] as for [`try_reserve`].
pub fn try_collect<T>(
    n: usize,
    it: impl IntoIterator<Item = T>,
    what: &'static str,
) -> Result<Vec<T>> {
    let mut out = Vec::new();
    try_reserve(&mut out, n, what)?;
    out.extend(it.into_iter().take(n));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_past_the_address_space_are_errors_not_aborts() {
        // More than isize::MAX bytes: refused by the capacity check, before the allocator.
        let e = try_filled(usize::MAX / 2, 0u64, "table").unwrap_err();
        assert_eq!(
            e,
            CoreError::AllocationFailed {
                what: "table",
                bytes: u64::MAX
            }
        );
        assert!(e.to_string().contains("table"), "{e}");
        let mut v = vec![1u32, 2];
        assert!(try_reserve(&mut v, usize::MAX, "v").is_err());
        assert_eq!(v, [1, 2]);
        assert_eq!(try_copied(&[3u8, 4], "c").unwrap(), [3, 4]);
        assert_eq!(try_collect(2, 0..10, "it").unwrap(), [0, 1]);
        assert_eq!(try_filled(3, 7i32, "t").unwrap(), [7, 7, 7]);
    }
}
