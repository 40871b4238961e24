//! The fused KV resolve / dedup / fetch kernels (after HiSparse; outputs in FlashMLA's sparse
//! `indices` shape, with `topk_length` in the packed layout ([`KV_LAYOUT_PACKED`]), batches in
//! vLLM's `query_start_loc` shape): the `Pod` layouts
//! shared with `kernels/kv_resolve.cu` and typed launchers. No tier state lives here: the caller
//! (kv-elastic's GPU arena, or a test) owns the device tables, the arena and the mapped pinned host
//! store, and passes them as a [`KvTables`] of device pointers with their [`KvDims`].
//!
//! What the kernels do is written once as the *KV resolve kernel contract* in this crate's
//! `DESIGN.md`: lookup order tail → scratch → borrowed page → hot cache → miss; misses deduplicated
//! per batch entry over all its rows (first appearance); CLOCK victims that skip the slots pinned by
//! the current call; invalid input comes out as `-1` plus error words ([`KvErrors`]), never an
//! out-of-bounds access.
//!
//! - [`KvKernels`]: the loaded kernels and their launchers (resolve, replay / check-plan, prefetch,
//!   write-back) plus the DMA batch copy back-end.
//! - Layouts: [`KvDims`], [`KvSlotDesc`], [`KvCopy`], [`KvFill`], [`KvTables`], [`KvResolveArgs`],
//!   [`KvErrors`].

use bytemuck::{Pod, Zeroable};
use cudarc::driver::DeviceRepr;

use crate::device::KernelSource;
use crate::error::{CudaError, Result};

mod abi;
mod engine;
mod fastdiv;
mod launch;

pub use abi::{
    KvStats, KV_ERR_WORDS, KV_LAYOUT_IN_PLACE, KV_LAYOUT_PACKED, KV_STATS, KV_UNCLAIMED,
};
#[cfg(feature = "test-hooks")]
pub use engine::ResolveEngine;
#[cfg(not(feature = "test-hooks"))]
pub(crate) use engine::ResolveEngine;
pub use launch::KvKernels;

/// The KV kernels, one NVRTC module in this order: `kernels/kv_abi.cuh` (the structs and constants
/// shared with the host, checked by a test against this module's types), `kv_device.cuh` (device
/// primitives), `kv_clock.cuh` (the hot cache's CLOCK), `kv_resolve.cu` (the resolve kernels and
/// the prefetch) and `kv_copy.cu` (replay, write-back, table patches).
pub const KV_MODULE: KernelSource = KernelSource {
    name: "kv_resolve",
    code: concat!(
        include_str!("../../kernels/kv_abi.cuh"),
        "\n",
        include_str!("../../kernels/kv_device.cuh"),
        "\n",
        include_str!("../../kernels/kv_clock.cuh"),
        "\n",
        include_str!("../../kernels/kv_resolve.cu"),
        "\n",
        include_str!("../../kernels/kv_copy.cu")
    ),
};

/// Sizes of the device tables (all counts; `row_bytes` in bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct KvDims {
    /// Bytes per token row per layer (656 for DeepSeek fp8 MLA).
    pub row_bytes: u32,
    /// Layers (arena planes).
    pub layers: u32,
    /// Rows per page.
    pub page_rows: u32,
    /// Hot-cache rows per session.
    pub hot_rows: u32,
    /// Tail rows per session (position `p` at tail row `p % tail_rows`).
    pub tail_rows: u32,
    /// Scratch rows per session (draft tokens).
    pub scratch_rows: u32,
    /// Fixed pages per session (`ceil((hot + tail + scratch) / page_rows)`).
    pub fixed_pages: u32,
    /// Session slots (rows of every per-session table).
    pub max_slots: u32,
    /// Positions per session slot in the host store and the `position → slot` table.
    pub max_history: u32,
    /// Entries of each slot's borrowed-page table (`ceil(max_history / page_rows)`).
    pub max_pages: u32,
    /// Rows per arena plane.
    pub arena_rows: u32,
    /// Row format: [`KV_FMT_CONTIGUOUS`] or [`KV_FMT_PAGED_SPLIT`] (which one the segment fields
    /// below describe; the kernels apply the same rule to both, [`KvDims::row_segs`]).
    pub fmt: u32,
    /// Value bytes of a row (`row_bytes` for [`KV_FMT_CONTIGUOUS`]; 576 for DeepSeek-V4).
    pub value_bytes: u32,
    /// Scale bytes of a row (0 for [`KV_FMT_CONTIGUOUS`]; 8 for DeepSeek-V4); `value_bytes +
    /// scale_bytes == row_bytes`.
    pub scale_bytes: u32,
    /// Bytes of one arena page of one plane, padding included (`page_rows × row_bytes` for
    /// [`KV_FMT_CONTIGUOUS`]; 37,440 for DeepSeek-V4's 64 rows of 576 + 8 B).
    pub fmt_page_bytes: u64,
}

/// [`KvDims::fmt`]: rows of `row_bytes` contiguous bytes (row `r` of a plane at `r × row_bytes`).
pub const KV_FMT_CONTIGUOUS: u32 = 0;
/// [`KvDims::fmt`]: DeepSeek-V4's paged split row (SGLang 0.5.23 `kvcacheio.cuh`, FlashMLA's
/// DeepSeek-V4 layout): a page's `page_rows` values back to back, then their scales, the page
/// padded to `fmt_page_bytes`.
pub const KV_FMT_PAGED_SPLIT: u32 = 1;

// SAFETY: `KvDims` is `repr(C)`, Pod, and matches `struct KvDims` in kv_abi.cuh field for field.
unsafe impl DeviceRepr for KvDims {}

impl KvDims {
    /// Checks that every extent is non-zero and every index fits the kernels' 32-bit arithmetic.
    ///
    /// # Errors
    /// [`CudaError::OutOfRange`] naming the first bad field.
    pub fn validate(&self) -> Result<()> {
        let nz = [
            ("row_bytes", self.row_bytes),
            ("layers", self.layers),
            ("page_rows", self.page_rows),
            ("hot_rows", self.hot_rows),
            ("tail_rows", self.tail_rows),
            ("fixed_pages", self.fixed_pages),
            ("max_slots", self.max_slots),
            ("max_history", self.max_history),
            ("max_pages", self.max_pages),
            ("arena_rows", self.arena_rows),
        ];
        for (what, v) in nz {
            if v == 0 {
                return Err(CudaError::OutOfRange {
                    what,
                    value: 0,
                    limit: 0,
                });
            }
        }
        self.validate_format()?;
        let fixed_rows = self.hot_rows as u64 + self.tail_rows as u64 + self.scratch_rows as u64;
        if fixed_rows > self.fixed_pages as u64 * self.page_rows as u64 {
            return Err(CudaError::OutOfRange {
                what: "hot + tail + scratch rows (fixed pages too few)",
                value: fixed_rows,
                limit: self.fixed_pages as u64 * self.page_rows as u64 + 1,
            });
        }
        if (self.max_pages as u64) < (self.max_history as u64).div_ceil(self.page_rows as u64) {
            return Err(CudaError::OutOfRange {
                what: "max_pages (below ceil(max_history / page_rows))",
                value: self.max_pages as u64,
                limit: u32::MAX as u64,
            });
        }
        if self.arena_rows > i32::MAX as u32 || self.max_history > i32::MAX as u32 {
            return Err(CudaError::OutOfRange {
                what: "arena_rows / max_history (int32 indices)",
                value: self.arena_rows.max(self.max_history) as u64,
                limit: i32::MAX as u64,
            });
        }
        if self.hot_rows > (1 << 30) {
            return Err(CudaError::OutOfRange {
                what: "hot_rows",
                value: self.hot_rows as u64,
                limit: 1 << 30,
            });
        }
        Ok(())
    }

    /// The row format's checks (after the non-zero ones): `fmt` known, `value_bytes > 0`,
    /// `value_bytes + scale_bytes == row_bytes`, `page_rows × row_bytes <= fmt_page_bytes`
    /// (equal, with no scale, for [`KV_FMT_CONTIGUOUS`]), `arena_rows` whole pages, and the
    /// arena (`layers × plane_bytes`) addressable in 64 bits.
    fn validate_format(&self) -> Result<()> {
        let bad = |what, value: u64, limit: u64| Err(CudaError::OutOfRange { what, value, limit });
        let page_min = self.page_rows as u64 * self.row_bytes as u64;
        match self.fmt {
            KV_FMT_CONTIGUOUS => {
                if self.value_bytes != self.row_bytes || self.scale_bytes != 0 {
                    return bad(
                        "contiguous format: value_bytes must be row_bytes, scale_bytes 0",
                        self.value_bytes as u64,
                        self.row_bytes as u64 + 1,
                    );
                }
                if self.fmt_page_bytes != page_min {
                    return bad(
                        "contiguous format: fmt_page_bytes must be page_rows × row_bytes",
                        self.fmt_page_bytes,
                        page_min + 1,
                    );
                }
            }
            KV_FMT_PAGED_SPLIT => {
                if self.value_bytes == 0
                    || self.value_bytes as u64 + self.scale_bytes as u64 != self.row_bytes as u64
                {
                    return bad(
                        "paged split format: value_bytes (> 0) + scale_bytes must be row_bytes",
                        self.value_bytes as u64 + self.scale_bytes as u64,
                        self.row_bytes as u64 + 1,
                    );
                }
                if self.fmt_page_bytes < page_min {
                    return bad(
                        "paged split format: fmt_page_bytes below page_rows × row_bytes",
                        self.fmt_page_bytes,
                        u64::MAX,
                    );
                }
            }
            f => return bad("fmt (row format)", f as u64, KV_FMT_PAGED_SPLIT as u64 + 1),
        }
        if self.page_rows != 0 && !self.arena_rows.is_multiple_of(self.page_rows) {
            return bad(
                "arena_rows (not whole pages)",
                self.arena_rows as u64,
                u32::MAX as u64,
            );
        }
        let arena = (self.arena_rows / self.page_rows.max(1)) as u128
            * self.fmt_page_bytes as u128
            * self.layers as u128;
        if arena > (isize::MAX as u128) {
            return bad("arena bytes", u64::MAX, isize::MAX as u64);
        }
        Ok(())
    }

    /// Dims of the contiguous format for these rows: `fmt = KV_FMT_CONTIGUOUS`, `value_bytes =
    /// row_bytes`, `scale_bytes = 0`, `fmt_page_bytes = page_rows × row_bytes` (the layout of
    /// every arena before DeepSeek-V4's).
    pub fn contiguous(self) -> KvDims {
        KvDims {
            fmt: KV_FMT_CONTIGUOUS,
            value_bytes: self.row_bytes,
            scale_bytes: 0,
            fmt_page_bytes: self.page_rows as u64 * self.row_bytes as u64,
            ..self
        }
    }

    /// Byte offsets of arena row `row`'s value and scale in its plane (the segment rule the
    /// kernels' `kv_row_segs` applies, `kernels/kv_device.cuh`): page `row / page_rows`, slot
    /// `row % page_rows`; value at `page × fmt_page_bytes + slot × value_bytes`, scale at
    /// `page × fmt_page_bytes + page_rows × value_bytes + slot × scale_bytes`. `page_rows > 0`.
    pub fn row_segs(&self, row: u32) -> (u64, u64) {
        let pr = (self.page_rows as u64).max(1); // 0 is refused by `validate`; never a division by zero
        let (page, slot) = (row as u64 / pr, row as u64 % pr);
        let base = page * self.fmt_page_bytes;
        (
            base + slot * self.value_bytes as u64,
            base + pr * self.value_bytes as u64 + slot * self.scale_bytes as u64,
        )
    }

    /// Bytes of one arena plane: `arena_rows / page_rows` pages of `fmt_page_bytes`
    /// (`arena_rows × row_bytes` for [`KV_FMT_CONTIGUOUS`]).
    pub fn plane_bytes(&self) -> usize {
        (self.arena_rows / self.page_rows.max(1)) as usize * self.fmt_page_bytes as usize
    }

    /// Bytes of one token across layers in the host store.
    pub fn token_bytes(&self) -> usize {
        self.layers as usize * self.row_bytes as usize
    }

    /// Byte offset of `(slot, position, layer)` in the host store.
    pub fn host_offset(&self, slot: u32, position: u32, layer: u32) -> usize {
        ((slot as usize * self.max_history as usize + position as usize) * self.layers as usize
            + layer as usize)
            * self.row_bytes as usize
    }
}

/// One session slot's placement as the host last published it (between steps).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct KvSlotDesc {
    /// 1 if the slot holds a live request.
    pub live: u32,
    /// Committed positions.
    pub committed: u32,
    /// Draft tokens in scratch (positions `committed..committed + scratch_len`).
    pub scratch_len: u32,
    /// 1 if the whole history is resident (tail + borrowed pages): the direct path.
    pub full: u32,
    /// First tail position (`committed - min(committed, tail_rows)`).
    pub tail_start: u32,
    /// Padding (0).
    pub pad: [u32; 3],
}

/// One row copy of a plan: `(slot, position)` of the host store ↔ arena row `dst_row`
/// (a hot-cache row for fetches, the source row for write-backs).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Pod, Zeroable)]
pub struct KvCopy {
    /// Session slot.
    pub slot: u32,
    /// Position in the request's history.
    pub position: u32,
    /// Arena row.
    pub dst_row: u32,
    /// Padding (0).
    pub pad: u32,
}

impl KvCopy {
    /// `(slot, position, dst_row)` with zero padding.
    pub const fn new(slot: u32, position: u32, dst_row: u32) -> Self {
        KvCopy {
            slot,
            position,
            dst_row,
            pad: 0,
        }
    }
}

/// One table patch of [`KvKernels::fill_words_async`]: `count` `u32` words at device address
/// `dst` set to `value` (a single `i32` table entry: `count = 1`; a table range reset: its length).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Pod, Zeroable)]
pub struct KvFill {
    /// Device address of the first word (4-byte aligned).
    pub dst: u64,
    /// Words to write.
    pub count: u32,
    /// The value of each word.
    pub value: u32,
}

/// How misses are copied from the host store into the arena.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CopyBackend {
    /// GPU threads read the mapped pinned host store in place (16-byte loads, a warp per row), inside
    /// the fused kernel: no host involvement, graph capturable; competes with compute for SMs.
    Gather,
    /// The copy engines (`cuMemcpyBatchAsync`, one descriptor per row): leaves the SMs alone but
    /// needs the plan on the host first (a download between the resolve and the copies).
    Dma,
}

/// Error counters the kernels keep on the device (cumulative until the owner of [`KvTables::err`] zeroes it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KvErrors {
    /// Requests whose slot is out of range, not live or named by another request of the same
    /// call, or whose `seq_len` is out of range.
    pub bad_session: u32,
    /// Picks `< -1` or at or beyond their row's bound (`seq_len`, or the per-query bound),
    /// written as `-1`.
    pub bad_position: u32,
    /// Distinct positions of a call that found no evictable hot row (their picks are written
    /// `-1`; a speculative step needing more rows than the hot cache has). Not a fault of the
    /// input: the call is served as far as the hot cache allows.
    pub overflow: u32,
    /// Calls with a malformed `query_start_loc` (every row written as `-1`).
    pub bad_qsl: u32,
    /// Plan entries whose destination row no longer holds the position (replay check).
    pub stale_plan: u32,
}

impl KvErrors {
    /// Whether every counter is zero.
    pub fn is_clean(&self) -> bool {
        *self == KvErrors::default()
    }
}

impl KvErrors {
    /// Decodes the device error words (`u32 [KV_ERR_WORDS]`, as downloaded from [`KvTables::err`]);
    /// missing words read as 0.
    pub fn from_words(words: &[u32]) -> Self {
        let w = |i: usize| words.get(i).copied().unwrap_or(0);
        KvErrors {
            bad_session: w(0),
            bad_position: w(1),
            overflow: w(2),
            bad_qsl: w(3),
            stale_plan: w(4),
        }
    }
}

/// Device pointers of every table the kernels read and write (`repr(C)`, matches `struct KvTables`
/// in `kernels/kv_abi.cuh`). Shapes, with the extents of the [`KvDims`] passed alongside (element types
/// in brackets; "slot" = session slot):
///
/// | field | shape | initial contents |
/// | --- | --- | --- |
/// | `desc` | `KvSlotDesc [max_slots]` | zeroed (no slot live) |
/// | `fixed_pages` | `i32 [max_slots][fixed_pages]` | physical page ids |
/// | `page_tab` | `i32 [max_slots][max_pages]` | `-1` (`tier_core::NOT_RESIDENT`) |
/// | `pos_slot` | `i32 [max_slots][max_history]` | `-1` |
/// | `slot_pos` | `i32 [max_slots][hot_rows]` | `-1` |
/// | `mark` | `u64 [max_slots][hot_rows]` | 0 |
/// | `stamp` | `u64 [max_slots][hot_rows]` | 0 |
/// | `hand` | `u32 [max_slots]` | 0 |
/// | `first` | `i32 [max_slots][max_history]` | [`KV_UNCLAIMED`] |
/// | `call` | `u64 [max_slots]` | 1 in every entry (per-slot call counters, as the CPU reference's per-session ones) |
/// | `arena` | `u8 [layers][arena_rows][row_bytes]` | anything |
/// | `host` | `u8 [max_slots][max_history][layers][row_bytes]`, mapped pinned host memory (device address) | the history |
/// | `err` | `u32 [`[`KV_ERR_WORDS`]`]` | 0 |
/// | `direct` | `u32 [1]`, or 0 (null) | 0 (see the field) |
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct KvTables {
    /// `KvSlotDesc [max_slots]`.
    pub desc: u64,
    /// `i32 [max_slots][fixed_pages]`.
    pub fixed_pages: u64,
    /// `i32 [max_slots][max_pages]`.
    pub page_tab: u64,
    /// `i32 [max_slots][max_history]`: hot slot of each position, `-1` if none.
    pub pos_slot: u64,
    /// `i32 [max_slots][hot_rows]`: position held by each hot slot, `-1` if empty.
    pub slot_pos: u64,
    /// `u64 [max_slots][hot_rows]`: CLOCK reference marks (a row is referenced iff its stamp is
    /// above its mark; see the stamp).
    pub mark: u64,
    /// `u64 [max_slots][hot_rows]`: call stamps: `2c + 1` after a hit in call `c`, `2c` after an
    /// install (a row is pinned by call `c` iff `stamp >> 1 == c`; the sweep clears a reference by
    /// setting the mark to `2c`).
    pub stamp: u64,
    /// `u32 [max_slots]`: CLOCK hands.
    pub hand: u64,
    /// `i32 [max_slots][max_history]`: dedup claims (first appearance), [`KV_UNCLAIMED`] at rest.
    pub first: u64,
    /// `u64 [max_slots]`: per-slot call counters (the number of the slot's last accepted resolve;
    /// a resolve entry uses `call[slot] + 1` and stores it, a prefetch uses `call[slot]`). Start
    /// them at 1 so that zeroed hot-row stamps are never the current call's.
    pub call: u64,
    /// `u8 [layers][arena_rows][row_bytes]`: the arena.
    pub arena: u64,
    /// Device address of the mapped pinned host store `u8 [max_slots][max_history][layers][row_bytes]`.
    pub host: u64,
    /// `u32 [KV_ERR_WORDS]`: error counters ([`KvErrors::from_words`]).
    pub err: u64,
    /// `u32 [1]` or 0 (null): the *direct-batch* word. Its owner sets it to 1 only while every
    /// live slot's descriptor has `full = 1`; the resolve kernels then read no position table and
    /// take no hot-cache path (`DESIGN.md`, "Direct batches"). A slot that is not full after all
    /// gets `-1` for the picks its hot cache would serve (never a wrong row, no table written but
    /// the call counter). kv-elastic's pool maintains it at publish.
    pub direct: u64,
}
// SAFETY: `repr(C)` of 14 u64 device pointers, matching `struct KvTables` in kv_abi.cuh.
unsafe impl DeviceRepr for KvTables {}

/// Device buffers of one fused resolve call (raw device pointers, e.g. tensors' `data_ptr()`).
/// Output layout, per-query bounds and oversized output buffers: [`KvResolveOptions`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KvResolveArgs {
    /// `int32 [rows, k]` picked positions (`-1` = padding), or block ids
    /// ([`KvResolveOptions::block_positions`]).
    pub topk: u64,
    /// `int32 [sessions + 1]` query rows per session.
    pub query_start_loc: u64,
    /// `int32 [sessions]` visible positions per session (per query row:
    /// [`KvResolveOptions::query_seq_lens`]).
    pub seq_lens: u64,
    /// `int32 [sessions]` session slot of each request. A slot named by more than one request is
    /// refused for every request naming it (rows `-1`, one `bad_session` each, its tables
    /// untouched): two blocks must never update one slot's hot cache.
    pub session_slot: u64,
    /// Requests.
    pub sessions: u32,
    /// Query rows.
    pub rows: u32,
    /// Picks per row of `topk` (block ids per row with [`KvResolveOptions::block_positions`]).
    pub k: u32,
    /// First arena plane the misses are fetched into ([`KvResolveOptions::fill_layers`] planes
    /// from it).
    pub layer: u32,
    /// `int32 [rows, k × B]` output arena rows, `B` = [`KvResolveOptions::block_positions`] (1
    /// for positions); `-1` padding; layout and longer buffers: [`KvResolveOptions`].
    pub indices: u64,
    /// `int32 [rows]` output valid picks per row (FlashMLA's `topk_length` only in the packed
    /// layout, [`KV_LAYOUT_PACKED`]).
    pub valid_count: u64,
    /// `KvCopy [sessions][hot_rows]` output plan (request `r`'s copies at `r * hot_rows`).
    pub plan: u64,
    /// `u32 [sessions]` output plan entries per session.
    pub plan_count: u64,
    /// `u32 [sessions][KV_STATS]` output counters.
    pub stats: u64,
}

/// Optional inputs of one fused resolve ([`KvKernels::resolve_async_with`]); the default (all
/// zero) is [`KvKernels::resolve_async`]'s behaviour. Kept apart from [`KvResolveArgs`] so that
/// code building the arguments as a struct literal keeps compiling.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KvResolveOptions {
    /// Row layout: [`KV_LAYOUT_IN_PLACE`] (0, default) or [`KV_LAYOUT_PACKED`] (1); any other
    /// value is refused at launch (`OutOfRange`).
    pub layout: u32,
    /// `int32 [rows]` per-query causal bound (device pointer; 0 = none): row `row` may see
    /// positions `0..query_seq_lens[row]` (capped at its entry's `seq_len`); a pick at or beyond
    /// it is written `-1` and counted in `bad_position` (block ids: written `-1`, see
    /// [`KvResolveOptions::block_positions`]). vLLM's per-token `seq_lens` of a speculative batch.
    pub query_seq_lens: u64,
    /// Entries of the `indices` buffer (0 = exactly `rows × k × B`, `B` the positions per block
    /// id, 1 for positions). Larger: a persistent max-size buffer (CUDA-graph style); entries past
    /// `rows × k × B` are padding and written `-1`. Smaller is refused at launch (`Shape`).
    pub indices_len: u64,
    /// Entries of the `valid_count` buffer (0 = exactly `rows`). Larger: entries past `rows` are
    /// padding and written `0`. Smaller than `rows` is refused at launch (`Shape`).
    pub valid_len: u64,
    /// Entries of the `plan_count` buffer (0 = exactly `sessions`). Larger: entries past
    /// `sessions` are written `0`, so a replay over more sessions than this call's copies nothing
    /// stale (a persistent `[max_sessions]` buffer inside a CUDA graph). Smaller than `sessions`
    /// is refused at launch (`Shape`).
    pub plan_count_len: u64,
    /// Which kernel runs (a test hook, feature `test-hooks`: `ResolveEngine::Auto` by default);
    /// results are identical.
    #[cfg(feature = "test-hooks")]
    pub engine: ResolveEngine,
    /// Layers the misses are copied into, from [`KvResolveArgs::layer`] (0 = 1): a layer
    /// group's planes (kv-elastic's `LayerGroups`), all filled by the one resolve. The layer
    /// range must end within `KvDims::layers` (`OutOfRange` otherwise).
    pub fill_layers: u32,
    /// Positions per block id (0 or 1: `topk` holds positions). `B > 1`: `topk int32 [rows, k]`
    /// holds block ids, id `b` standing for positions `b × B .. b × B + B` (MiniMax-M3's block
    /// top-k; SGLang's `TopKIsBlocks`), read block-major: output column `c × B + i` is position
    /// `topk[row][c] × B + i`, resolved as a position pick. Outputs are `[rows, k × B]` (row
    /// stride `k × B`, at most `i32::MAX`: `OutOfRange` otherwise). A block's position at or
    /// beyond its row's bound is written `-1` and not counted invalid (the block straddles the
    /// end); an id `< -1` is invalid, counted in `bad_position` once per position it stands for.
    pub block_positions: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dims_validation_is_typed() {
        let d = KvDims {
            row_bytes: 656,
            layers: 2,
            page_rows: 64,
            hot_rows: 4096,
            tail_rows: 128,
            scratch_rows: 8,
            fixed_pages: 67,
            max_slots: 4,
            max_history: 1000,
            max_pages: 16,
            arena_rows: 64 * 1000,
            ..Default::default()
        }
        .contiguous();
        d.validate().unwrap();
        assert_eq!(d.plane_bytes(), 64_000 * 656);
        assert_eq!(d.row_segs(70), (70 * 656, 128 * 656));
        // Not contiguous after all: a typed error, not a wrong copy.
        assert!(KvDims {
            scale_bytes: 8,
            ..d
        }
        .validate()
        .is_err());
        assert!(KvDims { fmt: 2, ..d }.validate().is_err());
        // DeepSeek-V4's paged split row.
        let v4 = KvDims {
            row_bytes: 584,
            fmt: KV_FMT_PAGED_SPLIT,
            value_bytes: 576,
            scale_bytes: 8,
            fmt_page_bytes: 37_440,
            ..d
        };
        v4.validate().unwrap();
        assert_eq!(v4.plane_bytes(), 1000 * 37_440);
        assert_eq!(v4.row_segs(65), (37_440 + 576, 37_440 + 64 * 576 + 8));
        for bad in [
            KvDims {
                value_bytes: 0,
                scale_bytes: 584,
                ..v4
            },
            KvDims {
                scale_bytes: 16,
                ..v4
            },
            KvDims {
                fmt_page_bytes: 64 * 584 - 1,
                ..v4
            },
            KvDims {
                arena_rows: 64 * 1000 + 1,
                ..v4
            },
        ] {
            assert!(
                matches!(bad.validate(), Err(CudaError::OutOfRange { .. })),
                "{bad:?}"
            );
        }
        assert!(matches!(
            KvDims {
                fixed_pages: 10,
                ..d
            }
            .validate(),
            Err(CudaError::OutOfRange { .. })
        ));
        assert!(matches!(
            KvDims { max_pages: 1, ..d }.validate(),
            Err(CudaError::OutOfRange { .. })
        ));
        assert!(matches!(
            KvDims { hot_rows: 0, ..d }.validate(),
            Err(CudaError::OutOfRange {
                what: "hot_rows",
                ..
            })
        ));
        assert_eq!(d.host_offset(1, 2, 1), ((1000 + 2) * 2 + 1) * 656);
    }
}
