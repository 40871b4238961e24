//! The indirection-table update kernel (`tierkit_table_update` in `kernels/table.cu`): a typed
//! launch ([`TableUpdater`]) and its CPU reference ([`apply_table_updates_cpu`]).
//!
//! An indirection table is a device array of `u64` device addresses at a fixed address (so a
//! captured CUDA graph stays valid); kernels read `table[i]` to find their data. An update sets
//! `table[idx] = val` for a batch of `(idx, val)` pairs, in stream order with the kernels that
//! read the table: launched on the step stream at a step boundary, the next step's kernels see
//! the new addresses and the previous ones the old.

use cudarc::driver::{CudaFunction, CudaStream, DeviceRepr, LaunchConfig, PushKernelArg};

use crate::device::{Gpu, TABLE_MODULE};
use crate::error::{drv, CudaError, Result};
use crate::mem::DeviceBuffer;

/// Table entries one `tierkit_table_update` launch can set (must match `TIERKIT_MAX_UPDATES` in
/// `table.cu`); [`TableUpdater::launch`] splits larger batches into several launches.
pub const MAX_UPDATES_PER_LAUNCH: usize = 64;

/// Kernel parameter of `tierkit_table_update` (passed by value: no host buffer outlives the call).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct TableUpdate {
    n: u32,
    idx: [u32; MAX_UPDATES_PER_LAUNCH],
    val: [u64; MAX_UPDATES_PER_LAUNCH],
}
// SAFETY: `#[repr(C)]` plain integers with the same field order, types and alignment as the
// `TierkitTableUpdate` struct of `table.cu` (u32, u32[64], then u64[64] at an 8-aligned offset).
unsafe impl DeviceRepr for TableUpdate {}

/// Checks an update batch against a table of `table_len` entries: every index below
/// `table_len` (the first one that is not is reported) and no index twice (the smallest repeated
/// one is; one launch writes its entries in parallel, so a repeated index would leave either
/// value). Its scratch is a sorted copy of the batch's indices, not a table-sized bitmap.
fn check_updates(table_len: usize, updates: &[(u32, u64)]) -> Result<()> {
    if let Some(&(idx, _)) = updates.iter().find(|u| u.0 as usize >= table_len) {
        return Err(CudaError::OutOfRange {
            what: "table update index",
            value: idx as u64,
            limit: table_len as u64,
        });
    }
    let mut idx: Vec<u32> = updates.iter().map(|u| u.0).collect();
    idx.sort_unstable();
    match idx.windows(2).find(|w| w[0] == w[1]) {
        Some(w) => Err(CudaError::Duplicate {
            what: "table update index",
            value: w[0] as u64,
        }),
        None => Ok(()),
    }
}

/// CPU reference of [`TableUpdater::launch`]: `table[idx] = val` for each `(idx, val)` of
/// `updates` (`table`: `[len]` u64 device addresses; `updates`: distinct indices `< len`).
///
/// # Errors
/// [`CudaError::OutOfRange`] for an index `>= table.len()`, [`CudaError::Duplicate`] for an
/// index given twice. Nothing is written on error.
pub fn apply_table_updates_cpu(table: &mut [u64], updates: &[(u32, u64)]) -> Result<()> {
    check_updates(table.len(), updates)?;
    for &(idx, val) in updates {
        table[idx as usize] = val;
    }
    Ok(())
}

/// Typed launcher of `tierkit_table_update` (the function loaded once per [`Gpu`] context).
#[derive(Debug, Clone)]
pub struct TableUpdater {
    f: CudaFunction,
}

impl TableUpdater {
    /// Loads the kernel (compiling [`TABLE_MODULE`] on first use in this context).
    ///
    /// # Errors
    /// [`CudaError::Compile`] / [`CudaError::Driver`] from NVRTC or the module load.
    pub fn new(gpu: &Gpu) -> Result<Self> {
        Ok(TableUpdater {
            f: gpu.function(&TABLE_MODULE, "tierkit_table_update")?,
        })
    }

    /// Enqueues `table[idx] = val` for every `(idx, val)` of `updates` on `stream`: one launch
    /// of one block of [`MAX_UPDATES_PER_LAUNCH`] threads per [`MAX_UPDATES_PER_LAUNCH`] pairs
    /// (nothing for an empty batch). `table`: `[len]` u64 device addresses; `updates`: distinct
    /// indices `< len`, any values. Asynchronous: kernels queued on `stream` after this call see
    /// the new entries, those before it the old.
    ///
    /// # Errors
    /// [`CudaError::OutOfRange`] / [`CudaError::Duplicate`] as [`apply_table_updates_cpu`]
    /// (checked before any launch: nothing is enqueued); [`CudaError::Driver`] if a launch
    /// fails (earlier chunks of a batch above 64 pairs may then have been enqueued).
    pub fn launch(
        &self,
        stream: &CudaStream,
        table: &DeviceBuffer<u64>,
        updates: &[(u32, u64)],
    ) -> Result<()> {
        check_updates(table.len(), updates)?;
        let table = table.device_ptr();
        for chunk in updates.chunks(MAX_UPDATES_PER_LAUNCH) {
            let mut u = TableUpdate {
                n: chunk.len() as u32,
                idx: [0; MAX_UPDATES_PER_LAUNCH],
                val: [0; MAX_UPDATES_PER_LAUNCH],
            };
            for (i, &(idx, val)) in chunk.iter().enumerate() {
                u.idx[i] = idx;
                u.val[i] = val;
            }
            let cfg = LaunchConfig {
                grid_dim: (1, 1, 1),
                block_dim: (MAX_UPDATES_PER_LAUNCH as u32, 1, 1),
                shared_mem_bytes: 0,
            };
            let mut b = stream.launch_builder(&self.f);
            b.arg(&table).arg(&u);
            // SAFETY: `tierkit_table_update(u64* table, TierkitTableUpdate u)`; every idx is an
            // index < len of the table allocation (checked above), and the kernel writes only
            // `table[idx[i]]` for i < n.
            unsafe { b.launch(cfg) }.map_err(drv("cuLaunchKernel(tierkit_table_update)"))?;
        }
        Ok(())
    }
}

/// Where a table's HBM slots lie: `slots_per_layer` slots of `slot_bytes` per layer, layer after
/// layer from `hbm` (the layout of `expert_residency::gpu::ExpertStore`'s slots).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotLayout {
    /// Device address of slot 0 of layer 0.
    pub hbm: u64,
    /// Bytes per slot (an expert).
    pub slot_bytes: u64,
    /// Slots per layer.
    pub slots_per_layer: u32,
}

impl SlotLayout {
    /// The slot (`0 .. slots_per_layer`) `addr` names in `layer`, or `-1` (not an HBM slot of
    /// that layer: the expert is read in place from host memory).
    pub fn slot_of(&self, layer: u32, addr: u64) -> i32 {
        let span = self.slot_bytes * self.slots_per_layer as u64;
        let base = self.hbm + layer as u64 * span;
        if self.slot_bytes == 0 || addr < base || addr >= base + span {
            return -1;
        }
        let off = addr - base;
        if !off.is_multiple_of(self.slot_bytes) {
            return -1;
        }
        (off / self.slot_bytes) as i32
    }
}

/// CPU reference of [`SlotIdLauncher::launch`]: `out[c] = layout.slot_of(c / experts, table[c])`.
///
/// # Errors
/// [`CudaError::Shape`] if `out` and `table` differ in length or `experts` is 0.
pub fn table_slot_ids_cpu(
    table: &[u64],
    experts: u32,
    layout: SlotLayout,
    out: &mut [i32],
) -> Result<()> {
    if out.len() != table.len() || experts == 0 {
        return Err(CudaError::Shape {
            what: "slot ids (one per table cell)",
            expected: table.len() as u64,
            got: out.len() as u64,
        });
    }
    for (c, (o, &p)) in out.iter_mut().zip(table).enumerate() {
        *o = layout.slot_of(c as u32 / experts, p);
    }
    Ok(())
}

/// Typed launcher of `tierkit_table_slot_ids`: the slot-id form of an indirection table, for
/// engines that index a stacked weight tensor (`slots[layer, slot]` for a hot expert, the host
/// copy when `-1`).
#[derive(Debug, Clone)]
pub struct SlotIdLauncher {
    f: CudaFunction,
}

impl SlotIdLauncher {
    /// Loads the kernel (compiling [`TABLE_MODULE`] on first use in this context).
    ///
    /// # Errors
    /// NVRTC or module-load errors.
    pub fn new(gpu: &Gpu) -> Result<Self> {
        Ok(SlotIdLauncher {
            f: gpu.function(&TABLE_MODULE, "tierkit_table_slot_ids")?,
        })
    }

    /// Enqueues `out[c] = layout.slot_of(c / experts, table[c])` for `c < cells` on `stream`
    /// (no allocation, no synchronisation, capturable; ordered with the flips on the stream).
    ///
    /// # Errors
    /// [`CudaError::OutOfRange`] for zero `cells` / `experts` or a null / misaligned pointer;
    /// CUDA launch errors.
    ///
    /// # Safety
    /// `table` holds `cells` u64 and `out` `cells` i32 of device memory of `stream`'s context,
    /// allocated until the kernel has run; the context is current on this thread.
    pub unsafe fn launch(
        &self,
        stream: &CudaStream,
        table: u64,
        out: u64,
        cells: u32,
        experts: u32,
        layout: SlotLayout,
    ) -> Result<()> {
        if cells == 0 || experts == 0 || layout.slot_bytes == 0 {
            return Err(CudaError::OutOfRange {
                what: "slot-id cells / experts / slot bytes (zero)",
                value: 0,
                limit: 1,
            });
        }
        if table == 0 || !table.is_multiple_of(8) || out == 0 || !out.is_multiple_of(4) {
            return Err(CudaError::Dtype {
                what: "table / slot-id pointer (null or misaligned)",
                expected: "uint64 table, int32 slot ids",
                got: "misaligned pointer",
            });
        }
        let cfg = LaunchConfig {
            grid_dim: (cells.div_ceil(256).clamp(1, 1024), 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = stream.launch_builder(&self.f);
        b.arg(&table)
            .arg(&out)
            .arg(&cells)
            .arg(&experts)
            .arg(&layout.hbm)
            .arg(&layout.slot_bytes)
            .arg(&layout.slots_per_layer);
        // SAFETY: the argument list matches `tierkit_table_slot_ids` (ptr, ptr, u32, u32, u64,
        // u64, u32); the kernel reads table[c] and writes out[c] for c < cells only (caller's
        // contract for both allocations).
        unsafe { b.launch(cfg) }.map_err(drv("cuLaunchKernel(tierkit_table_slot_ids)"))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_ids_name_hbm_slots_and_mark_host_reads() {
        let layout = SlotLayout {
            hbm: 1 << 20,
            slot_bytes: 256,
            slots_per_layer: 3,
        };
        // layer 0: slot 2, host, layer 1's slot 0 (not this layer's);
        // layer 1: slot 1, misaligned, slot 0
        let table = [
            (1 << 20) + 512,
            4096,
            (1 << 20) + 768,
            (1 << 20) + 768 + 256,
            (1 << 20) + 769,
            (1 << 20) + 768,
        ];
        let mut out = [0i32; 6];
        table_slot_ids_cpu(&table, 3, layout, &mut out).unwrap();
        assert_eq!(out, [2, -1, -1, 1, -1, 0]);
        assert!(table_slot_ids_cpu(&table, 3, layout, &mut out[..2]).is_err());
    }

    #[test]
    fn cpu_reference_sets_entries_and_rejects_bad_batches() {
        let mut t = vec![10u64, 11, 12, 13];
        apply_table_updates_cpu(&mut t, &[(2, 99), (0, 7)]).unwrap();
        assert_eq!(t, vec![7, 11, 99, 13]);
        apply_table_updates_cpu(&mut t, &[]).unwrap();
        assert_eq!(t, vec![7, 11, 99, 13]);
        assert_eq!(
            apply_table_updates_cpu(&mut t, &[(1, 5), (4, 6)]),
            Err(CudaError::OutOfRange {
                what: "table update index",
                value: 4,
                limit: 4
            })
        );
        assert_eq!(
            apply_table_updates_cpu(&mut t, &[(1, 5), (1, 6)]),
            Err(CudaError::Duplicate {
                what: "table update index",
                value: 1
            })
        );
        assert_eq!(t, vec![7, 11, 99, 13], "nothing written on error");
        // more than one launch's worth: every entry set
        let mut big = vec![0u64; 200];
        let ups: Vec<(u32, u64)> = (0..150).map(|i| (i * 4 / 3, i as u64 + 1)).collect();
        apply_table_updates_cpu(&mut big, &ups).unwrap();
        assert!(ups.iter().all(|&(i, v)| big[i as usize] == v));
    }

    #[test]
    fn checking_a_batch_allocates_no_table_sized_scratch() {
        // A 64 Mi-entry table (lazily zeroed, never touched but for the two entries): the check
        // of a two-entry batch must not need a 64 MiB bitmap under a 16 MiB cap.
        tierkit_testkit::under_memory_limit(
            "table::tests::checking_a_batch_allocates_no_table_sized_scratch",
            16 << 20,
            || vec![0u64; 64 << 20],
            |mut table| {
                apply_table_updates_cpu(&mut table, &[(7, 1), ((64 << 20) - 1, 2)]).unwrap();
                assert_eq!((table[7], table[(64 << 20) - 1]), (1, 2));
                assert!(apply_table_updates_cpu(&mut table, &[(3, 1), (3, 2)]).is_err());
            },
        );
    }
}
