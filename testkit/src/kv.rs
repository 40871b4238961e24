//! KV helpers for tests and benches: the byte patterns every KV test checks rows against
//! ([`pattern_row`], [`pattern_tokens`]) and the stand-in kernels of the decode-step benchmark
//! ([`KvStandins`]: the fully resident block-table conversion and a sparse-attention stand-in), and
//! those of the GPU serving benchmark (new-row writes, the weights read, the miss traffic of layers
//! a physical layer group does not hold).

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

/// The position picks a block-id top-k stands for: the tests' own reading of the block-id
/// contract (kv-elastic's `ResolveOptions::block_positions`, cuda-kernels'
/// `KvResolveOptions::block_positions`), to check the resolvers against. `topk int32 [rows, k]` of
/// block ids and each row's causal bound `bounds int32 [rows]` give `int32 [rows, k × block]`: id
/// `b >= 0` → positions `b × block + i` (`i < block`, block-major), `-1` where one is at or beyond
/// its row's bound; `-1` → `-1`; an id `< -1` is kept (invalid). `block <= 1`: `topk` itself.
pub fn expand_block_ids(topk: &[i32], k: usize, block: u32, bounds: &[i32]) -> Vec<i32> {
    if block <= 1 {
        return topk.to_vec();
    }
    let mut out = Vec::with_capacity(topk.len() * block as usize);
    for (row, &bound) in topk.chunks(k).zip(bounds) {
        for &id in row {
            for i in 0..block as i64 {
                let p = id as i64 * block as i64 + i;
                out.push(if id < 0 {
                    id
                } else if p < bound as i64 {
                    p as i32
                } else {
                    -1
                });
            }
        }
    }
    out
}

/// The KV resolve lab (`kernels/kv_lab.cu` after cuda-kernels' `kv_abi.cuh`): the empty launch
/// with the production resolve's parameters (`tierkit_kv_resolve_empty`), for the launch floor in
/// `kv_gpu_bench`.
pub const KV_LAB: KernelSource = KernelSource {
    name: "kv_lab",
    code: concat!(
        include_str!("../../cuda-kernels/kernels/kv_abi.cuh"),
        "\n",
        include_str!("../kernels/kv_lab.cu")
    ),
};

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
    write_rows: CudaFunction,
    stream_read: CudaFunction,
    shadow: CudaFunction,
}

impl KvStandins {
    /// Loads the stand-ins on `gpu` (NVRTC errors, CUDA errors).
    pub fn new(gpu: &Arc<Gpu>) -> Result<Self, CudaError> {
        Ok(KvStandins {
            resident: gpu.function(&KV_STANDINS, "tierkit_kv_resident_indices")?,
            attend: gpu.function(&KV_STANDINS, "tierkit_kv_attend")?,
            spin: gpu.function(&KV_STANDINS, "tierkit_spin_until")?,
            write_rows: gpu.function(&KV_STANDINS, "tierkit_kv_write_rows")?,
            stream_read: gpu.function(&KV_STANDINS, "tierkit_kv_stream_read")?,
            shadow: gpu.function(&KV_STANDINS, "tierkit_kv_shadow_fetch")?,
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

/// Blocks of [`KvStandins::stream_read_async`] (enough to saturate HBM on an H100 / H200).
pub const STREAM_READ_BLOCKS: u32 = 1056;

/// Blocks per plan segment of the shadow fetch (memory-level parallelism at small batches).
const SHADOW_SPLIT: u32 = 8;

/// The entries of a resolve plan as `tierkit_kv_shadow_fetch` reads them (`cuda_kernels::KvCopy`).
const KV_COPY_BYTES: usize = 16;
const _: () = assert!(std::mem::size_of::<cuda_kernels::KvCopy>() == KV_COPY_BYTES);

impl KvStandins {
    /// The step's new KV rows (serving-benchmark stand-in for the attention kernel's KV write):
    /// writes a pseudo-random row derived from `(row, layer, seed)` into arena row `rows[i]` of
    /// every plane `l < layers` (plane `l` at `arena + l × plane_bytes`); `rows` is `int32 [n]`
    /// (`-1` skipped), `row_bytes % 4 == 0` (`Shape` otherwise). Asynchronous.
    ///
    /// # Safety
    /// `arena` holds `layers × plane_bytes` bytes and every row of `rows` lies inside a plane;
    /// `rows` is a live device `int32 [n]`; no other stream reads those rows meanwhile.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn write_rows_async(
        &self,
        stream: &CudaStream,
        arena: u64,
        plane_bytes: u64,
        row_bytes: u32,
        layers: u32,
        rows: u64,
        n: u32,
        seed: u32,
    ) -> Result<(), CudaError> {
        if !row_bytes.is_multiple_of(4) {
            return Err(CudaError::Shape {
                what: "row_bytes (multiple of 4 for the row writer)",
                expected: row_bytes.next_multiple_of(4) as u64,
                got: row_bytes as u64,
            });
        }
        if n == 0 {
            return Ok(());
        }
        let mut b = stream.launch_builder(&self.write_rows);
        b.arg(&arena)
            .arg(&plane_bytes)
            .arg(&row_bytes)
            .arg(&layers)
            .arg(&rows)
            .arg(&n)
            .arg(&seed);
        let cfg = LaunchConfig {
            grid_dim: (n, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: argument list matches tierkit_kv_write_rows; buffers per the caller's contract.
        unsafe { b.launch(cfg) }
            .map_err(|e| CudaError::driver("cuLaunchKernel(tierkit_kv_write_rows)", e))?;
        Ok(())
    }

    /// The step's base cost (serving-benchmark stand-in for the weights a decode step streams):
    /// reads `bytes` bytes of device memory at `buf` (`bytes % 16 == 0`, `Shape` otherwise) and
    /// folds them into `sink` (`u32 [STREAM_READ_BLOCKS]`). Asynchronous.
    ///
    /// # Safety
    /// `buf` holds `bytes` bytes and `sink` [`STREAM_READ_BLOCKS`] `u32`, both live device memory.
    pub unsafe fn stream_read_async(
        &self,
        stream: &CudaStream,
        buf: u64,
        bytes: u64,
        sink: u64,
    ) -> Result<(), CudaError> {
        if !bytes.is_multiple_of(16) {
            return Err(CudaError::Shape {
                what: "bytes streamed (multiple of 16)",
                expected: bytes.next_multiple_of(16),
                got: bytes,
            });
        }
        let n16 = bytes / 16;
        let mut b = stream.launch_builder(&self.stream_read);
        b.arg(&buf).arg(&n16).arg(&sink);
        let cfg = LaunchConfig {
            grid_dim: (STREAM_READ_BLOCKS, 1, 1),
            block_dim: (512, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: argument list matches tierkit_kv_stream_read; buffers per the caller's contract.
        unsafe { b.launch(cfg) }
            .map_err(|e| CudaError::driver("cuLaunchKernel(tierkit_kv_stream_read)", e))?;
        Ok(())
    }

    /// The miss traffic of layers a physical layer group does not hold (serving-benchmark
    /// stand-in): for every entry of a resolve plan (`plan`: `KvCopy [segments][stride]`, `count`:
    /// `u32 [segments]` entries used), reads `reps` rows of `row_bytes` from mapped pinned host
    /// memory `host` (`host_rows` rows, device address) at pseudo-random rows (from slot, position,
    /// rep and `salt`), a warp per row, folded into `sink` (`u32 [segments]`). The bytes read are
    /// `reps × row_bytes` per plan entry, over PCIe. `row_bytes % 16 == 0` and `host_rows > 0`
    /// (`Shape` otherwise). Asynchronous.
    ///
    /// # Safety
    /// Live device buffers of the documented shapes; `host` readable by the device (mapped pinned)
    /// for `host_rows × row_bytes` bytes.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn shadow_fetch_async(
        &self,
        stream: &CudaStream,
        plan: u64,
        count: u64,
        segments: u32,
        stride: u32,
        host: u64,
        host_rows: u64,
        row_bytes: u32,
        reps: u32,
        salt: u32,
        sink: u64,
    ) -> Result<(), CudaError> {
        if !row_bytes.is_multiple_of(16) || host_rows == 0 {
            return Err(CudaError::Shape {
                what: "row_bytes (multiple of 16) and host rows (> 0) of the shadow fetch",
                expected: row_bytes.next_multiple_of(16) as u64,
                got: row_bytes as u64,
            });
        }
        if segments == 0 || reps == 0 {
            return Ok(());
        }
        let mut b = stream.launch_builder(&self.shadow);
        b.arg(&plan)
            .arg(&count)
            .arg(&stride)
            .arg(&host)
            .arg(&host_rows)
            .arg(&row_bytes)
            .arg(&reps)
            .arg(&salt)
            .arg(&sink);
        let cfg = LaunchConfig {
            grid_dim: (segments, reps.min(SHADOW_SPLIT), 1),
            block_dim: (512, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: argument list matches tierkit_kv_shadow_fetch; buffers per the caller's contract.
        unsafe { b.launch(cfg) }
            .map_err(|e| CudaError::driver("cuLaunchKernel(tierkit_kv_shadow_fetch)", e))?;
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

    #[test]
    fn block_ids_expand_block_major_within_each_rows_bound() {
        // Two rows of two ids, blocks of 4: row 0 sees 10 positions, row 1 sees 3.
        let got = expand_block_ids(&[2, -1, 0, -3], 2, 4, &[10, 3]);
        assert_eq!(
            got,
            [
                [8, 9, -1, -1, -1, -1, -1, -1], // block 2 straddles 10; padding
                [0, 1, 2, -1, -3, -3, -3, -3],  // block 0 straddles 3; an invalid id stays
            ]
            .concat()
        );
        assert_eq!(expand_block_ids(&[5, -1], 2, 1, &[1]), [5, -1]);
    }
}

/// The empty resolve of [`KV_LAB`] (`tierkit_kv_resolve_empty`), launched with a production
/// resolve's grid, block, dynamic shared memory and parameter bytes: the launch floor.
#[derive(Debug, Clone)]
pub struct KvLab {
    empty: CudaFunction,
}

/// Bytes of `struct KvCall` and `struct KvDivs` (cuda-kernels' `kv_abi.cuh`), passed as opaque
/// words: the empty kernel reads none of them, only their size matters to the launch.
#[repr(C)]
#[derive(Clone, Copy)]
struct ParamWords<const N: usize>([u64; N]);
// SAFETY: plain words, `repr(C)`, the size of the kernel parameter they stand for.
unsafe impl<const N: usize> cuda_kernels::cudarc_driver::DeviceRepr for ParamWords<N> {}

impl KvLab {
    /// Loads the lab on `gpu`.
    ///
    /// # Errors
    /// NVRTC / driver errors.
    pub fn new(gpu: &Arc<Gpu>) -> Result<Self, CudaError> {
        Ok(KvLab {
            empty: gpu.function(&KV_LAB, "tierkit_kv_resolve_empty")?,
        })
    }

    /// Launches the empty resolve on `stream` with `sessions + 1` blocks of `block` threads and
    /// `smem` bytes of dynamic shared memory (a production resolve's launch shape).
    ///
    /// # Errors
    /// The driver's launch error.
    pub fn launch_empty(
        &self,
        stream: &CudaStream,
        dims: &cuda_kernels::KvDims,
        tables: &cuda_kernels::KvTables,
        sessions: u32,
        block: u32,
        smem: u32,
    ) -> Result<(), CudaError> {
        // KvCall: 13 u64 + 8 u32 = 17 words; KvDivs: 20 u32 = 10 words.
        let (call, divs) = (ParamWords([0u64; 17]), ParamWords([0u64; 10]));
        let mut b = stream.launch_builder(&self.empty);
        b.arg(dims).arg(tables).arg(&call).arg(&divs);
        let cfg = LaunchConfig {
            grid_dim: (sessions + 1, 1, 1),
            block_dim: (block, 1, 1),
            shared_mem_bytes: smem,
        };
        // SAFETY: the parameters have the sizes and order of tierkit_kv_resolve_empty's (KvDims,
        // KvTables, KvCall, KvDivs); the kernel reads nothing.
        unsafe { b.launch(cfg) }
            .map_err(|e| CudaError::driver("cuLaunchKernel(tierkit_kv_resolve_empty)", e))?;
        Ok(())
    }
}
