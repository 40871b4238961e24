//! Dense nested JSON arrays of numbers (rank 1 to 3, row-major), read without an intermediate
//! `serde_json::Value`: the shape of engines' count tensors (`[window, layers, experts]`) and of
//! per-request routing captures (`[tokens, layers, top_k]`). Ragged arrays, more than 3 levels,
//! non-finite numbers and more than [`MAX_TENSOR_VALUES`] numbers are refused while reading.

use serde::de::{self, DeserializeSeed, SeqAccess, Visitor};

/// Most numbers one tensor may hold (2^26: a 1,000-pass vLLM window of 61 layers × 288
/// physical experts has 17.6 M; a capture of 2,000 tokens × 48 layers × 8 has 0.8 M).
pub const MAX_TENSOR_VALUES: usize = 1 << 26;

/// A dense tensor of rank 1 to 3, row-major, its numbers as `f64` (exact for every `i32`).
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Tensor {
    /// Lengths per axis, outermost first.
    pub(crate) shape: Vec<usize>,
    /// The numbers, row-major.
    pub(crate) values: Vec<f64>,
}

impl Tensor {
    /// The first negative number, if any (counts must not have one; ids may hold `-1` padding).
    pub(crate) fn first_negative(&self) -> Option<f64> {
        self.values.iter().copied().find(|&v| v < 0.0)
    }
}

impl<'de> serde::Deserialize<'de> for Tensor {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let mut t = Tensor::default();
        let mut leaf_depth = None;
        d.deserialize_seq(Level {
            t: &mut t,
            depth: 0,
            leaf_depth: &mut leaf_depth,
        })?;
        let depth = leaf_depth.unwrap_or(1);
        t.shape.truncate(depth);
        Ok(t)
    }
}

/// A [`Tensor`] from an array whose opening bracket a visitor has already seen (a visitor that
/// takes either an object or a nested array).
pub(crate) fn tensor_from_seq<'de, A: SeqAccess<'de>>(seq: A) -> Result<Tensor, A::Error> {
    let mut t = Tensor::default();
    let mut leaf_depth = None;
    Level {
        t: &mut t,
        depth: 0,
        leaf_depth: &mut leaf_depth,
    }
    .visit_seq(seq)?;
    let depth = leaf_depth.unwrap_or(1);
    t.shape.truncate(depth);
    Ok(t)
}

/// One nesting level of a [`Tensor`] being read.
struct Level<'a> {
    t: &'a mut Tensor,
    depth: usize,
    leaf_depth: &'a mut Option<usize>,
}

impl<'de> DeserializeSeed<'de> for Level<'_> {
    type Value = ();
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl Level<'_> {
    fn number<E: de::Error>(self, v: f64) -> Result<(), E> {
        if !v.is_finite() {
            return Err(E::custom(format!("number {v} is not finite")));
        }
        match *self.leaf_depth {
            None => *self.leaf_depth = Some(self.depth),
            Some(d) if d != self.depth => {
                return Err(E::custom(
                    "ragged tensor: numbers and lists mixed at one level",
                ))
            }
            _ => {}
        }
        if self.t.values.len() >= MAX_TENSOR_VALUES {
            return Err(E::custom(format!(
                "more than {MAX_TENSOR_VALUES} numbers in one array; split the file (or sum a \
                 count window over passes) before reading"
            )));
        }
        self.t.values.push(v);
        Ok(())
    }
}

impl<'de> Visitor<'de> for Level<'_> {
    type Value = ();
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a nested array of numbers (at most 3 levels)")
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<(), E> {
        self.number(v as f64)
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<(), E> {
        self.number(v as f64)
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<(), E> {
        self.number(v)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        if self.depth >= 3 {
            return Err(de::Error::custom("tensor of more than 3 dimensions"));
        }
        if self.leaf_depth.is_some_and(|d| d <= self.depth) {
            return Err(de::Error::custom(
                "ragged tensor: numbers and lists mixed at one level",
            ));
        }
        let mut n = 0usize;
        while seq
            .next_element_seed(Level {
                t: &mut *self.t,
                depth: self.depth + 1,
                leaf_depth: &mut *self.leaf_depth,
            })?
            .is_some()
        {
            n += 1;
        }
        // Inner levels finish first: an unset length is `usize::MAX` until its level is seen.
        let shape = &mut self.t.shape;
        if shape.len() <= self.depth {
            shape.resize(self.depth + 1, usize::MAX);
        }
        if shape[self.depth] == usize::MAX {
            shape[self.depth] = n;
        } else if shape[self.depth] != n {
            return Err(de::Error::custom(format!(
                "ragged tensor: {n} entries where a sibling has {}",
                shape[self.depth]
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_and_refusals() {
        let t: Tensor = serde_json::from_str("[[[1, 2], [3, -1]]]").unwrap();
        assert_eq!(t.shape, vec![1, 2, 2]);
        assert_eq!(t.values, vec![1.0, 2.0, 3.0, -1.0]);
        assert_eq!(t.first_negative(), Some(-1.0));
        for bad in ["[[1, 2], [3]]", "[[[[1]]]]", "[[1, [2]]]", "[1, \"x\"]"] {
            assert!(serde_json::from_str::<Tensor>(bad).is_err(), "{bad}");
        }
    }
}
