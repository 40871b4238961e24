//! The peer of `kv_gpu_bench --mode peer`: SGLang HiSparse's swap-in kernel
//! (`load_cache_to_device_buffer_kernel`), read at bench time from the released sglang wheel
//! (`scripts/fetch-sglang-peer` extracts `hisparse.cuh` and the DeepSeek-V4 `kvcacheio.cuh` it
//! includes into a git-ignored folder; nothing of the peer is kept in this tree), compiled with
//! NVRTC behind tierkit's own shim (`kernels/sglang_shim.cuh` + `kernels/sglang_entries.cu`), and
//! launched with SGLang's own values (grid = batch, 960 threads, `SmemLayout` shared memory), with
//! the state SGLang's HiSparse coordinator keeps per request, set up so it reads the same host rows
//! as tierkit's pool.
//!
//! State per request `r` (request pool index `r`), as SGLang's coordinator allocates it:
//! `device_buffer_tokens int32 [reqs][hot + 1]` (token held by each buffer slot, `-1` empty; slot
//! `hot` is the newest token's page, `page_size = 1`), `device_buffer_locs int32 [reqs][hot + 1]`
//! (device row of each slot: `r × (hot + 1) + slot`), `lru_slots int16 [reqs][hot]` (LRU order,
//! initially `0 .. hot`), `host_cache_locs int64 [reqs][host_stride]` (host row of each token),
//! `top_k_device_locs int32 [reqs][k]` (the output); `req_pool_indices` and `seq_lens` are int64
//! `[reqs]`, as SGLang's scheduler makes them (the kernel's `int64_t, int64_t` instantiation). The
//! device buffer is `u8 [reqs × (hot + 1)]
//! [item_bytes]` in HBM; the host cache is read in place through its device address.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use cuda_kernels::cudarc_driver::sys::CUfunction_attribute_enum;
use cuda_kernels::cudarc_driver::{
    CudaFunction, CudaModule, CudaStream, LaunchConfig, PushKernelArg,
};
use cuda_kernels::{CudaError, DeviceBuffer, Gpu};
use sha2::{Digest, Sha256};

/// Threads per block, as SGLang's HiSparse coordinator launches the kernel.
pub const SGLANG_BLOCK: u32 = 960;

/// The top-k the entry points are instantiated for (output columns: 2048 positions, or 32 block
/// ids of [`SGLANG_SPARSE_BLOCK`] positions each).
pub const SGLANG_TOP_K: u32 = 2048;

/// Positions per block id of the block-id entry points (`TopKIsBlocks`, `SPARSE_BLOCK_SIZE`).
pub const SGLANG_SPARSE_BLOCK: u32 = 64;

/// The shim's prelude: stand-ins for what the peer's JIT headers give its device code.
const SHIM_PRELUDE: &str = include_str!("../kernels/sglang_shim.cuh");
/// The shim's entry points (one instantiation per hot size, with and without the byte copy).
const SHIM_ENTRIES: &str = include_str!("../kernels/sglang_entries.cu");

/// The peer's files in a folder made by `scripts/fetch-sglang-peer`: `hisparse.cuh`,
/// `kvcacheio.cuh` and `PROVENANCE` (the wheel they came from, its SHA-256 and each file's), and
/// the NVRTC source assembled from them and the shim.
#[derive(Debug)]
pub struct SglangSource {
    /// The folder.
    pub dir: PathBuf,
    /// `PROVENANCE`'s first line: the wheel's file name (e.g. `sglang-0.5.23-cp312-...whl`).
    pub wheel: String,
    /// The release the wheel carries (`0.5.23`: its name's second field).
    pub version: String,
    /// The wheel's SHA-256 (hex) as `PROVENANCE` recorded it at download.
    pub wheel_sha256: String,
    /// `(file, sha256 hex)` of the peer's two files, computed from the files read (equal to what
    /// `PROVENANCE` recorded: [`SglangSource::load`] refuses them otherwise).
    pub files: Vec<(String, String)>,
    code: String,
    module: OnceLock<Arc<CudaModule>>,
}

/// Lowercase hex SHA-256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

impl SglangSource {
    /// Reads the peer from `dir` and checks each file against the SHA-256 `PROVENANCE` recorded
    /// when `scripts/fetch-sglang-peer` extracted it from the wheel (`NAME MEMBER sha256 HEX`).
    ///
    /// # Errors
    /// A message naming the missing file and how to get it (`scripts/fetch-sglang-peer`); a
    /// `PROVENANCE` without the wheel's name, its hash or a file's line; a file whose SHA-256
    /// differs from the recorded one (edited since it was fetched); or what the peer's text lacks
    /// (its source changed shape).
    pub fn load(dir: &Path) -> Result<Self, String> {
        let refetch = format!(
            "fetch the released peer with `scripts/fetch-sglang-peer {}` (needs the package \
             registry) and pass that folder",
            dir.display()
        );
        let read = |name: &str| {
            std::fs::read_to_string(dir.join(name))
                .map_err(|e| format!("{}: {e}; {refetch}", dir.join(name).display()))
        };
        let provenance = read("PROVENANCE")?;
        let mut lines = provenance.lines();
        let wheel = lines.next().unwrap_or("").trim().to_string();
        let version = wheel
            .strip_prefix("sglang-")
            .and_then(|v| v.split('-').next())
            .filter(|v| !v.is_empty())
            .ok_or_else(|| {
                format!("PROVENANCE names no sglang wheel (first line {wheel:?}); {refetch}")
            })?
            .to_string();
        let wheel_sha256 = lines
            .next()
            .and_then(|l| l.strip_prefix("sha256 "))
            .map(|h| h.trim().to_string())
            .ok_or_else(|| format!("PROVENANCE has no wheel sha256 line; {refetch}"))?;
        let recorded = |name: &str| {
            provenance.lines().find_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                (f.len() == 4 && f[0] == name && f[2] == "sha256").then(|| f[3].to_string())
            })
        };
        let mut files = Vec::new();
        let mut text = Vec::new();
        for name in ["hisparse.cuh", "kvcacheio.cuh"] {
            let t = read(name)?;
            let sha = sha256_hex(t.as_bytes());
            match recorded(name) {
                Some(r) if r == sha => {}
                Some(r) => {
                    return Err(format!(
                        "{}: sha256 {sha}, but PROVENANCE recorded {r} from {wheel}: the file \
                         changed since it was fetched; {refetch}",
                        dir.join(name).display()
                    ))
                }
                None => return Err(format!("PROVENANCE has no line for {name}; {refetch}")),
            }
            files.push((name.to_string(), sha));
            text.push(t);
        }
        let code = assemble(&text[1], &text[0])?;
        Ok(SglangSource {
            dir: dir.to_path_buf(),
            wheel,
            version,
            wheel_sha256,
            files,
            code,
            module: OnceLock::new(),
        })
    }

    /// One line for a bench's output: the release, the wheel and its SHA-256, the folder, and
    /// each file's SHA-256.
    pub fn describe(&self) -> String {
        let files: Vec<String> = self
            .files
            .iter()
            .map(|(f, h)| format!("{f} sha256 {h}"))
            .collect();
        format!(
            "peer: sglang {} (wheel {} sha256 {}) from {}: {}",
            self.version,
            self.wheel,
            self.wheel_sha256,
            self.dir.display(),
            files.join(", ")
        )
    }

    /// The NVRTC source (shim prelude, the peer's device code, the shim's entry points).
    pub fn code(&self) -> &str {
        &self.code
    }

    fn function(&self, gpu: &Gpu, name: &str) -> Result<CudaFunction, CudaError> {
        let module = match self.module.get() {
            Some(m) => m.clone(),
            None => {
                let m = gpu.compile("sglang_hisparse", &self.code, &[])?;
                self.module.get_or_init(|| m).clone()
            }
        };
        module
            .load_function(name)
            .map_err(|e| CudaError::driver("cuModuleGetFunction", e))
    }
}

/// The peer's text as NVRTC compiles it behind the shim: `#include` lines commented out, the host
/// launchers (top-level functions taking `tvm::ffi::TensorView`) removed, its `__global__` kernels
/// made `__device__` functions without launch bounds (the shim's entry points are the kernels).
pub fn assemble(kvcacheio: &str, hisparse: &str) -> Result<String, String> {
    let peer = |t: &str| -> Result<String, String> {
        let t = t
            .lines()
            .map(|l| {
                if l.starts_with("#include") {
                    format!("// (tierkit shim) {l}")
                } else {
                    l.to_string()
                }
            })
            .collect::<Vec<_>>()
            .join("\n");
        let t = strip_host_launchers(&t)?;
        Ok(strip_launch_bounds(&t.replace("__global__", "__device__")))
    };
    let hs = peer(hisparse)?;
    if !hs.contains("load_cache_to_device_buffer_kernel") || !hs.contains("struct SmemLayout") {
        return Err(
            "hisparse.cuh has no load_cache_to_device_buffer_kernel / SmemLayout: not the \
                    peer the shim was written for"
                .into(),
        );
    }
    Ok(format!(
        "{SHIM_PRELUDE}\n{}\n{hs}\n{SHIM_ENTRIES}",
        peer(kvcacheio)?
    ))
}

/// Removes every top-level function whose parameters name `tvm::ffi::TensorView` (with the
/// `template <...>` line before it).
fn strip_host_launchers(t: &str) -> Result<String, String> {
    let mut t = t.to_string();
    while let Some(i) = t.find("tvm::ffi::TensorView") {
        let lines: Vec<(usize, &str)> = t[..i]
            .match_indices('\n')
            .map(|(p, _)| p + 1)
            .map(|p| (p, &t[p..]))
            .collect();
        let start = lines
            .iter()
            .rev()
            .find(|(_, l)| l.starts_with("void ") || l.starts_with("inline void "))
            .map(|&(p, _)| p)
            .ok_or("a TensorView outside a top-level function")?;
        // The `template <` block right before it (no `;` or `{` in between).
        let start = lines
            .iter()
            .rev()
            .find(|(p, l)| *p < start && l.starts_with("template"))
            .filter(|(p, _)| !t[*p..start].contains(';') && !t[*p..start].contains('{'))
            .map_or(start, |&(p, _)| p);
        let open = t[start..]
            .find('{')
            .map(|o| start + o)
            .ok_or("a host launcher without a body")?;
        let mut depth = 0usize;
        let mut end = None;
        for (k, c) in t[open..].char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = Some(open + k + 1);
                        break;
                    }
                }
                _ => {}
            }
        }
        let end = end.ok_or("an unbalanced host launcher")?;
        t.replace_range(start..end, "// (tierkit shim: host launcher removed)");
    }
    Ok(t)
}

/// Removes `__launch_bounds__(...)` annotations.
fn strip_launch_bounds(t: &str) -> String {
    let mut out = String::with_capacity(t.len());
    let mut rest = t;
    while let Some(i) = rest.find("__launch_bounds__(") {
        out.push_str(&rest[..i]);
        let after = &rest[i + "__launch_bounds__(".len()..];
        let close = after.find(')').map_or(after.len(), |c| c + 1);
        rest = &after[close..];
    }
    out.push_str(rest);
    out
}

/// Geometry of one [`SglangHisparse`] instance.
#[derive(Debug, Clone, Copy)]
pub struct SglangShape {
    /// Requests (grid blocks), each its own request pool index `0 .. reqs`.
    pub reqs: u32,
    /// Hot buffer slots per request (2048, 4096 or 8192: the instantiated sizes).
    pub hot: u32,
    /// `seq_lens[r]` of every request (the newest token `seq_len - 1` is served from slot `hot`).
    pub seq_len: u32,
    /// Bytes per row (`item_size_bytes`).
    pub item_bytes: u32,
    /// Positions per top-k entry: 1 (token top-k), or [`SGLANG_SPARSE_BLOCK`] (block ids,
    /// `TopKIsBlocks`: `topk int32 [reqs][2048 / block]`; hot 2048 or 4096).
    pub block: u32,
}

/// SGLang's swap-in kernel with its per-request state, loaded on one GPU.
#[derive(Debug)]
pub struct SglangHisparse {
    full: CudaFunction,
    nocopy: CudaFunction,
    smem: u32,
    shape: SglangShape,
    host_stride: u32,
    host_ptr: u64,
    tokens: DeviceBuffer<i32>,
    locs: DeviceBuffer<i32>,
    host_locs: DeviceBuffer<i64>,
    lru: DeviceBuffer<i16>,
    rpi: DeviceBuffer<i64>,
    seq: DeviceBuffer<i64>,
    nreal: DeviceBuffer<i32>,
    out: DeviceBuffer<i32>,
    buffer: DeviceBuffer<u8>,
}

impl SglangHisparse {
    /// Builds the state: `host_locs` is `int64 [reqs][host_stride]` (host row of token `p` of
    /// request `r` at `r × host_stride + p`, in units of `item_bytes` from `host_ptr`, the device
    /// address of the host cache); empty buffers, LRU order `0 .. hot`. The kernel's dynamic
    /// shared memory is the peer's own `SmemLayout<2048, hot>::BYTES`, read from the device.
    ///
    /// # Errors
    /// `Shape` for a hot size without an entry point or `host_locs` of the wrong length; NVRTC /
    /// driver errors.
    pub fn new(
        gpu: &Arc<Gpu>,
        source: &SglangSource,
        shape: SglangShape,
        host_ptr: u64,
        host_locs: &[i64],
        host_stride: u32,
    ) -> Result<Self, CudaError> {
        if ![2048, 4096, 8192].contains(&shape.hot) {
            return Err(CudaError::Shape {
                what: "SGLang hot buffer size (2048, 4096 or 8192)",
                expected: 4096,
                got: shape.hot as u64,
            });
        }
        if ![1, SGLANG_SPARSE_BLOCK].contains(&shape.block)
            || (shape.block > 1 && shape.hot == 8192)
        {
            return Err(CudaError::Shape {
                what: "SGLang positions per top-k entry (1, or 64 with hot 2048 / 4096)",
                expected: SGLANG_SPARSE_BLOCK as u64,
                got: shape.block as u64,
            });
        }
        let want = shape.reqs as u64 * host_stride as u64;
        if host_locs.len() as u64 != want {
            return Err(CudaError::Shape {
                what: "host_cache_locs entries",
                expected: want,
                got: host_locs.len() as u64,
            });
        }
        let name = match shape.block {
            1 => format!("sglang_hisparse_k{SGLANG_TOP_K}_h{}", shape.hot),
            b => format!("sglang_hisparse_b{b}x{}_h{}", SGLANG_TOP_K / b, shape.hot),
        };
        let full = source.function(gpu, &name)?;
        let nocopy = source.function(gpu, &format!("{name}_nocopy"))?;
        let ctx = gpu.ctx();
        // SmemLayout<K, HOT>::BYTES as the peer computes it.
        let smem = {
            let f = source.function(gpu, &format!("{name}_smem"))?;
            let out = DeviceBuffer::<i32>::zeroed(ctx, 1)?;
            let mut b = gpu.stream().launch_builder(&f);
            let p = out.device_ptr();
            b.arg(&p);
            // SAFETY: one thread writes one int32 into `out`, alive until the download below.
            unsafe { b.launch(LaunchConfig::for_num_elems(1)) }
                .map_err(|e| CudaError::driver("cuLaunchKernel(sglang smem)", e))?;
            gpu.synchronize()?;
            out.download()?[0] as u32
        };
        for f in [&full, &nocopy] {
            f.set_attribute(
                CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                smem as i32,
            )
            .map_err(|e| CudaError::driver("cuFuncSetAttribute", e))?;
        }
        let stride = shape.hot as usize + 1;
        let n = shape.reqs as usize;
        let locs: Vec<i32> = (0..(n * stride) as i32).collect();
        let mut s = SglangHisparse {
            full,
            nocopy,
            smem,
            shape,
            host_stride,
            host_ptr,
            tokens: DeviceBuffer::zeroed(ctx, n * stride)?,
            locs: DeviceBuffer::from_host(ctx, &locs)?,
            host_locs: DeviceBuffer::from_host(ctx, host_locs)?,
            lru: DeviceBuffer::zeroed(ctx, n * shape.hot as usize)?,
            rpi: DeviceBuffer::from_host(ctx, &(0..shape.reqs as i64).collect::<Vec<_>>())?,
            seq: DeviceBuffer::from_host(ctx, &vec![shape.seq_len as i64; n])?,
            nreal: DeviceBuffer::from_host(ctx, &[shape.reqs as i32])?,
            out: DeviceBuffer::zeroed(ctx, n * SGLANG_TOP_K as usize)?,
            buffer: DeviceBuffer::zeroed(ctx, n * stride * shape.item_bytes as usize)?,
        };
        s.reset()?;
        Ok(s)
    }

    /// Empties every hot buffer (tokens `-1`) and restores the LRU order `0 .. hot` (synchronous).
    ///
    /// # Errors
    /// Driver errors of the uploads.
    pub fn reset(&mut self) -> Result<(), CudaError> {
        let stride = self.shape.hot as usize + 1;
        let n = self.shape.reqs as usize;
        self.tokens.upload(&vec![-1; n * stride])?;
        let lru: Vec<i16> = (0..n).flat_map(|_| 0..self.shape.hot as i16).collect();
        self.lru.upload(&lru)
    }

    /// `top_k_device_locs int32 [reqs][k]` (device rows of the picks).
    pub fn out(&self) -> &DeviceBuffer<i32> {
        &self.out
    }

    /// The device buffer (`u8 [reqs × (hot + 1)][item_bytes]`).
    pub fn buffer(&self) -> &DeviceBuffer<u8> {
        &self.buffer
    }

    /// The kernel's dynamic shared memory per block (the peer's `SmemLayout::BYTES`).
    pub fn smem_bytes(&self) -> u32 {
        self.smem
    }

    /// One swap-in over all requests: `topk` is `int32 [reqs][2048 / block]` on the device
    /// (positions, or block ids). `copy = false` launches the peer's SkipIO instantiation
    /// (everything but the byte movement).
    ///
    /// # Errors
    /// The driver's launch error.
    ///
    /// # Safety
    /// `topk` addresses `reqs × 2048 / block` int32 on the device, each position (or every
    /// position of each block) `0 <= p < host_stride`; the host
    /// cache at `host_ptr` holds every row `host_locs` names and stays allocated until the stream
    /// passes the launch.
    pub unsafe fn launch(
        &self,
        stream: &CudaStream,
        topk: u64,
        copy: bool,
    ) -> Result<(), CudaError> {
        let f = if copy { &self.full } else { &self.nocopy };
        let stride = self.shape.hot as i64 + 1;
        let args_i64 = [
            stride,                                   // buffer_stride_0
            self.host_stride as i64,                  // host_stride
            self.shape.hot as i64,                    // lru_slot_stride_0
            (SGLANG_TOP_K / self.shape.block) as i64, // top_k_stride (ids per row)
            SGLANG_TOP_K as i64,                      // top_k_device_locs_stride
            1i64,                                     // page_size
            self.shape.item_bytes as i64,
        ];
        let ptrs = [
            topk,
            self.tokens.device_ptr(),
            self.host_locs.device_ptr(),
            self.locs.device_ptr(),
            self.host_ptr,
            self.buffer.device_ptr(),
            self.out.device_ptr(),
            self.rpi.device_ptr(),
            self.seq.device_ptr(),
            self.lru.device_ptr(),
            self.nreal.device_ptr(),
        ];
        let mut b = stream.launch_builder(f);
        for p in &ptrs {
            b.arg(p);
        }
        for v in &args_i64 {
            b.arg(v);
        }
        let cfg = LaunchConfig {
            grid_dim: (self.shape.reqs, 1, 1),
            block_dim: (SGLANG_BLOCK, 1, 1),
            shared_mem_bytes: self.smem,
        };
        // SAFETY: the argument list matches the shim's entry points (11 pointers, 7 int64); the
        // state buffers are owned by `self`, `topk` and the host cache per the caller's contract.
        unsafe { b.launch(cfg) }
            .map_err(|e| CudaError::driver("cuLaunchKernel(sglang_hisparse)", e))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A miniature of the peer's shape: includes, a device helper, a kernel with launch bounds,
    /// a templated host launcher taking TensorViews, and a plain one.
    const FAKE: &str = "#include <sgl_kernel/tensor.h>
namespace sglang {
template <int N>
struct SmemLayout { static constexpr int BYTES = N; };
template <int B>
__global__ __launch_bounds__(B, 1) void load_cache_to_device_buffer_kernel(int* x) { if (x) { *x = B; } }
template <int B>
void launch(
    tvm::ffi::TensorView a,
    int b) {
  auto f = [=] { return b; };
  if (f()) { throw 1; }
}
void other(tvm::ffi::TensorView t) { { } }
}  // namespace sglang
";

    #[test]
    fn the_shim_keeps_the_device_code_and_drops_the_host_launchers() {
        let code = assemble("// kvcacheio\n#include <x.h>\n", FAKE).unwrap();
        assert!(!code.contains("TensorView"), "{code}");
        assert!(!code.contains("\n#include"), "{code}");
        assert!(code.contains("__device__  void load_cache_to_device_buffer_kernel(int* x) { if (x) { *x = B; } }"), "{code}");
        assert!(code.contains("}  // namespace sglang"));
        assert!(code.contains("SGLANG_ENTRY(sglang_hisparse_k2048_h4096"));
        assert!(code.contains("SGLANG_BLOCK_ENTRY(sglang_hisparse_b64x32_h4096, 32, 64"));
        assert!(assemble("", "void f() {}").is_err(), "not the peer");
    }

    /// A folder as `scripts/fetch-sglang-peer` writes it, with the miniature as `hisparse.cuh`;
    /// `edit` changes a file after `PROVENANCE` recorded it.
    fn fetched(tag: &str, edit: Option<(&str, &str)>) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("tierkit-peer-{}-{tag}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let kvcacheio = "// kvcacheio\n#include <x.h>\n";
        std::fs::write(dir.join("hisparse.cuh"), FAKE).unwrap();
        std::fs::write(dir.join("kvcacheio.cuh"), kvcacheio).unwrap();
        let prov = format!(
            "sglang-0.5.23-cp312-cp312-manylinux_2_34_x86_64.whl\nsha256 {}\n\
             hisparse.cuh sglang/kernels/jit/csrc/kvcacheio/hisparse.cuh sha256 {}\n\
             kvcacheio.cuh sglang/kernels/jit/include/sgl_kernel/deepseek_v4/kvcacheio.cuh sha256 {}\n",
            "ab".repeat(32),
            sha256_hex(FAKE.as_bytes()),
            sha256_hex(kvcacheio.as_bytes()),
        );
        std::fs::write(dir.join("PROVENANCE"), prov).unwrap();
        if let Some((name, text)) = edit {
            std::fs::write(dir.join(name), text).unwrap();
        }
        dir
    }

    #[test]
    fn sha256_hex_is_the_standard_digest() {
        // FIPS 180-2 test vector "abc".
        assert_eq!(
            sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn a_fetched_folder_records_the_release_the_wheel_and_each_files_sha256() {
        let dir = fetched("ok", None);
        let src = SglangSource::load(&dir).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(src.version, "0.5.23");
        assert_eq!(
            src.wheel,
            "sglang-0.5.23-cp312-cp312-manylinux_2_34_x86_64.whl"
        );
        assert_eq!(src.wheel_sha256, "ab".repeat(32));
        let hisparse = sha256_hex(FAKE.as_bytes());
        assert_eq!(src.files[0], ("hisparse.cuh".to_string(), hisparse.clone()));
        let line = src.describe();
        assert!(
            line.starts_with("peer: sglang 0.5.23 (wheel sglang-0.5.23-"),
            "{line}"
        );
        assert!(
            line.contains(&format!("hisparse.cuh sha256 {hisparse}")),
            "{line}"
        );
        assert!(line.contains(&src.wheel_sha256), "{line}");
    }

    #[test]
    fn a_file_edited_after_the_fetch_is_refused() {
        let dir = fetched(
            "edited",
            Some(("hisparse.cuh", &format!("{FAKE}// edited\n"))),
        );
        let e = SglangSource::load(&dir).unwrap_err();
        let _ = std::fs::remove_dir_all(&dir);
        assert!(e.contains("changed since it was fetched"), "{e}");
        assert!(e.contains("scripts/fetch-sglang-peer"), "{e}");
    }

    #[test]
    fn a_missing_or_foreign_folder_says_how_to_fetch_the_peer() {
        let dir = std::env::temp_dir().join(format!("tierkit-peer-{}-none", std::process::id()));
        let e = SglangSource::load(&dir).unwrap_err();
        assert!(e.contains("PROVENANCE"), "{e}");
        assert!(e.contains("scripts/fetch-sglang-peer"), "{e}");
        let dir = fetched("foreign", Some(("PROVENANCE", "vllm-0.34.whl\n")));
        let e = SglangSource::load(&dir).unwrap_err();
        let _ = std::fs::remove_dir_all(&dir);
        assert!(e.contains("no sglang wheel"), "{e}");
    }

    /// The released peer, where `scripts/fetch-sglang-peer` put it (`.peer/` at the repository
    /// root); SKIP otherwise.
    #[test]
    fn the_released_peer_assembles_when_fetched() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../.peer/sglang");
        let Ok(src) = SglangSource::load(&dir) else {
            println!(
                "SKIP: no released peer at {} (scripts/fetch-sglang-peer)",
                dir.display()
            );
            return;
        };
        assert!(src.wheel.starts_with("sglang-"), "{}", src.wheel);
        assert!(src.wheel.contains(&src.version), "{}", src.wheel);
        assert!(!src.code().contains("tvm::ffi::TensorView"));
        assert_eq!(src.files.len(), 2);
    }
}
