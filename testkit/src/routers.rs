//! Stand-in routers for the fused counting path (`kernels/router_standins.cu`, with
//! `cuda-kernels`' `expert_count.cuh` prepended): `tierkit_standin_{router,gate}_m<MODE>` (one
//! kernel per way of calling the header; the modes are listed in the `.cu` file) and
//! `tierkit_count_ids_striped_{i32,i64}` (the striped call over arbitrary ids), with their
//! launches. Only tests and benches compile them; engines compile their own routers.

use std::sync::OnceLock;

use cuda_kernels::cudarc_driver::{CudaFunction, CudaStream, LaunchConfig, PushKernelArg};
use cuda_kernels::{CudaError, DeviceBuffer, KernelSource, PickCounterGpu, Result};

/// The stand-in module: the fused-path header followed by `router_standins.cu`.
pub fn router_standins() -> KernelSource {
    static CODE: OnceLock<String> = OnceLock::new();
    let code = CODE.get_or_init(|| {
        format!(
            "{}\n{}",
            cuda_kernels::EXPERT_COUNT_CUH,
            include_str!("../kernels/router_standins.cu")
        )
    });
    KernelSource {
        name: "testkit_router_standins",
        code,
    }
}

/// Launches one layer of the stand-in router `f` (`tierkit_standin_{router,gate}_m<MODE>`) on
/// `stream`: one warp per token, blocks of 256 threads. `dims` = `(tokens, experts, k)` (experts
/// ≤ 256, k ≤ 32); `logits` f32 `[tokens, experts]`, `ids` i32 `[tokens, k]` (output),
/// `prev_ids` i32 (the previous layer's picks, or the step buffer for modes 29/30), `weights`
/// f32 `[tokens, k]` (gate kernels only), all device addresses; the table, rejected word and
/// stripes come from `counter`.
///
/// # Errors
/// Launch errors.
///
/// # Safety
/// `f` is one of the stand-in routers, and the buffers behind `logits`, `ids`, `prev_ids` and
/// `weights` hold at least the sizes above (for modes 29/30, `prev_ids` holds
/// `[counter.layers(), tokens, k]`).
pub unsafe fn launch_standin_router(
    stream: &CudaStream,
    f: &CudaFunction,
    logits: u64,
    (tokens, experts, k): (u32, u32, u32),
    (ids, prev_ids, weights): (u64, u64, u64),
    counter: &PickCounterGpu,
    layer: u32,
) -> Result<()> {
    let cfg = LaunchConfig {
        grid_dim: ((tokens * 32).div_ceil(256), 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    let (table, err, layers) = (
        counter.table_ptr(),
        counter.rejected_ptr(),
        counter.layers(),
    );
    let (stripes, num_stripes) = (counter.stripes_ptr(), counter.num_stripes());
    let mut b = stream.launch_builder(f);
    b.arg(&logits).arg(&tokens).arg(&experts).arg(&k).arg(&ids);
    b.arg(&prev_ids)
        .arg(&table)
        .arg(&err)
        .arg(&layer)
        .arg(&layers);
    b.arg(&stripes).arg(&num_stripes).arg(&weights);
    // SAFETY: the argument list matches tierkit_standin_{router,gate}_m* (router_standins.cu);
    // the caller sizes logits, ids, prev_ids and weights (this function's contract); the table
    // and the stripes come from `counter`'s geometry.
    unsafe { b.launch(cfg) }.map_err(|e| CudaError::driver("cuLaunchKernel(standin router)", e))?;
    Ok(())
}

/// Launches `tierkit_count_ids_striped_{i32,i64}` (`f`, the kernel for `T`) over `ids` (all
/// of them, of layer `layer`) into `counter` on `stream`: thread `i` counts `ids[i]` into
/// stripe `i / 32` (its warp; warps beyond the counter's stripes add to the table).
///
/// # Errors
/// Launch errors.
///
/// # Safety
/// `f` is `tierkit_count_ids_striped_i32` for `T = i32` or `_i64` for `T = i64`.
pub unsafe fn launch_count_ids_striped<T: bytemuck::Pod>(
    stream: &CudaStream,
    f: &CudaFunction,
    ids: &DeviceBuffer<T>,
    layer: u32,
    counter: &PickCounterGpu,
) -> Result<()> {
    let (n, experts, layers) = (ids.len() as u32, counter.experts(), counter.layers());
    let cfg = LaunchConfig {
        grid_dim: (n.div_ceil(128), 1, 1),
        block_dim: (128, 1, 1),
        shared_mem_bytes: 0,
    };
    let (ip, tp, ep) = (
        ids.device_ptr(),
        counter.table_ptr(),
        counter.rejected_ptr(),
    );
    let (sp, ns) = (counter.stripes_ptr(), counter.num_stripes());
    let mut b = stream.launch_builder(f);
    b.arg(&ip)
        .arg(&n)
        .arg(&layer)
        .arg(&layers)
        .arg(&experts)
        .arg(&tp)
        .arg(&ep)
        .arg(&sp)
        .arg(&ns);
    // SAFETY: the argument list matches tierkit_count_ids_striped_*; `f` is the kernel for T
    // (caller's contract); ids holds n T, the grid has n threads or more, the table and
    // stripes come from `counter`'s geometry (bad layers and ids are rejected on the device).
    unsafe { b.launch(cfg) }
        .map_err(|e| CudaError::driver("cuLaunchKernel(tierkit_count_ids_striped)", e))?;
    Ok(())
}
