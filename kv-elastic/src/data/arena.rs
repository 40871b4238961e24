//! [`CpuArena`]: the CPU back-end's arena bytes, `u8 [layers][arena_pages][page_bytes]` (one
//! plane per layer, every layer at the same row indices; `[arena_rows][row_bytes]` for the
//! contiguous format). A row's bytes lie where the geometry's segment rule puts them
//! ([`Geometry::row_offsets`]: the value, then the scale of DeepSeek-V4's paged split row), and
//! every copy here goes through [`CpuArena::segs`]. It only moves bytes; which row holds what is
//! the control plane's decision.

use crate::data::{HostBytes, HostStore, SessionId};
use crate::error::{KvError, Result};
use crate::layout::Geometry;

/// A zeroed `n`-byte buffer, or `None` when the allocator refuses (instead of aborting, as
/// `vec![0u8; n]` would). Zeroing is lazy (`alloc_zeroed`), as with `vec!`.
fn try_zeroed(n: usize) -> Option<Vec<u8>> {
    if n == 0 {
        return Some(Vec::new());
    }
    let layout = std::alloc::Layout::array::<u8>(n).ok()?;
    // SAFETY: `layout` has a non-zero size (n > 0).
    let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
    if ptr.is_null() {
        return None;
    }
    // SAFETY: `ptr` was allocated by the global allocator with the layout of `[u8; n]` (so capacity
    // `n` matches the allocation), and all `n` bytes are initialised (zeroed).
    Some(unsafe { Vec::from_raw_parts(ptr, n, n) })
}

/// The arena planes of the CPU pool (see the module docs).
#[derive(Debug)]
pub(crate) struct CpuArena {
    geometry: Geometry,
    page_rows: u32,
    planes: Vec<Vec<u8>>,
}

impl CpuArena {
    /// Zeroed planes for a validated `geometry`; `OutOfMemory` when the host cannot allocate them.
    pub(crate) fn new(geometry: &Geometry) -> Result<Self> {
        let mut planes = Vec::new();
        planes
            .try_reserve_exact(geometry.layers as usize)
            .map_err(|_| KvError::OutOfMemory {
                what: "arena plane table",
                bytes: geometry.layers as u64 * std::mem::size_of::<Vec<u8>>() as u64,
            })?;
        for _ in 0..geometry.layers {
            planes.push(
                try_zeroed(geometry.plane_bytes()).ok_or(KvError::OutOfMemory {
                    what: "arena plane",
                    bytes: geometry.plane_bytes() as u64,
                })?,
            );
        }
        Ok(Self {
            geometry: *geometry,
            page_rows: geometry.page_rows,
            planes,
        })
    }

    pub(crate) fn plane(&self, layer: u32) -> Option<&[u8]> {
        self.planes.get(layer as usize).map(|p| p.as_slice())
    }

    /// The two segments of arena row `row` in a plane: `[(plane offset, token offset, bytes); 2]`
    /// (value, then scale; the scale empty for `Contiguous`). The token offset is where the
    /// segment lies in the row's `value ‖ scale` bytes. The one place the CPU data plane applies
    /// the segment rule ([`Geometry::row_offsets`]).
    fn segs(&self, row: u32) -> [(usize, usize, usize); 2] {
        let (value, scale) = self.geometry.format().segment_bytes();
        let (v, s) = self.geometry.row_offsets(row);
        [
            (v as usize, 0, value as usize),
            (s as usize, value as usize, scale as usize),
        ]
    }

    /// Row `row` of plane `layer` as its `value ‖ scale` bytes (borrowed for `Contiguous`,
    /// gathered for `PagedSplit`), or `None` when out of range.
    pub(crate) fn row(&self, layer: u32, row: i32) -> Option<std::borrow::Cow<'_, [u8]>> {
        let p = self.planes.get(layer as usize)?;
        let row = u32::try_from(row).ok()?;
        if row as u64 >= self.geometry.arena_rows() {
            return None;
        }
        let [a, b] = self.segs(row);
        let first = p.get(a.0..a.0 + a.2)?;
        if b.2 == 0 {
            return Some(std::borrow::Cow::Borrowed(first));
        }
        let mut out = Vec::with_capacity(a.2 + b.2);
        out.extend_from_slice(first);
        out.extend_from_slice(p.get(b.0..b.0 + b.2)?);
        Some(std::borrow::Cow::Owned(out))
    }

    /// Writes `src` (one row's `value ‖ scale`, `row_bytes` bytes) into `row` of `plane`.
    fn put_row(segs: [(usize, usize, usize); 2], plane: &mut [u8], src: &[u8]) {
        for (at, from, n) in segs {
            plane[at..at + n].copy_from_slice(&src[from..from + n]);
        }
    }

    /// Writes one token (`[layers][row_bytes]`) into `row` of every plane.
    pub(crate) fn write_token(&mut self, row: u32, token: &[u8]) {
        let rb = self.geometry.row_bytes as usize;
        let segs = self.segs(row);
        for (l, plane) in self.planes.iter_mut().enumerate() {
            Self::put_row(segs, plane, &token[l * rb..(l + 1) * rb]);
        }
    }

    /// Reads one token (`[layers][row_bytes]`) from `row` of every plane, appending to `out`.
    pub(crate) fn read_token(&self, row: u32, out: &mut Vec<u8>) {
        let segs = self.segs(row);
        for plane in &self.planes {
            for (at, _, n) in segs {
                out.extend_from_slice(&plane[at..at + n]);
            }
        }
    }

    /// Copies `(session, position, layer)` from the host store into `row` of plane `layer`.
    /// The caller checked the session is live and the position committed.
    pub(crate) fn copy_host_row<B: HostBytes>(
        &mut self,
        host: &HostStore<B>,
        session: SessionId,
        position: u32,
        layer: u32,
        row: u32,
    ) {
        let src = host
            .row(session, position, layer)
            .expect("position checked by caller");
        let segs = self.segs(row);
        Self::put_row(segs, &mut self.planes[layer as usize], src);
    }

    /// Copies history page `logical` of `session` (all layers) into physical page `page`.
    pub(crate) fn fill_page<B: HostBytes>(
        &mut self,
        host: &HostStore<B>,
        session: SessionId,
        logical: u32,
        page: u32,
    ) {
        let pr = self.page_rows;
        for i in 0..pr {
            let pos = logical * pr + i;
            for l in 0..self.planes.len() as u32 {
                self.copy_host_row(host, session, pos, l, page * pr + i);
            }
        }
    }
}
