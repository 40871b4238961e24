//! Expert-bank test helpers: the self-checking expert byte pattern (with its CPU check), the
//! reader kernels that read experts through an indirection table of `u64` expert addresses (an
//! expert store's: `expert_residency::gpu::ExpertStore::table_ptr`; a checksum reader and a
//! bandwidth reader standing in for expert FFN weight reads), and [`pattern_table`], patterned
//! experts in mapped pinned memory behind such a table, for tests below the expert tier.

use cuda_kernels::cudarc_driver::{CudaFunction, CudaStream, LaunchConfig, PushKernelArg};
use cuda_kernels::{CudaError, DeviceBuffer, Gpu, KernelSource, PinnedBuffer, Result};

/// The reader kernels (`tierkit_verify_experts`, `tierkit_touch_experts`).
pub const EXPERT_READERS_MODULE: KernelSource = KernelSource {
    name: "testkit_expert_readers",
    code: include_str!("../kernels/expert_readers.cu"),
};

/// Checksum mix shared with the `tierkit_verify_experts` kernel.
fn mix(w: u32, i: u32) -> u32 {
    let h = (w ^ i.wrapping_mul(0x9E37_79B9)).wrapping_mul(0x85EB_CA6B);
    h ^ (h >> 13)
}

/// Writes the self-checking test pattern into an expert's bytes (length a multiple of 4, ≥ 8):
/// word 0 = `tag` (the flat index `layer * experts + expert`), words `1..last` pseudo-random
/// from `(seed, tag)`, last word = `Σ mix(w[i], i)` over the others (what the checksum reader
/// kernel recomputes, so a torn or stale read is caught).
pub fn write_expert_pattern(bytes: &mut [u8], tag: u32, seed: u64) {
    let words: &mut [u32] = bytemuck::cast_slice_mut(bytes);
    let last = words.len() - 1;
    words[0] = tag;
    let mut x = seed ^ ((tag as u64) << 32) ^ 0xD1B5_4A32_D192_ED03;
    let mut sum = mix(tag, 0);
    for (i, w) in words.iter_mut().enumerate().take(last).skip(1) {
        // splitmix64
        x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        *w = (z ^ (z >> 31)) as u32;
        sum = sum.wrapping_add(mix(*w, i as u32));
    }
    words[last] = sum;
}

/// CPU reference of the checksum reader: whether `bytes` hold a valid pattern with tag `tag`.
pub fn check_expert_pattern(bytes: &[u8], tag: u32) -> bool {
    let Ok(words) = bytemuck::try_cast_slice::<u8, u32>(bytes) else {
        return false;
    };
    if words.len() < 2 || words[0] != tag {
        return false;
    }
    let last = words.len() - 1;
    let sum = words[..last]
        .iter()
        .enumerate()
        .fold(0u32, |s, (i, &w)| s.wrapping_add(mix(w, i as u32)));
    sum == words[last]
}

/// Launchers of the reader kernels of [`EXPERT_READERS_MODULE`] over an indirection table:
/// `table_ptr` is the device address of `u64 [cells]` expert addresses (flat index
/// `layer * experts + expert`), each pointing at `expert_bytes` readable bytes.
#[derive(Debug, Clone)]
pub struct ExpertReaders {
    f_verify: CudaFunction,
    f_touch: CudaFunction,
}

impl ExpertReaders {
    /// Loads both kernels (compiling the module on first use in `gpu`'s context).
    ///
    /// # Errors
    /// NVRTC or module-load errors.
    pub fn new(gpu: &Gpu) -> Result<Self> {
        Ok(ExpertReaders {
            f_verify: gpu.function(&EXPERT_READERS_MODULE, "tierkit_verify_experts")?,
            f_touch: gpu.function(&EXPERT_READERS_MODULE, "tierkit_touch_experts")?,
        })
    }

    fn check_picks(&self, picks: &DeviceBuffer<u32>) -> Result<()> {
        if picks.is_empty() || picks.len() > u32::MAX as usize {
            return Err(CudaError::Shape {
                what: "picks (flat layer * experts + expert indices)",
                expected: 1,
                got: picks.len() as u64,
            });
        }
        Ok(())
    }

    /// Launches the checksum reader on `stream`: one block per entry of `picks` (flat indices
    /// `layer * experts + expert`, each `< layers * experts`: not checked, the caller's contract) reads
    /// that expert through the indirection table at `table_ptr` (HBM or mapped host, `expert_bytes`
    /// each) and verifies the pattern of [`write_expert_pattern`]; `errors` (u32 `[2]`) gets
    /// `[0] += bad`, `[1] = last bad index`.
    ///
    /// # Errors
    /// [`CudaError::Shape`] for empty `picks`, `errors` shorter than 2 or experts under 8
    /// bytes; launch errors.
    pub fn launch_checksum_reader(
        &self,
        (table_ptr, expert_bytes): (u64, u64),
        stream: &CudaStream,
        picks: &DeviceBuffer<u32>,
        errors: &DeviceBuffer<u32>,
    ) -> Result<()> {
        self.check_picks(picks)?;
        if errors.len() < 2 || expert_bytes < 8 {
            return Err(CudaError::Shape {
                what: "errors (u32 [2])",
                expected: 2,
                got: errors.len() as u64,
            });
        }
        let cfg = LaunchConfig {
            grid_dim: (picks.len() as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let (table, p, n, words, e) = (
            table_ptr,
            picks.device_ptr(),
            picks.len() as u32,
            expert_bytes / 4,
            errors.device_ptr(),
        );
        let mut b = stream.launch_builder(&self.f_verify);
        b.arg(&table).arg(&p).arg(&n).arg(&words).arg(&e);
        // SAFETY: signature (u64*, u32*, u32, u64, u32*) of `tierkit_verify_experts`; the kernel
        // reads `picks[0..n]`, table entries (valid pointers to `expert_bytes` bytes each) and
        // writes `errors[0..2]`. The caller guarantees pick values are < layers * experts.
        unsafe { b.launch(cfg) }
            .map_err(|e| CudaError::driver("cuLaunchKernel(tierkit_verify_experts)", e))?;
        Ok(())
    }

    /// Launches the bandwidth reader on `stream` (a stand-in for expert FFN weight reads):
    /// `blocks_per_expert` blocks of 256 threads read each picked expert whole (`expert_bytes`)
    /// through the table at `table_ptr` with 16-byte loads. `sink` (u32 `[1]`) keeps the loads
    /// alive.
    ///
    /// # Errors
    /// [`CudaError::Shape`] for empty `picks` or `sink`; launch errors.
    pub fn launch_touch_reader(
        &self,
        (table_ptr, expert_bytes): (u64, u64),
        stream: &CudaStream,
        picks: &DeviceBuffer<u32>,
        blocks_per_expert: u32,
        sink: &DeviceBuffer<u32>,
    ) -> Result<()> {
        self.check_picks(picks)?;
        if sink.is_empty() {
            return Err(CudaError::Shape {
                what: "sink (u32 [1])",
                expected: 1,
                got: 0,
            });
        }
        let cfg = LaunchConfig {
            grid_dim: (blocks_per_expert.max(1), picks.len() as u32, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let (table, p, bytes, sk) = (
            table_ptr,
            picks.device_ptr(),
            expert_bytes,
            sink.device_ptr(),
        );
        let mut b = stream.launch_builder(&self.f_touch);
        b.arg(&table).arg(&p).arg(&bytes).arg(&sk);
        // SAFETY: signature (u64*, u32*, u64, u32*) of `tierkit_touch_experts`; reads table
        // entries for picks (< layers * experts, caller's contract) and `expert_bytes` bytes
        // behind each; writes at most `sink[0]`.
        unsafe { b.launch(cfg) }
            .map_err(|e| CudaError::driver("cuLaunchKernel(tierkit_touch_experts)", e))?;
        Ok(())
    }
}

/// `experts` experts of `expert_bytes` bytes (a multiple of 4, at least 8) in mapped pinned
/// host memory, expert `i` holding [`write_expert_pattern`] with tag `i` and `seed`, and the
/// device table `u64 [experts]` of their mapped addresses: what a checksum reader reads in place
/// (every expert cold), for tests of the memory and sync types below the expert tier. Keep the
/// pinned buffer alive while kernels read through the table.
///
/// # Errors
/// CUDA errors of the allocations (`CUDA_ERROR_OUT_OF_MEMORY`).
pub fn pattern_table(
    gpu: &Gpu,
    experts: u32,
    expert_bytes: u64,
    seed: u64,
) -> Result<(PinnedBuffer<u8>, DeviceBuffer<u64>)> {
    let n = expert_bytes as usize;
    let mut host = PinnedBuffer::<u8>::zeroed(gpu.ctx(), experts as usize * n)?;
    for (i, bytes) in host.as_mut_slice().chunks_mut(n).enumerate() {
        write_expert_pattern(bytes, i as u32, seed);
    }
    let addrs: Vec<u64> = (0..experts as u64)
        .map(|i| host.device_ptr() + i * expert_bytes)
        .collect();
    let table = DeviceBuffer::from_host(gpu.ctx(), &addrs)?;
    Ok((host, table))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_roundtrip_and_tear_detection() {
        let mut a = vec![0u32; 1024];
        let mut b = vec![0u32; 1024];
        write_expert_pattern(bytemuck::cast_slice_mut(&mut a), 7, 1);
        write_expert_pattern(bytemuck::cast_slice_mut(&mut b), 8, 1);
        assert!(check_expert_pattern(bytemuck::cast_slice(&a), 7));
        assert!(!check_expert_pattern(bytemuck::cast_slice(&a), 8));
        // torn: first half of b, second half of a, with a's tag
        let mut torn = a.clone();
        torn[1..512].copy_from_slice(&b[1..512]);
        assert!(!check_expert_pattern(bytemuck::cast_slice(&torn), 7));
    }
}
