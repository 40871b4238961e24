//! CPU references of the counting kernels (`tierkit_count_i32` / `_i64`, their controlled forms
//! `tierkit_count_ctl_i32` / `_i64`, `tierkit_fold_stripes`).

use super::{check_target, CountControl, TopkId, TopkShape};
use crate::error::{CudaError, Result};

/// CPU reference of the counting kernel: adds the picks of `ids` (shape `shape`, covering layers
/// `layer0 .. layer0 + shape.layers`) into `table` (`[layers][experts]` u32, wrapping adds) and
/// returns the number of rejected picks (id outside `0..experts`).
///
/// # Errors
/// [`CudaError::Shape`] if `ids` or `table` have the wrong length, [`CudaError::OutOfRange`] if
/// the layer range does not fit in `layers`. Nothing is written on error.
pub fn count_picks_cpu<I: TopkId>(
    ids: &[I],
    shape: TopkShape,
    layer0: u32,
    layers: u32,
    experts: u32,
    table: &mut [u32],
) -> Result<u32> {
    count_picks_cpu_ctl(
        ids,
        shape,
        layer0,
        layers,
        experts,
        CountControl::ALL,
        table,
    )
}

/// CPU reference of the controlled counting kernels (`tierkit_count_ctl_i32` / `_i64`, what
/// [`crate::PickCounterGpu`] launches): as [`count_picks_cpu`], but a pick of token row `t`
/// (flat index `(l * tokens + t) * k + j`) is counted only if `control.enabled` and
/// `t < control.valid_tokens`; skipped picks are neither counted nor rejected. Returns the
/// rejected picks among the counted rows.
///
/// # Errors
/// As [`count_picks_cpu`]; nothing is written on error.
pub fn count_picks_cpu_ctl<I: TopkId>(
    ids: &[I],
    shape: TopkShape,
    layer0: u32,
    layers: u32,
    experts: u32,
    control: CountControl,
    table: &mut [u32],
) -> Result<u32> {
    check_target(shape, layer0, layers)?;
    if ids.len() as u64 != shape.picks() {
        return Err(CudaError::Shape {
            what: "topk_ids",
            expected: shape.picks(),
            got: ids.len() as u64,
        });
    }
    let want = layers as u64 * experts as u64;
    if table.len() as u64 != want {
        return Err(CudaError::Shape {
            what: "count table (layers * experts)",
            expected: want,
            got: table.len() as u64,
        });
    }
    let per_layer = shape.tokens as usize * shape.k as usize;
    let k = shape.k as usize;
    let mut rejected = 0u32;
    for (i, id) in ids.iter().enumerate() {
        let layer = layer0 as usize + i / per_layer;
        let token = (i % per_layer) / k;
        if !control.counts_token(token as u32) {
            continue;
        }
        let e = id.as_i64();
        if e >= 0 && e < experts as i64 {
            let c = &mut table[layer * experts as usize + e as usize];
            *c = c.wrapping_add(1);
        } else {
            rejected = rejected.wrapping_add(1);
        }
    }
    Ok(rejected)
}

/// CPU reference of `tierkit_fold_stripes`: `table[l][e] += Σ_s stripes[l][s][e]` (wrapping
/// u32), then every stripe cell is zeroed. `stripes`: `[layers][num_stripes][experts]`, `table`:
/// `[layers][experts]` (the rejected word, if present after the table, is left alone).
///
/// # Errors
/// [`CudaError::Shape`] if the slices do not match the geometry.
pub fn fold_stripes_cpu(
    stripes: &mut [u32],
    num_stripes: u32,
    layers: u32,
    experts: u32,
    table: &mut [u32],
) -> Result<()> {
    let (s, l, e) = (num_stripes as usize, layers as usize, experts as usize);
    if stripes.len() as u64 != l as u64 * s as u64 * e as u64 {
        return Err(CudaError::Shape {
            what: "stripes (layers * num_stripes * experts)",
            expected: l as u64 * s as u64 * e as u64,
            got: stripes.len() as u64,
        });
    }
    if table.len() < l * e {
        return Err(CudaError::Shape {
            what: "table (layers * experts)",
            expected: (l * e) as u64,
            got: table.len() as u64,
        });
    }
    for layer in 0..l {
        for stripe in 0..s {
            let row = &mut stripes[(layer * s + stripe) * e..(layer * s + stripe + 1) * e];
            for (t, c) in table[layer * e..(layer + 1) * e]
                .iter_mut()
                .zip(row.iter_mut())
            {
                *t = t.wrapping_add(*c);
                *c = 0;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_reference_counts_and_rejects() {
        let shape = TopkShape::step(2, 2, 2);
        let ids: Vec<i64> = vec![0, 1, 1, 3, 2, -1, 7, 2];
        let mut table = vec![0u32; 2 * 4];
        let rej = count_picks_cpu(&ids, shape, 0, 2, 4, &mut table).unwrap();
        assert_eq!(rej, 2);
        assert_eq!(table, vec![1, 2, 0, 1, 0, 0, 2, 0]);
    }

    #[test]
    fn cpu_reference_layer_offset_and_errors_leave_table() {
        let mut table = vec![0u32; 3 * 4];
        let ids: Vec<i32> = vec![3, 3, 0];
        assert_eq!(
            count_picks_cpu(&ids, TopkShape::layer(3, 1), 2, 3, 4, &mut table).unwrap(),
            0
        );
        assert_eq!(&table[8..], &[1, 0, 0, 2]);
        let before = table.clone();
        assert!(matches!(
            count_picks_cpu(&ids, TopkShape::layer(3, 1), 3, 3, 4, &mut table),
            Err(CudaError::OutOfRange { .. })
        ));
        assert!(matches!(
            count_picks_cpu(&ids, TopkShape::layer(2, 1), 0, 3, 4, &mut table),
            Err(CudaError::Shape { .. })
        ));
        assert!(matches!(
            count_picks_cpu(&ids, TopkShape::layer(3, 1), 0, 3, 4, &mut table[..5]),
            Err(CudaError::Shape { .. })
        ));
        assert_eq!(table, before);
    }

    #[test]
    fn cpu_reference_controls_skip_disabled_and_padding_rows() {
        // 2 layers x 3 tokens x top-2, 4 experts; token 2 of each layer is padding
        let shape = TopkShape::step(2, 3, 2);
        let ids: Vec<i32> = vec![0, 1, 2, -1, 3, 3, /* layer 1 */ 1, 1, 9, 0, 2, 2];
        let valid2 = CountControl {
            enabled: true,
            valid_tokens: 2,
        };
        let mut table = vec![0u32; 8];
        let rej = count_picks_cpu_ctl(&ids, shape, 0, 2, 4, valid2, &mut table).unwrap();
        assert_eq!(rej, 2);
        assert_eq!(table, vec![1, 1, 1, 0, 1, 2, 0, 0]);
        // disabled: nothing counted, nothing rejected
        let off = CountControl {
            enabled: false,
            ..CountControl::ALL
        };
        let before = table.clone();
        assert_eq!(
            count_picks_cpu_ctl(&ids, shape, 0, 2, 4, off, &mut table).unwrap(),
            0
        );
        assert_eq!(table, before);
        // valid 0 counts nothing; valid >= tokens equals the uncontrolled reference
        let zero = CountControl {
            valid_tokens: 0,
            ..CountControl::ALL
        };
        assert_eq!(
            count_picks_cpu_ctl(&ids, shape, 0, 2, 4, zero, &mut table).unwrap(),
            0
        );
        assert_eq!(table, before);
        let (mut a, mut b) = (vec![0u32; 8], vec![0u32; 8]);
        let wide = CountControl {
            valid_tokens: 3,
            ..CountControl::ALL
        };
        let ra = count_picks_cpu_ctl(&ids, shape, 0, 2, 4, wide, &mut a).unwrap();
        let rb = count_picks_cpu(&ids, shape, 0, 2, 4, &mut b).unwrap();
        assert_eq!((ra, a), (rb, b));
    }

    #[test]
    fn cpu_reference_wraps() {
        let mut table = vec![u32::MAX; 1];
        count_picks_cpu(&[0i32], TopkShape::layer(1, 1), 0, 1, 1, &mut table).unwrap();
        assert_eq!(table, vec![0]);
    }

    #[test]
    fn cpu_fold_adds_every_stripe_and_zeroes_them() {
        // 2 layers x 3 stripes x 2 experts
        let mut stripes: Vec<u32> = (1..=12).collect();
        stripes[0] = u32::MAX; // wraps with the table's 1
        let mut table = vec![1u32, 0, 0, 5, 77]; // + a trailing rejected word, left alone
        fold_stripes_cpu(&mut stripes, 3, 2, 2, &mut table).unwrap();
        let l0 = [1u32.wrapping_add(u32::MAX).wrapping_add(3 + 5), 2 + 4 + 6];
        assert_eq!(table, vec![l0[0], l0[1], 7 + 9 + 11, 5 + 8 + 10 + 12, 77]);
        assert!(stripes.iter().all(|&c| c == 0));
        let before = table.clone();
        assert!(matches!(
            fold_stripes_cpu(&mut stripes[..11], 3, 2, 2, &mut table),
            Err(CudaError::Shape { .. })
        ));
        assert!(matches!(
            fold_stripes_cpu(&mut stripes, 3, 2, 2, &mut table[..3]),
            Err(CudaError::Shape { .. })
        ));
        assert_eq!(table, before);
    }
}
