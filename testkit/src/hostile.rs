//! Hostile bytes for the property tests of file loaders (configs, seed maps, dumps, reports).

use proptest::prelude::*;

/// Bytes that are either arbitrary (up to 200) or `valid` with one to five bytes replaced,
/// inserted or removed, and one time in eight cut short. Arbitrary bytes mostly fail at the first
/// byte; the mutations of a valid file reach the loader's deeper checks (types, ranges, shapes).
pub fn hostile_bytes(valid: &'static str) -> impl Strategy<Value = Vec<u8>> {
    let mutated = (
        proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>(), 0u8..3), 1..6),
        any::<prop::sample::Index>(),
    )
        .prop_map(move |(edits, cut)| {
            let mut b = valid.as_bytes().to_vec();
            for (at, byte, op) in edits {
                let i = at.index(b.len() + 1);
                match op {
                    0 if i < b.len() => b[i] = byte,
                    1 => b.insert(i, byte),
                    _ if i < b.len() => {
                        b.remove(i);
                    }
                    _ => {}
                }
            }
            if cut.index(8) == 0 {
                b.truncate(cut.index(b.len() + 1));
            }
            b
        });
    prop_oneof![proptest::collection::vec(any::<u8>(), 0..200), mutated]
}
