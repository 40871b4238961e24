//! The Rust side of `kernels/kv_abi.cuh`: the constants the host sizes launches by, the call
//! struct the resolve kernels take by value ([`KvCall`]), and the typed decoder of an entry's stats
//! row ([`KvStats`]). One test checks every `#define` of the header against its constant here and
//! every struct of the header, field by field (name, offset, size), against its `repr(C)` mirror.

use bytemuck::{Pod, Zeroable};
use cudarc::driver::DeviceRepr;

use super::KvCopy;

/// Words of the device error counters (`u32`, [`super::KvTables::err`]).
pub const KV_ERR_WORDS: usize = 8;

/// Initial value of the dedup claim table [`super::KvTables::first`] (`i32::MAX`).
pub const KV_UNCLAIMED: i32 = i32::MAX;

/// Per-entry counters written by the resolve kernel (`u32 [sessions][KV_STATS]`), decoded by
/// [`KvStats::from_row`].
pub const KV_STATS: usize = 8;

/// [`super::KvResolveOptions::layout`]: arena rows stay in their picks' columns, `-1` where
/// invalid; `valid_count` counts the non `-1` entries (not FlashMLA's `topk_length`).
pub const KV_LAYOUT_IN_PLACE: u32 = 0;
/// [`super::KvResolveOptions::layout`]: valid entries packed to the front of each row in column
/// order, `-1` after; `valid_count` is the packed length (FlashMLA's `topk_length`).
pub const KV_LAYOUT_PACKED: u32 = 1;

/// Threads of the 1024-thread lean kernel (and of the prefetch).
pub(crate) const KV_LEAN_BLOCK: u32 = 1024;
/// Threads of the 512-thread lean kernel (the decode default).
pub(crate) const KV_LEAN512_BLOCK: u32 = 512;
/// Threads of the classic kernel (tables over the lean limits).
pub(crate) const KV_CLASSIC_BLOCK: u32 = 512;
/// Picks one lean thread holds in registers.
pub(crate) const KV_FAST_PER: u32 = 4;
/// Query rows of one entry the lean path takes.
pub(crate) const KV_FAST_MAX_ROWS: u32 = 64;
/// Hot rows up to which the lean kernels keep a rank → victim table (`u16` per hot row) in shared
/// memory.
pub(crate) const KV_LEAN_VICTIM_MAX: u32 = 8192;
/// Hot rows up to which the lean kernels run (their candidate bitmaps, `2 × ⌈hot_rows / 32⌉`
/// `u32`, are in shared memory); above, the classic kernel.
pub(crate) const KV_LEAN_MAX_HOT_ROWS: u32 = 65536;
/// Fixed pages per slot up to which the lean kernels run (kept in shared memory); above, the
/// classic kernel.
pub(crate) const KV_LEAN_MAX_FIXED_PAGES: u32 = 4096;
/// Replay modes of `tierkit_kv_replay`.
pub(crate) const KV_REPLAY_COPY: u32 = 0;
pub(crate) const KV_REPLAY_CHECK: u32 = 1;
pub(crate) const KV_REPLAY_FRESH: u32 = 2;

// The lean kernels compute `ceil(x / blockDim)` as a shift: their block sizes are powers of two.
const _: () = assert!(KV_LEAN_BLOCK.is_power_of_two() && KV_LEAN512_BLOCK.is_power_of_two());

/// One fused resolve call, by value (`struct KvCall` in `kv_abi.cuh`): the caller's buffers and
/// the call's sizes. Built by the launcher from [`super::KvResolveArgs`] and
/// [`super::KvResolveOptions`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub(crate) struct KvCall {
    pub topk: u64,
    pub qsl: u64,
    pub seq_lens: u64,
    pub session_slot: u64,
    pub indices: u64,
    pub valid_count: u64,
    pub plan: u64,
    pub plan_count: u64,
    pub stats: u64,
    pub qseq: u64,
    pub idx_len: u64,
    pub valid_len: u64,
    pub pc_len: u64,
    pub sessions: u32,
    pub rows: u32,
    pub k: u32,
    pub layer: u32,
    pub fetch: u32,
    pub layout: u32,
    /// Positions per top-k entry (1: positions; `> 1`: block ids).
    pub block: u32,
    /// Entries per row of `topk` (`k / block`).
    pub topk_k: u32,
}

// SAFETY: `KvCall` is `repr(C)`, Pod, and matches `struct KvCall` in kv_abi.cuh field for field
// (checked by `the_header_matches_the_rust_side`).
unsafe impl DeviceRepr for KvCall {}

/// One entry's stats row as the resolve kernel writes it (`KV_STAT_*` in `kv_abi.cuh`), counted
/// per pick unless said otherwise.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KvStats {
    /// Valid picks served (tail + scratch + page + hot).
    pub picks: u32,
    /// Served by the tail (newest committed positions).
    pub tail_hits: u32,
    /// Served by the draft scratch.
    pub scratch_hits: u32,
    /// Served by borrowed elastic pages.
    pub page_hits: u32,
    /// Served by the hot cache (including this call's installs).
    pub hot_hits: u32,
    /// Distinct positions fetched (placed in hot rows).
    pub misses: u32,
    /// Whether the entry took the direct path (whole history resident, nothing missed).
    pub direct: bool,
    /// Picks `< -1` or at or beyond their bound (written `-1`).
    pub invalid: u32,
}

impl KvStats {
    /// Decodes one stats row (`u32 [KV_STATS]`; missing words read as 0).
    pub fn from_row(row: &[u32]) -> Self {
        let w = |i: usize| row.get(i).copied().unwrap_or(0);
        KvStats {
            picks: w(0),
            tail_hits: w(1),
            scratch_hits: w(2),
            page_hits: w(3),
            hot_hits: w(4),
            misses: w(5),
            direct: w(6) != 0,
            invalid: w(7),
        }
    }

    /// Decodes `rows` (`u32 [n][KV_STATS]`, n entries' rows) into one row each.
    pub fn from_rows(rows: &[u32]) -> impl Iterator<Item = KvStats> + '_ {
        rows.chunks(KV_STATS).map(KvStats::from_row)
    }
}

const _: () = assert!(std::mem::size_of::<KvCopy>() == 16);

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::super::fastdiv::{KvDiv, KvDivs};
    use super::super::{KvDims, KvFill, KvSlotDesc, KvTables};
    use super::*;

    const HEADER: &str = include_str!("../../kernels/kv_abi.cuh");

    /// `#define NAME VALUE` lines of the header (VALUE without a `u` suffix or parentheses).
    fn defines() -> BTreeMap<&'static str, i64> {
        HEADER
            .lines()
            .filter_map(|l| l.strip_prefix("#define "))
            .map(|l| {
                let mut it = l.split_whitespace();
                let name = it.next().unwrap();
                let v = it.next().unwrap().trim_matches(|c| c == '(' || c == ')');
                let v = v.trim_end_matches('u');
                let v = match v.strip_prefix("0x") {
                    Some(h) => i64::from_str_radix(h, 16).unwrap(),
                    None => v.parse().unwrap(),
                };
                (name, v)
            })
            .collect()
    }

    /// The fields of `struct NAME { ... };` as (name, C alignment, C size in bytes), in order.
    fn fields(name: &str) -> Vec<(String, usize, usize)> {
        let start = HEADER
            .find(&format!("struct {name} {{"))
            .unwrap_or_else(|| panic!("struct {name} not in kv_abi.cuh"));
        let body = &HEADER[start..];
        let body = &body[body.find('{').unwrap() + 1..body.find("};").unwrap()];
        let body: String = body
            .lines()
            .map(|l| l.split("//").next().unwrap())
            .collect::<Vec<_>>()
            .join(" ");
        let mut out = Vec::new();
        for decl in body.split(';') {
            let decl = decl.trim();
            if decl.is_empty() {
                continue;
            }
            let size = if decl.contains('*') || decl.starts_with("unsigned long long") {
                8
            } else if decl.starts_with("KvDiv ") {
                16
            } else {
                assert!(decl.starts_with("unsigned int"), "{name}: {decl}");
                4
            };
            let ty = decl.trim_start_matches("const ");
            let names = [
                "unsigned long long",
                "unsigned int",
                "unsigned char",
                "KvSlotDesc",
                "KvCopy",
                "KvDiv",
                "int",
            ]
            .iter()
            .find_map(|t| ty.strip_prefix(t))
            .unwrap_or_else(|| panic!("{name}: unknown type in {decl}"));
            for n in names.split(',') {
                let n = n.trim().trim_start_matches('*').trim();
                match n.split_once('[') {
                    Some((n, len)) => {
                        let len: usize = len.trim_end_matches(']').parse().unwrap();
                        out.push((n.to_string(), size, size * len));
                    }
                    None => out.push((n.to_string(), size, size)),
                }
            }
        }
        out
    }

    /// Checks `struct NAME` of the header against the Rust type's fields (name, offset) and size.
    macro_rules! same_layout {
        ($name:literal, $ty:ty, [$($f:ident),+ $(,)?]) => {{
            let c = fields($name);
            let rust: Vec<(&str, usize)> = vec![$((stringify!($f), std::mem::offset_of!($ty, $f))),+];
            assert_eq!(c.len(), rust.len(), "{}: field count {:?} vs {:?}", $name, c, rust);
            let mut off = 0usize;
            for ((cn, ca, cs), (rn, ro)) in c.iter().zip(&rust) {
                off = off.next_multiple_of(*ca);
                assert_eq!((cn.as_str(), off), (*rn, *ro), "{}: field {}", $name, cn);
                off += cs;
            }
            assert_eq!(off.next_multiple_of(8), std::mem::size_of::<$ty>().next_multiple_of(8), "{}: size", $name);
        }};
    }

    #[test]
    fn the_header_matches_the_rust_side() {
        let d = defines();
        let want: [(&str, i64); 27] = [
            ("KV_FMT_CONTIGUOUS", super::super::KV_FMT_CONTIGUOUS as i64),
            (
                "KV_FMT_PAGED_SPLIT",
                super::super::KV_FMT_PAGED_SPLIT as i64,
            ),
            ("KV_NONE", tier_core::NOT_RESIDENT as i64),
            ("KV_UNCLAIMED", KV_UNCLAIMED as i64),
            ("KV_ERR_WORDS", KV_ERR_WORDS as i64),
            ("KV_ERR_BAD_SESSION", 0),
            ("KV_ERR_BAD_POSITION", 1),
            ("KV_ERR_OVERFLOW", 2),
            ("KV_ERR_BAD_QSL", 3),
            ("KV_ERR_STALE_PLAN", 4),
            ("KV_STATS", KV_STATS as i64),
            ("KV_STAT_PICKS", 0),
            ("KV_STAT_MISSES", 5),
            ("KV_STAT_DIRECT", 6),
            ("KV_STAT_INVALID", 7),
            ("KV_LAYOUT_IN_PLACE", KV_LAYOUT_IN_PLACE as i64),
            ("KV_LAYOUT_PACKED", KV_LAYOUT_PACKED as i64),
            ("KV_REPLAY_COPY", KV_REPLAY_COPY as i64),
            ("KV_REPLAY_CHECK", KV_REPLAY_CHECK as i64),
            ("KV_REPLAY_FRESH", KV_REPLAY_FRESH as i64),
            ("KV_LEAN_BLOCK", KV_LEAN_BLOCK as i64),
            ("KV_LEAN512_BLOCK", KV_LEAN512_BLOCK as i64),
            ("KV_CLASSIC_BLOCK", KV_CLASSIC_BLOCK as i64),
            ("KV_FAST_PER", KV_FAST_PER as i64),
            ("KV_FAST_MAX_ROWS", KV_FAST_MAX_ROWS as i64),
            ("KV_LEAN_VICTIM_MAX", KV_LEAN_VICTIM_MAX as i64),
            ("KV_LEAN_MAX_HOT_ROWS", KV_LEAN_MAX_HOT_ROWS as i64),
        ];
        for (name, v) in want {
            assert_eq!(d.get(name), Some(&v), "#define {name}");
        }
        assert_eq!(
            d.get("KV_LEAN_MAX_FIXED_PAGES"),
            Some(&(KV_LEAN_MAX_FIXED_PAGES as i64))
        );
        // Every stats index is the decoder's.
        let row: Vec<u32> = (1..=KV_STATS as u32).collect();
        let s = KvStats::from_row(&row);
        for (name, v) in [
            ("KV_STAT_PICKS", s.picks),
            ("KV_STAT_TAIL", s.tail_hits),
            ("KV_STAT_SCRATCH", s.scratch_hits),
            ("KV_STAT_PAGE", s.page_hits),
            ("KV_STAT_HOT", s.hot_hits),
            ("KV_STAT_MISSES", s.misses),
            ("KV_STAT_INVALID", s.invalid),
        ] {
            assert_eq!(d[name] + 1, v as i64, "{name}");
        }
        // Every error word is the decoder's.
        let words: Vec<u32> = (1..=KV_ERR_WORDS as u32).collect();
        let e = super::super::KvErrors::from_words(&words);
        for (name, v) in [
            ("KV_ERR_BAD_SESSION", e.bad_session),
            ("KV_ERR_BAD_POSITION", e.bad_position),
            ("KV_ERR_OVERFLOW", e.overflow),
            ("KV_ERR_BAD_QSL", e.bad_qsl),
            ("KV_ERR_STALE_PLAN", e.stale_plan),
        ] {
            assert_eq!(d[name] + 1, v as i64, "{name}");
        }
        same_layout!(
            "KvDims",
            KvDims,
            [
                row_bytes,
                layers,
                page_rows,
                hot_rows,
                tail_rows,
                scratch_rows,
                fixed_pages,
                max_slots,
                max_history,
                max_pages,
                arena_rows,
                fmt,
                value_bytes,
                scale_bytes,
                fmt_page_bytes
            ]
        );
        same_layout!("KvDiv", KvDiv, [d, mul, shr, pad]);
        same_layout!("KvDivs", KvDivs, [page, tail, k, blk, m, gper, fp_max, pad]);
        same_layout!(
            "KvSlotDesc",
            KvSlotDesc,
            [live, committed, scratch_len, full, tail_start, pad]
        );
        same_layout!(
            "KvTables",
            KvTables,
            [
                desc,
                fixed_pages,
                page_tab,
                pos_slot,
                slot_pos,
                mark,
                stamp,
                hand,
                first,
                call,
                arena,
                host,
                err,
                direct
            ]
        );
        same_layout!("KvCopy", KvCopy, [slot, position, dst_row, pad]);
        same_layout!("KvFill", KvFill, [dst, count, value]);
        same_layout!(
            "KvCall",
            KvCall,
            [
                topk,
                qsl,
                seq_lens,
                session_slot,
                indices,
                valid_count,
                plan,
                plan_count,
                stats,
                qseq,
                idx_len,
                valid_len,
                pc_len,
                sessions,
                rows,
                k,
                layer,
                fetch,
                layout,
                block,
                topk_k
            ]
        );
    }
}

#[cfg(test)]
mod shape_tests {
    /// No kernel or device helper of the KV module takes more than 12 parameters (a struct by
    /// value or reference counts as one): the kernels take (KvDims, KvTables, KvCall, KvDivs),
    /// the helpers an entry (`KvEntry`) and the block's scratch (`KvShared`).
    #[test]
    fn kv_functions_take_at_most_twelve_parameters() {
        let src = super::super::KV_MODULE.code;
        let params = |rest: &str| -> Option<usize> {
            let open = rest.find('(')?;
            let mut depth = 0;
            let mut n = 0;
            let mut any = false;
            for c in rest[open..].chars() {
                match c {
                    '(' | '<' | '[' => depth += 1,
                    ')' | '>' | ']' => {
                        depth -= 1;
                        if depth == 0 {
                            return Some(if any { n + 1 } else { 0 });
                        }
                    }
                    ',' if depth == 1 => n += 1,
                    c if !c.is_whitespace() && depth >= 1 => any = true,
                    _ => {}
                }
            }
            None
        };
        let mut checked = 0;
        for (i, _) in src
            .match_indices("__device__")
            .chain(src.match_indices("__global__"))
        {
            let head = &src[i..src[i..].find(['{', ';']).map_or(src.len(), |e| i + e)];
            // a function definition: a parameter list before its body
            if let Some(n) = params(head) {
                let name = head[..head.find('(').unwrap()]
                    .split_whitespace()
                    .last()
                    .unwrap_or("?");
                assert!(n <= 12, "{name} takes {n} parameters");
                checked += 1;
            }
        }
        assert!(checked > 40, "only {checked} functions found");
        let resolve = include_str!("../../kernels/kv_resolve.cu").lines().count();
        assert!(
            resolve <= 1200,
            "kv_resolve.cu has {resolve} lines (at most 1,200: lab code belongs in tierkit-testkit)"
        );
        for switch in ["KV_ABL_", "#ifdef", "#ifndef"] {
            assert!(
                !src.contains(switch),
                "the KV module has a compile-time switch ({switch})"
            );
        }
    }
}
