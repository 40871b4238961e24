//! The exactness property's bad-input step: every kind of bad call gets a typed error and leaves
//! the pool unchanged (`digest`), for the property in `exactness.rs`.

use super::*;

/// Bad input of every kind: a typed error and an unchanged pool.
pub(super) fn bad_input(
    pool: &mut ElasticPool,
    m: &Model,
    kind: u8,
    seed: u64,
) -> Result<(), TestCaseError> {
    let before = digest(pool);
    let mut x = seed;
    let s = m.pick(seed as u8);
    let len = s.map(|s| m.sessions[&s].0.len() as i32).unwrap_or(1);
    let sid = s.unwrap_or(9_999);
    let err = match kind {
        // Position >= seq_len; the outputs are still fully written.
        0 => {
            let (r, out) = resolve_one(pool, sid, len, &[len], &[0, 1]);
            prop_assert_eq!(out, (vec![-1], vec![0]));
            r
        }
        // Position < -1.
        1 => resolve_one(pool, sid, len, &[-2 - (mix(&mut x) % 5) as i32], &[0, 1]).0,
        // Rows not matching query_start_loc.
        2 => resolve_one(pool, sid, len, &[0, 0], &[0, 1]).0,
        // Unknown session.
        3 => resolve_one(pool, 1 << 40, 1, &[0], &[0, 1]).0,
        4 => pool.append(1 << 40, &vec![0; m.g.token_bytes()]).err(),
        5 => pool.admit(m.next_id + 1000, &[]).err(),
        6 => pool.append(sid, &vec![0; m.g.token_bytes() + 1]).err(),
        // seq_len beyond committed + scratch.
        7 => resolve_one(pool, sid, len + 100, &[0], &[0, 1]).0,
        // A per-query bound outside 1..=seq_len, a pick at its row's bound, a short bound list.
        9..=11 => {
            let (bounds, pick): (&[i32], i32) = match kind {
                9 => (&[0], 0),
                10 => (&[1], 1.min(len - 1).max(0) + i32::from(len == 1)),
                _ => (&[], 0),
            };
            let (mut i, mut v) = (vec![7; 3], vec![7; 2]);
            let r = pool.resolve_with(
                &ResolveInput {
                    sessions: &[sid],
                    query_start_loc: &[0, 1],
                    seq_lens: &[len],
                    topk: &[pick],
                    k: 1,
                    layer: 0,
                },
                &ResolveOptions {
                    layout: OutputLayout::Packed,
                    query_seq_lens: Some(bounds),
                    ..Default::default()
                },
                &mut ResolveOutput {
                    indices: &mut i,
                    valid_count: &mut v,
                },
            );
            if s.is_some() {
                // Oversized outputs are filled whole on error too.
                prop_assert_eq!((i, v), (vec![-1; 3], vec![0; 2]));
            }
            r.err()
        }
        // Block ids: an id < -1, indices shorter than rows × k × block, a block past
        // MAX_BLOCK_POSITIONS.
        12..=14 => {
            let (id, block, idx_len) = match kind {
                12 => (-2 - (mix(&mut x) % 5) as i32, 4, 4),
                13 => (0, 4, 3),
                // B past MAX_BLOCK_POSITIONS: refused by name before any size is taken from it.
                _ => (
                    0,
                    [kv_elastic::MAX_BLOCK_POSITIONS + 1, u32::MAX][(mix(&mut x) % 2) as usize],
                    4,
                ),
            };
            let (mut i, mut v) = (vec![7; idx_len], vec![7; 1]);
            let r = pool.resolve_with(
                &ResolveInput {
                    sessions: &[sid],
                    query_start_loc: &[0, 1],
                    seq_lens: &[len],
                    topk: &[id],
                    k: 1,
                    layer: 0,
                },
                &ResolveOptions {
                    block_positions: block,
                    ..Default::default()
                },
                &mut ResolveOutput {
                    indices: &mut i,
                    valid_count: &mut v,
                },
            );
            let e = r.err();
            match (kind, &e) {
                (12, Some(KvError::PositionOutOfRange { position, .. })) if s.is_some() => {
                    prop_assert_eq!(*position, id);
                    prop_assert_eq!((i, v), (vec![-1; 4], vec![0]));
                }
                (13, Some(KvError::LengthMismatch { .. })) => {}
                (
                    14,
                    Some(KvError::BlockPositionsOutOfRange {
                        block_positions,
                        max,
                    }),
                ) if s.is_some() => {
                    prop_assert_eq!(
                        (*block_positions, *max),
                        (block, kv_elastic::MAX_BLOCK_POSITIONS)
                    );
                    // Outputs shorter than rows × k × B: left as they were.
                    prop_assert_eq!((i, v), (vec![7; 4], vec![7]));
                }
                (_, e) if s.is_none() => prop_assert!(e.is_some()),
                (_, e) => prop_assert!(false, "block kind {}: {:?}", kind, e),
            }
            e
        }
        _ => pool.finish(1 << 40).err(),
    };
    prop_assert!(err.is_some(), "bad input kind {} accepted", kind);
    prop_assert_eq!(
        before,
        digest(pool),
        "bad input kind {} changed the pool",
        kind
    );
    Ok(())
}

/// Resolves one session with `k = 1`; returns the error (if any) and the outputs.
fn resolve_one(
    pool: &mut ElasticPool,
    session: u64,
    seq_len: i32,
    topk: &[i32],
    qsl: &[i32],
) -> (Option<KvError>, (Vec<i32>, Vec<i32>)) {
    let (mut i, mut v) = (vec![7; topk.len()], vec![7; topk.len()]);
    let input = ResolveInput {
        sessions: &[session],
        query_start_loc: qsl,
        seq_lens: &[seq_len],
        topk,
        k: 1,
        layer: 0,
    };
    let r = pool.resolve(
        &input,
        &mut ResolveOutput {
            indices: &mut i,
            valid_count: &mut v,
        },
    );
    (r.err(), (i, v))
}
