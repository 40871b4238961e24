//! KV helpers for tests and benches: the byte patterns every KV test checks rows against
//! ([`pattern_row`], [`pattern_tokens`]) and the stand-in kernels of the decode-step benchmark
//! ([`KvStandins`]: the fully resident block-table conversion and a sparse-attention stand-in).

use std::sync::Arc;

use cuda_kernels::cudarc_driver::{CudaFunction, CudaStream, LaunchConfig, PushKernelArg};
use cuda_kernels::{CudaError, Gpu, KernelSource};

/// Fills `out` with bytes derived from `(session, position, layer)` (splitmix64 stream), so a
/// row read from a wrong address (other session, position or layer) is always caught in tests.
pub fn pattern_row(session: u64, position: u32, layer: u32, out: &mut [u8]) {
    let mut state = session
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add((position as u64) << 20)
        .wrapping_add(layer as u64)
        ^ 0xD1B5_4A32_D192_ED03;
    for chunk in out.chunks_mut(8) {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        let bytes = z.to_le_bytes();
        chunk.copy_from_slice(&bytes[..chunk.len()]);
    }
}

/// Builds `tokens` committed tokens for positions `start..start + tokens` of `session` in the KV
/// host layout (`u8 [tokens][layers][row_bytes]`), each row filled by [`pattern_row`].
pub fn pattern_tokens(
    row_bytes: u32,
    layers: u32,
    session: u64,
    start: u32,
    tokens: u32,
) -> Vec<u8> {
    let rb = row_bytes as usize;
    let mut out = vec![0u8; tokens as usize * layers as usize * rb];
    for t in 0..tokens {
        for l in 0..layers {
            let off = (t as usize * layers as usize + l as usize) * rb;
            pattern_row(session, start + t, l, &mut out[off..off + rb]);
        }
    }
    out
}

/// The stand-in kernels (`kernels/kv_standins.cu`).
pub const KV_STANDINS: KernelSource = KernelSource {
    name: "kv_standins",
    code: include_str!("../kernels/kv_standins.cu"),
};

/// Threads per block of the stand-ins.
const BLOCK: u32 = 512;

/// The decode-step benchmark's stand-ins, loaded on one GPU.
#[derive(Debug, Clone)]
pub struct KvStandins {
    resident: CudaFunction,
    attend: CudaFunction,
    spin: CudaFunction,
}

impl KvStandins {
    /// Loads the stand-ins on `gpu` (NVRTC errors, CUDA errors).
    pub fn new(gpu: &Arc<Gpu>) -> Result<Self, CudaError> {
        Ok(KvStandins {
            resident: gpu.function(&KV_STANDINS, "tierkit_kv_resident_indices")?,
            attend: gpu.function(&KV_STANDINS, "tierkit_kv_attend")?,
            spin: gpu.function(&KV_STANDINS, "tierkit_spin_until")?,
        })
    }

    /// Baseline of a fully resident cache (what an engine without tiering runs): positions → rows
    /// through a block table (`int32 [sessions][max_blocks]`), `-1` for invalid picks. Asynchronous.
    ///
    /// # Safety
    /// Device buffers of the documented shapes (`topk` and `indices` `int32 [rows, k]`, `qsl`
    /// `int32 [sessions + 1]`, `seq_lens` `int32 [sessions]`, `valid_count` `int32 [rows]`).
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn resident_indices_async(
        &self,
        stream: &CudaStream,
        topk: u64,
        qsl: u64,
        seq_lens: u64,
        block_table: u64,
        max_blocks: u32,
        page_rows: u32,
        sessions: u32,
        k: u32,
        indices: u64,
        valid_count: u64,
    ) -> Result<(), CudaError> {
        if sessions == 0 {
            return Ok(());
        }
        let mut b = stream.launch_builder(&self.resident);
        b.arg(&topk)
            .arg(&qsl)
            .arg(&seq_lens)
            .arg(&block_table)
            .arg(&max_blocks)
            .arg(&page_rows)
            .arg(&sessions)
            .arg(&k)
            .arg(&indices)
            .arg(&valid_count);
        let cfg = LaunchConfig {
            grid_dim: (sessions, 1, 1),
            block_dim: (BLOCK, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: argument list matches tierkit_kv_resident_indices; buffers per the caller.
        unsafe { b.launch(cfg) }
            .map_err(|e| CudaError::driver("cuLaunchKernel(tierkit_kv_resident_indices)", e))?;
        Ok(())
    }

    /// Sparse-attention stand-in (gather + dot) over one arena plane (`plane`: device pointer of
    /// `u8 [arena_rows][row_bytes]`): for each query row, the mean over its valid picks of
    /// `dot(row bytes, q)`; `q` is `f32 [row_bytes]`, `out` `f32 [rows]`. Needs
    /// `row_bytes % 16 == 0` (`Shape` otherwise). Asynchronous.
    ///
    /// # Safety
    /// Device buffers of the documented shapes; `indices` hold rows inside the plane or `-1`.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn attend_async(
        &self,
        stream: &CudaStream,
        plane: u64,
        row_bytes: u32,
        indices: u64,
        valid_count: u64,
        rows: u32,
        k: u32,
        q: u64,
        out: u64,
    ) -> Result<(), CudaError> {
        let rb = row_bytes;
        if !rb.is_multiple_of(16) {
            return Err(CudaError::Shape {
                what: "row_bytes (multiple of 16 for the attention stand-in)",
                expected: rb.next_multiple_of(16) as u64,
                got: rb as u64,
            });
        }
        if rows == 0 {
            return Ok(());
        }
        let mut b = stream.launch_builder(&self.attend);
        b.arg(&plane)
            .arg(&rb)
            .arg(&indices)
            .arg(&valid_count)
            .arg(&k)
            .arg(&q)
            .arg(&out);
        let cfg = LaunchConfig {
            grid_dim: (rows, 1, 1),
            block_dim: (512, 1, 1),
            shared_mem_bytes: rb * 4,
        };
        // SAFETY: argument list matches tierkit_kv_attend; buffers per the caller's contract.
        unsafe { b.launch(cfg) }
            .map_err(|e| CudaError::driver("cuLaunchKernel(tierkit_kv_attend)", e))?;
        Ok(())
    }
}

impl KvStandins {
    /// A gate: holds `stream` until the host writes a non-zero `u32` at `flag` (the device address
    /// of mapped pinned memory, e.g. a `PinnedBuffer<u32>`), or `max_ns` passed. Work queued on
    /// several gated streams starts together when the host releases the flag. Asynchronous.
    ///
    /// # Safety
    /// `flag` addresses a `u32` readable by the device until the kernel ends.
    pub unsafe fn spin_until_async(
        &self,
        stream: &CudaStream,
        flag: u64,
        max_ns: u64,
    ) -> Result<(), CudaError> {
        let mut b = stream.launch_builder(&self.spin);
        b.arg(&flag).arg(&max_ns);
        let cfg = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (1, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: argument list matches tierkit_spin_until; `flag` per the caller's contract.
        unsafe { b.launch(cfg) }
            .map_err(|e| CudaError::driver("cuLaunchKernel(tierkit_spin_until)", e))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_differs_by_every_key() {
        let mut a = [0u8; 16];
        let mut b = [0u8; 16];
        pattern_row(1, 2, 0, &mut a);
        for (s, p, l) in [(2, 2, 0), (1, 3, 0), (1, 2, 1)] {
            pattern_row(s, p, l, &mut b);
            assert_ne!(a, b);
        }
        pattern_row(1, 2, 0, &mut b);
        assert_eq!(a, b);
    }
}
