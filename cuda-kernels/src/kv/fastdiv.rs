//! Division by a launch-time constant without a hardware divide: the resolve kernels' page, tail
//! and top-k divisors as a multiplier and shift, computed here once per launch (Granlund and
//! Montgomery, "Division by invariant integers using multiplication", PLDI 1994, the 33-bit
//! multiplier of their figure 4.1; CUTLASS's `FastDivmod` is the same idea).
//!
//! For a divisor `d ≥ 1`, with `l = ⌈log2 d⌉`, `mul = ⌊2^32 (2^l − d) / d⌋ + 1` and `shr = l`, every
//! `x < 2^31` has `x / d == (umulhi(x, mul) + x) >> shr` (`umulhi` = the high 32 bits of the 64-bit
//! product; the sum stays below 2^32 there). `d == 1` is `mul == 1, shr == 0`, so the device needs
//! no select; a `d > 2^31` is `mul == 0, shr == 31` (every quotient 0, no shift by 32). On the H200 a `u32` division by a runtime value is ~12 SASS instructions
//! (reciprocal, conversions, corrections); this is 3.

use bytemuck::{Pod, Zeroable};
use cudarc::driver::DeviceRepr;

use super::abi::{KV_FAST_MAX_ROWS, KV_FAST_PER};

/// One divisor: `struct KvDiv` in `kv_abi.cuh` (`kv_quo` / `kv_rem` there).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub(crate) struct KvDiv {
    /// The divisor (≥ 1).
    pub d: u32,
    /// The low 32 bits of the 33-bit multiplier `2^32 + mul`.
    pub mul: u32,
    /// Right shift after the sum.
    pub shr: u32,
    /// Padding (0).
    pub pad: u32,
}

impl KvDiv {
    /// The multiplier and shift of `d` (`d == 0` gives the divisor 1: callers validate extents
    /// before a launch, and a zero never reaches a kernel).
    pub(crate) fn new(d: u32) -> Self {
        let d = d.max(1);
        if d > 1 << 31 {
            // every x < 2^31 has quotient 0: (0 + x) >> 31 (no shift by 32 on the device)
            return KvDiv {
                d,
                mul: 0,
                shr: 31,
                pad: 0,
            };
        }
        let l = 32 - (d - 1).leading_zeros(); // ⌈log2 d⌉ (0 for d == 1, at most 31 here)
        let mul = ((1u64 << 32) * ((1u64 << l) - d as u64)) / d as u64 + 1;
        KvDiv {
            d,
            mul: mul as u32,
            shr: l,
            pad: 0,
        }
    }

    /// `x / d` as the device computes it (valid for `x < 2^31`).
    #[cfg(test)]
    fn quo(&self, x: u32) -> u32 {
        let hi = ((x as u64 * self.mul as u64) >> 32) as u32;
        (hi + x) >> self.shr
    }
}

/// The launch-time constants of one resolve launch: `struct KvDivs` in `kv_abi.cuh`, passed by
/// value: the divisors, the batch shape the lean kernels guess their picks from, and the largest
/// fixed page whose rows fit an `int`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub(crate) struct KvDivs {
    /// `page_rows`.
    pub page: KvDiv,
    /// `tail_rows`.
    pub tail: KvDiv,
    /// The call's output row width `k` (top-k × positions per block id).
    pub k: KvDiv,
    /// Positions per block id (1 for position picks).
    pub blk: KvDiv,
    /// Query rows per entry of a uniform batch (`rows = m × sessions`, `1 ≤ m ≤ 64`, `m × k ≤
    /// 4 × block`), 0 otherwise.
    pub m: u32,
    /// Picks per thread of such an entry: `min(4, ⌈m × k / block⌉)`.
    pub gper: u32,
    /// `(2^31 − 1 − (page_rows − 1)) / page_rows`: a fixed page above it (or negative) has a row
    /// that does not fit an `int`.
    pub fp_max: u32,
    /// Padding (0).
    pub pad: u32,
}

impl KvDivs {
    /// The constants of a launch of `block` threads per entry over `sessions` entries and `rows`
    /// query rows of `k` picks each.
    pub(crate) fn new(
        page_rows: u32,
        tail_rows: u32,
        k: u32,
        rows: u32,
        sessions: u32,
        block: u32,
    ) -> Self {
        let m = if rows == sessions {
            1
        } else if sessions != 0 && rows.is_multiple_of(sessions) {
            rows / sessions
        } else {
            0
        };
        let fits = (1..=KV_FAST_MAX_ROWS).contains(&m)
            && m as u64 * k as u64 <= KV_FAST_PER as u64 * block as u64;
        let m = if fits { m } else { 0 };
        let gper = (m as u64 * k as u64)
            .div_ceil(block.max(1) as u64)
            .min(KV_FAST_PER as u64) as u32;
        let pr = page_rows.max(1);
        KvDivs {
            page: KvDiv::new(page_rows),
            tail: KvDiv::new(tail_rows),
            k: KvDiv::new(k),
            blk: KvDiv::new(1),
            m,
            gper,
            // 0 when even page 0's last row overflows (page_rows > 2^31)
            fp_max: (i32::MAX as u32).saturating_sub(pr - 1) / pr,
            pad: 0,
        }
    }

    /// The same constants for block-id picks of `block` positions each (0 or 1: positions).
    pub(crate) fn with_block(self, block: u32) -> Self {
        KvDivs {
            blk: KvDiv::new(block),
            ..self
        }
    }
}

// SAFETY: `KvDivs` is `repr(C)`, Pod, and matches `struct KvDivs` in kv_abi.cuh field for field.
unsafe impl DeviceRepr for KvDivs {}

#[cfg(test)]
mod tests {
    use super::*;

    /// The device formula equals the division for every divisor shape the kernels see (small,
    /// powers of two and their neighbours, large) at the edges and on a sweep of `x < 2^31`.
    #[test]
    fn quotients_equal_division_below_2_pow_31() {
        let mut ds: Vec<u32> = (1..=4096).collect();
        for s in 12..32 {
            let p = 1u32 << s;
            ds.extend([p - 1, p, p + 1]);
        }
        ds.extend([u32::MAX, 0x8000_0001, 3_000_000_007]);
        let top = (1u32 << 31) - 1;
        for &d in &ds {
            let v = KvDiv::new(d);
            let mut xs: Vec<u32> =
                vec![0, 1, d.wrapping_sub(1), d, d.wrapping_add(1), top, top - 1];
            xs.extend((1..64u32).map(|i| d.wrapping_mul(i).wrapping_sub(1) & top));
            // a multiplicative sweep over [0, 2^31)
            let mut x = 7u64;
            while x < top as u64 {
                xs.push(x as u32);
                x = x * 3 / 2 + 1;
            }
            for &x in xs.iter().filter(|&&x| x <= top) {
                assert_eq!(v.quo(x), x / d, "{x} / {d} (mul {}, shr {})", v.mul, v.shr);
            }
        }
        assert_eq!(KvDiv::new(0), KvDiv::new(1));
        assert_eq!(KvDiv::new(64).quo(200), 3);
    }

    /// The batch shape the lean kernels guess from: decode, uniform speculative steps, and the
    /// shapes that must not guess (ragged, too many rows, too many picks for the block).
    #[test]
    fn batch_shape_and_fixed_page_bound() {
        let v = KvDivs::new(64, 128, 2048, 64, 64, 512);
        assert_eq!((v.m, v.gper), (1, 4));
        assert_eq!(KvDivs::new(64, 128, 2048, 64, 64, 1024).gper, 2);
        assert_eq!(KvDivs::new(64, 128, 256, 192, 64, 512).m, 3);
        assert_eq!(KvDivs::new(64, 128, 256, 192, 64, 512).gper, 2);
        assert_eq!(KvDivs::new(64, 128, 2048, 65, 64, 512).m, 0); // ragged
        assert_eq!(KvDivs::new(64, 128, 2048, 128, 64, 512).m, 0); // 4096 picks > 4 × 512
        assert_eq!(KvDivs::new(64, 128, 1, 65 * 2, 2, 512).m, 0); // 65 rows per entry
        assert_eq!(KvDivs::new(64, 128, 2049, 1, 1, 512).m, 0);
        assert_eq!(KvDivs::new(64, 128, 0, 0, 0, 512).gper, 0);
        for pr in [
            1u32,
            2,
            3,
            64,
            1000,
            1 << 20,
            1 << 30,
            (1 << 31) - 1,
            1 << 31,
        ] {
            let fp_max = KvDivs::new(pr, 1, 1, 1, 1, 512).fp_max as i64;
            let last = |v: i64| v * pr as i64 + pr as i64 - 1;
            assert!(
                last(fp_max) <= i32::MAX as i64 && last(fp_max + 1) > i32::MAX as i64,
                "{pr}"
            );
        }
        // Pages over 2^31 rows: no page fits, and the bound saturates at 0 instead of wrapping
        // (such dims fail `KvDims::validate`: arena rows stay below 2^31).
        assert_eq!(KvDivs::new((1 << 31) + 1, 1, 1, 1, 1, 512).fp_max, 0);
        assert_eq!(KvDivs::new(u32::MAX, 1, 1, 1, 1, 512).fp_max, 0);
    }
}
