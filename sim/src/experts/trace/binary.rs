//! The tierkit binary trace format (`.tkt`): compact storage for long routing traces.
//!
//! All integers are little-endian. Layout, version 1:
//!
//! | offset | size | field |
//! | --- | --- | --- |
//! | 0 | 8 | magic `b"TKTRACE\0"` |
//! | 8 | 4 | `u32` version (1) |
//! | 12 | 4 | `u32` layers |
//! | 16 | 4 | `u32` experts per layer |
//! | 20 | 4 | `u32` top-k |
//! | 24 | 4 | `u32` id width in bytes: 2 (`u16` ids, experts per layer ≤ 65,536) or 4 (`u32` ids) |
//! | 28 | 8 | `u64` step count `S` |
//! | 36 | 4 | `u32` shift count `H` |
//! | 40 | 4 | `u32` name length `N` in bytes |
//! | 44 | N | name, UTF-8 |
//! | 44+N | 8·H | `u64` shift steps, increasing |
//! | … | … | `S` steps; each step is, for every layer in order, a `u32` pick count `c` followed by `c` ids of the id width |
//!
//! A layer's ids are the step's picks in that layer flattened `[tokens × top_k]`, exactly
//! [`StepPicks::layers`]. The file ends right after the last step; trailing bytes are an error.
//! A file cut short anywhere is a [`TraceError::Truncated`] naming the byte offset and the field.
//! [`BinaryTraceWriter`] streams steps to any `Write` so a generator never holds the whole trace.

use super::{StepPicks, Trace, TraceError, TraceShape};
use std::io::Write;

/// First 8 bytes of every tierkit binary trace.
pub const MAGIC: [u8; 8] = *b"TKTRACE\0";
/// Version this build writes and reads.
pub const VERSION: u32 = 1;
/// Bytes of the fixed header before the name.
pub const FIXED_HEADER_BYTES: usize = 44;

fn id_width(shape: &TraceShape) -> u32 {
    if shape.experts_per_layer <= 1 << 16 {
        2
    } else {
        4
    }
}

/// Streams a binary trace: the header on [`BinaryTraceWriter::new`], then one
/// [`BinaryTraceWriter::write_step`] per step, then [`BinaryTraceWriter::finish`].
#[derive(Debug)]
pub struct BinaryTraceWriter<W: Write> {
    out: W,
    shape: TraceShape,
    width: u32,
    declared_steps: u64,
    written: u64,
    buf: Vec<u8>,
}

impl<W: Write> BinaryTraceWriter<W> {
    /// Writes the header for a trace of `steps` steps.
    ///
    /// # Errors
    /// [`TraceError::Io`] (path shown as `"<writer>"`), shape errors from
    /// [`TraceShape::validate`], [`TraceError::ShapeMismatch`] for shifts not increasing or not
    /// below `steps`.
    pub fn new(
        mut out: W,
        name: &str,
        shape: TraceShape,
        steps: u64,
        shifts: &[u64],
    ) -> Result<Self, TraceError> {
        shape.validate()?;
        if shifts.iter().any(|&s| s >= steps) || shifts.windows(2).any(|w| w[0] >= w[1]) {
            return Err(TraceError::ShapeMismatch(format!(
                "shifts {shifts:?} must increase and lie below the step count {steps}"
            )));
        }
        let width = id_width(&shape);
        let mut h = Vec::with_capacity(FIXED_HEADER_BYTES + name.len() + 8 * shifts.len());
        h.extend_from_slice(&MAGIC);
        for v in [
            VERSION,
            shape.layers,
            shape.experts_per_layer,
            shape.top_k,
            width,
        ] {
            h.extend_from_slice(&v.to_le_bytes());
        }
        h.extend_from_slice(&steps.to_le_bytes());
        h.extend_from_slice(&(shifts.len() as u32).to_le_bytes());
        h.extend_from_slice(&(name.len() as u32).to_le_bytes());
        h.extend_from_slice(name.as_bytes());
        for s in shifts {
            h.extend_from_slice(&s.to_le_bytes());
        }
        out.write_all(&h)
            .map_err(|e| TraceError::io("<writer>", e))?;
        Ok(Self {
            out,
            shape,
            width,
            declared_steps: steps,
            written: 0,
            buf: Vec::new(),
        })
    }

    /// Appends one step.
    ///
    /// # Errors
    /// [`TraceError::LayerCountMismatch`] for a step with the wrong number of layers,
    /// [`TraceError::ExpertOutOfRange`], [`TraceError::ShapeMismatch`] past the declared step
    /// count, [`TraceError::Io`]. Nothing is written for a rejected step.
    pub fn write_step(&mut self, step: &StepPicks) -> Result<(), TraceError> {
        if self.written >= self.declared_steps {
            return Err(TraceError::ShapeMismatch(format!(
                "more steps than the {} declared in the header",
                self.declared_steps
            )));
        }
        if step.layers.len() != self.shape.layers as usize {
            return Err(TraceError::LayerCountMismatch {
                location: format!("step {}", self.written),
                found: step.layers.len() as u64,
                layers: self.shape.layers,
            });
        }
        self.buf.clear();
        for (l, ids) in step.layers.iter().enumerate() {
            self.buf
                .extend_from_slice(&(ids.len() as u32).to_le_bytes());
            for &e in ids {
                if e >= self.shape.experts_per_layer {
                    return Err(TraceError::ExpertOutOfRange {
                        location: format!("step {} layer {l}", self.written),
                        expert: e.into(),
                        experts: self.shape.experts_per_layer,
                    });
                }
                if self.width == 2 {
                    self.buf.extend_from_slice(&(e as u16).to_le_bytes());
                } else {
                    self.buf.extend_from_slice(&e.to_le_bytes());
                }
            }
        }
        self.out
            .write_all(&self.buf)
            .map_err(|e| TraceError::io("<writer>", e))?;
        self.written += 1;
        Ok(())
    }

    /// Checks that every declared step was written, flushes and returns the writer.
    ///
    /// # Errors
    /// [`TraceError::ShapeMismatch`] when fewer steps were written than declared,
    /// [`TraceError::Io`].
    pub fn finish(mut self) -> Result<W, TraceError> {
        if self.written != self.declared_steps {
            return Err(TraceError::ShapeMismatch(format!(
                "{} steps written, {} declared in the header",
                self.written, self.declared_steps
            )));
        }
        self.out
            .flush()
            .map_err(|e| TraceError::io("<writer>", e))?;
        Ok(self.out)
    }
}

/// Writes a whole trace in the binary format.
///
/// # Errors
/// As [`BinaryTraceWriter`].
pub fn write_binary<W: Write>(trace: &Trace, out: W) -> Result<W, TraceError> {
    let mut w = BinaryTraceWriter::new(
        out,
        &trace.name,
        trace.shape,
        trace.steps.len() as u64,
        &trace.shifts,
    )?;
    for s in &trace.steps {
        w.write_step(s)?;
    }
    w.finish()
}

/// Writes a whole trace to a file in the binary format.
///
/// # Errors
/// As [`BinaryTraceWriter`], with the file's path in I/O errors.
pub fn write_binary_file(trace: &Trace, path: &std::path::Path) -> Result<(), TraceError> {
    let p = path.display().to_string();
    let f = std::fs::File::create(path).map_err(|e| TraceError::io(&p, e))?;
    write_binary(trace, std::io::BufWriter::new(f)).map_err(|e| match e {
        TraceError::Io { source, .. } => TraceError::io(&p, source),
        other => other,
    })?;
    Ok(())
}

struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
    path: &'a str,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], TraceError> {
        let left = self.bytes.len() - self.pos;
        if left < n {
            return Err(TraceError::Truncated {
                path: self.path.to_string(),
                offset: self.pos as u64,
                what,
                needed: n as u64,
                available: left as u64,
            });
        }
        let s = &self.bytes[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }
    fn u32(&mut self, what: &'static str) -> Result<u32, TraceError> {
        let b = self.take(4, what)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn u64(&mut self, what: &'static str) -> Result<u64, TraceError> {
        let b = self.take(8, what)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }
    fn corrupt(&self, offset: usize, reason: String) -> TraceError {
        TraceError::Corrupt {
            path: self.path.to_string(),
            offset: offset as u64,
            reason,
        }
    }
}

/// Parses a binary trace held in memory; `path` names it in errors.
///
/// # Errors
/// [`TraceError::BadMagic`], [`TraceError::UnsupportedVersion`], [`TraceError::Truncated`]
/// (with the byte offset and the field being read), [`TraceError::Corrupt`] (bad id width,
/// non-UTF-8 name, shifts out of order, trailing bytes), [`TraceError::ExpertOutOfRange`]
/// (`FILE@OFFSET`), shape errors of [`TraceShape::validate`] (a header above the size bounds is
/// [`TraceError::Corrupt`] at the shape's offset; nothing is allocated from it).
pub fn read_binary_bytes(bytes: &[u8], path: &str) -> Result<Trace, TraceError> {
    let mut c = Cursor {
        bytes,
        pos: 0,
        path,
    };
    if bytes.len() >= MAGIC.len() && bytes[..MAGIC.len()] != MAGIC {
        return Err(TraceError::BadMagic { path: path.into() });
    }
    c.take(MAGIC.len(), "magic bytes")?;
    let version = c.u32("version")?;
    if version != VERSION {
        return Err(TraceError::UnsupportedVersion {
            path: path.into(),
            version,
            supported: VERSION,
        });
    }
    let shape = TraceShape {
        layers: c.u32("layers")?,
        experts_per_layer: c.u32("experts per layer")?,
        top_k: c.u32("top-k")?,
    };
    let width_at = c.pos;
    let width = c.u32("id width")?;
    if width != 2 && width != 4 {
        return Err(c.corrupt(width_at, format!("id width {width} (must be 2 or 4)")));
    }
    if width == 2 && shape.experts_per_layer > 1 << 16 {
        return Err(c.corrupt(
            width_at,
            format!(
                "id width 2 is too narrow for {} experts per layer (u16 ids hold at most 65,536 \
                 experts; the width must be 4)",
                shape.experts_per_layer
            ),
        ));
    }
    shape.validate().map_err(|e| c.corrupt(12, e.to_string()))?;
    let steps = c.u64("step count")?;
    let n_shifts = c.u32("shift count")?;
    let name_len = c.u32("name length")?;
    let name_at = c.pos;
    let name = std::str::from_utf8(c.take(name_len as usize, "name")?)
        .map_err(|e| c.corrupt(name_at, format!("name is not UTF-8 ({e})")))?
        .to_string();
    let mut shifts = Vec::with_capacity((n_shifts as usize).min(1 << 16));
    for _ in 0..n_shifts {
        let at = c.pos;
        let s = c.u64("shift step")?;
        if s >= steps || shifts.last().is_some_and(|&p| p >= s) {
            return Err(c.corrupt(
                at,
                format!("shift {s} out of order or not below {steps} steps"),
            ));
        }
        shifts.push(s);
    }
    // Every step needs at least 4 bytes per layer: bound the allocation by the file size.
    let min_step_bytes = 4 * shape.layers as u64;
    let cap = steps.min((bytes.len() - c.pos) as u64 / min_step_bytes.max(1));
    let mut out = Vec::with_capacity(cap as usize);
    let w = width as usize;
    for s in 0..steps {
        // `layers` is bounded by `TraceShape::validate`; every layer needs 4 more bytes anyway.
        let mut layers = Vec::with_capacity((shape.layers as usize).min((bytes.len() - c.pos) / 4));
        for _ in 0..shape.layers {
            let count = c.u32("layer pick count")? as usize;
            let at = c.pos;
            let raw = c.take(count.saturating_mul(w), "expert ids")?;
            let mut ids = Vec::with_capacity(count);
            for (i, chunk) in raw.chunks_exact(w).enumerate() {
                let e = if w == 2 {
                    u16::from_le_bytes([chunk[0], chunk[1]]) as u32
                } else {
                    u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]])
                };
                if e >= shape.experts_per_layer {
                    return Err(TraceError::ExpertOutOfRange {
                        location: format!("{path}@{} (step {s})", at + i * w),
                        expert: e.into(),
                        experts: shape.experts_per_layer,
                    });
                }
                ids.push(e);
            }
            layers.push(ids);
        }
        out.push(StepPicks { layers });
    }
    if c.pos != bytes.len() {
        return Err(c.corrupt(
            c.pos,
            format!(
                "{} trailing bytes after the {steps} declared steps",
                bytes.len() - c.pos
            ),
        ));
    }
    Ok(Trace {
        name,
        shape,
        steps: out,
        shifts,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::experts::trace::{read_trace, ReadOptions};

    fn sample() -> Trace {
        Trace {
            name: "sample".into(),
            shape: TraceShape {
                layers: 3,
                experts_per_layer: 8,
                top_k: 2,
            },
            steps: (0..5u32)
                .map(|i| StepPicks {
                    layers: vec![vec![i % 8, 7], vec![], vec![1, 2, 3, (i + 4) % 8]],
                })
                .collect(),
            shifts: vec![2, 4],
        }
    }

    #[test]
    fn round_trip_in_memory_and_file() {
        let t = sample();
        let bytes = write_binary(&t, Vec::new()).unwrap();
        assert_eq!(&bytes[..8], &MAGIC);
        assert_eq!(read_binary_bytes(&bytes, "mem").unwrap(), t);
        let p = crate::experts::trace::test_util::temp_path("rt.tkt");
        write_binary_file(&t, &p).unwrap();
        assert_eq!(read_trace(&p, &ReadOptions::default()).unwrap(), t);
        // u32 ids for a wide geometry.
        let mut wide = t.clone();
        wide.shape.experts_per_layer = 100_000;
        wide.steps[0].layers[0][0] = 99_999;
        let bytes = write_binary(&wide, Vec::new()).unwrap();
        assert_eq!(read_binary_bytes(&bytes, "mem").unwrap(), wide);
    }

    #[test]
    fn every_truncation_is_a_typed_error_with_offset() {
        let bytes = write_binary(&sample(), Vec::new()).unwrap();
        for cut in 0..bytes.len() {
            match read_binary_bytes(&bytes[..cut], "cut.tkt") {
                Err(TraceError::Truncated { offset, path, .. }) => {
                    assert!(offset as usize <= cut, "offset {offset} past cut {cut}");
                    assert_eq!(path, "cut.tkt");
                }
                other => panic!("cut at {cut}: expected Truncated, got {other:?}"),
            }
        }
        let msg = read_binary_bytes(&bytes[..bytes.len() - 1], "cut.tkt")
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("truncated") && msg.contains("byte offset"),
            "{msg}"
        );
    }

    #[test]
    fn bad_inputs_are_typed_errors() {
        let mut bytes = write_binary(&sample(), Vec::new()).unwrap();
        let mut trailing = bytes.clone();
        trailing.push(0);
        assert!(matches!(
            read_binary_bytes(&trailing, "x"),
            Err(TraceError::Corrupt { .. })
        ));
        let mut v2 = bytes.clone();
        v2[8] = 2;
        assert!(matches!(
            read_binary_bytes(&v2, "x"),
            Err(TraceError::UnsupportedVersion { version: 2, .. })
        ));
        let mut magic = bytes.clone();
        magic[0] = b'X';
        assert!(matches!(
            read_binary_bytes(&magic, "x"),
            Err(TraceError::BadMagic { .. })
        ));
        // First id of step 0 layer 0 sits after the header, the name and the shifts.
        let first_id = FIXED_HEADER_BYTES + "sample".len() + 16 + 4;
        bytes[first_id] = 9;
        let e = read_binary_bytes(&bytes, "x").unwrap_err();
        assert!(
            matches!(e, TraceError::ExpertOutOfRange { expert: 9, .. }),
            "{e}"
        );
    }

    /// A header with the given shape, id width and step count, then `tail`.
    fn header(
        layers: u32,
        experts: u32,
        top_k: u32,
        width: u32,
        steps: u64,
        tail: &[u8],
    ) -> Vec<u8> {
        let mut b = MAGIC.to_vec();
        for v in [VERSION, layers, experts, top_k, width] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b.extend_from_slice(&steps.to_le_bytes());
        b.extend_from_slice(&0u32.to_le_bytes());
        b.extend_from_slice(&0u32.to_le_bytes());
        b.extend_from_slice(tail);
        b
    }

    #[test]
    fn huge_headers_are_corrupt_not_allocated() {
        // 45 bytes claiming u32::MAX layers (the breaker's big_layers.tkt), or 2^32 - 1 experts.
        for (l, e) in [(u32::MAX, 8), (1, u32::MAX), (8192, 8), (4096, 8192)] {
            let b = header(l, e, 1, 4, 1, &[0]);
            let err = read_binary_bytes(&b, "big.tkt").unwrap_err();
            assert!(
                matches!(&err, TraceError::Corrupt { offset: 12, .. }),
                "{l}x{e}: {err}"
            );
            assert!(err.to_string().contains("limit"), "{err}");
        }
        // Many declared steps in a short file: the capacity is bounded by the bytes present.
        let b = header(2, 8, 1, 2, u64::MAX, &[0; 8]);
        assert!(matches!(
            read_binary_bytes(&b, "x"),
            Err(TraceError::Truncated { .. })
        ));
    }

    #[test]
    fn narrow_id_width_message_says_why() {
        let b = header(1, 70_000, 1, 2, 1, &[]);
        let e = read_binary_bytes(&b, "w.tkt").unwrap_err().to_string();
        assert!(e.contains("too narrow") && e.contains("70000"), "{e}");
        let b = header(1, 8, 1, 3, 1, &[]);
        let e = read_binary_bytes(&b, "w.tkt").unwrap_err().to_string();
        assert!(e.contains("id width 3 (must be 2 or 4)"), "{e}");
    }

    #[test]
    fn writer_rejects_bad_steps_without_writing() {
        let t = sample();
        let mut w = BinaryTraceWriter::new(Vec::new(), "x", t.shape, 1, &[]).unwrap();
        let before = w.out.len();
        let bad = StepPicks {
            layers: vec![vec![8], vec![], vec![]],
        };
        assert!(matches!(
            w.write_step(&bad),
            Err(TraceError::ExpertOutOfRange { .. })
        ));
        assert_eq!(w.out.len(), before);
        assert!(matches!(
            w.write_step(&StepPicks { layers: vec![] }),
            Err(TraceError::LayerCountMismatch { .. })
        ));
        w.write_step(&t.steps[0]).unwrap();
        assert!(w.write_step(&t.steps[1]).is_err());
        w.finish().unwrap();
        let short = BinaryTraceWriter::new(Vec::new(), "x", t.shape, 2, &[]).unwrap();
        assert!(short.finish().is_err());
    }
}
