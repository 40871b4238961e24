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
/// `table_len` and no index twice (one launch writes its entries in parallel, so a repeated
/// index would leave either value).
fn check_updates(table_len: usize, updates: &[(u32, u64)]) -> Result<()> {
    let mut seen = vec![false; table_len];
    for &(idx, _) in updates {
        let Some(s) = seen.get_mut(idx as usize) else {
            return Err(CudaError::OutOfRange {
                what: "table update index",
                value: idx as u64,
                limit: table_len as u64,
            });
        };
        if std::mem::replace(s, true) {
            return Err(CudaError::Duplicate {
                what: "table update index",
                value: idx as u64,
            });
        }
    }
    Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
