//! Division by a launch-time constant without a hardware divide: the resolve kernels' page, tail
//! and top-k divisors as a round-up multiplier and shift, computed here once per launch (the
//! method of CUTLASS's `FastDivmod`, after Granlund and Montgomery, "Division by invariant integers
//! using multiplication", PLDI 1994).
//!
//! For a divisor `d ≥ 2`, with `p = 31 + ⌈log2 d⌉`, `mul = ⌈2^p / d⌉` and `shr = p − 32`, every
//! `x < 2^31` has `x / d == umulhi(x, mul) >> shr` (`umulhi` = the high 32 bits of the 64-bit
//! product); `d == 1` is `mul == 0` (the quotient is `x`). On the H200 a `u32` division by a
//! runtime value is ~12 SASS instructions (reciprocal, conversions, corrections); this is 2.

use bytemuck::{Pod, Zeroable};
use cudarc::driver::DeviceRepr;

/// One divisor: `struct KvDiv` in `kv_resolve.cu` (`kv_quo` / `kv_rem` there).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub(crate) struct KvDiv {
    /// The divisor (≥ 1).
    pub d: u32,
    /// Round-up multiplier (0 for `d == 1`).
    pub mul: u32,
    /// Right shift after the high product.
    pub shr: u32,
    /// Padding (0).
    pub pad: u32,
}

impl KvDiv {
    /// The multiplier and shift of `d` (`d == 0` gives the divisor 1: callers validate extents
    /// before a launch, and a zero never reaches a kernel).
    pub(crate) fn new(d: u32) -> Self {
        let d = d.max(1);
        if d == 1 {
            return KvDiv {
                d,
                ..KvDiv::default()
            };
        }
        let log = 32 - (d - 1).leading_zeros(); // ⌈log2 d⌉ for d ≥ 2
        let p = 31 + log;
        let mul = (1u64 << p).div_ceil(d as u64);
        KvDiv {
            d,
            mul: mul as u32,
            shr: p - 32,
            pad: 0,
        }
    }

    /// `x / d` as the device computes it (valid for `x < 2^31`).
    #[cfg(test)]
    fn quo(&self, x: u32) -> u32 {
        if self.mul == 0 {
            x
        } else {
            ((x as u64 * self.mul as u64) >> 32) as u32 >> self.shr
        }
    }
}

/// The divisors of one resolve launch: `struct KvDivs` in `kv_resolve.cu`, passed by value.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub(crate) struct KvDivs {
    /// `page_rows`.
    pub page: KvDiv,
    /// `tail_rows`.
    pub tail: KvDiv,
    /// The call's top-k width `k`.
    pub k: KvDiv,
}

// SAFETY: `KvDivs` is `repr(C)`, Pod, and matches `struct KvDivs` in kv_resolve.cu field for field.
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
}
