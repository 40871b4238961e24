//! `kv_gpu_bench --mode peer` on the CPU: without `--peer-source` (or with a folder that holds no
//! fetched peer) it refuses and says how to get the peer; with a fetched folder it prints the
//! peer's record (release, wheel, SHA-256s) before it looks for a device. The device is hidden
//! (`CUDA_VISIBLE_DEVICES=-1`), so the run stops at `SKIP: no CUDA device` on a GPU machine too.
#![cfg(feature = "cuda")]

use std::path::PathBuf;
use std::process::{Command, Output};

use tierkit_testkit::sha256_hex;

fn bench(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kv_gpu_bench"))
        .args(args)
        .env("CUDA_VISIBLE_DEVICES", "-1")
        .output()
        .expect("kv_gpu_bench runs")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn peer_mode_without_a_source_refuses_and_says_how_to_fetch_it() {
    for mode in ["peer", "peer-resident"] {
        let out = bench(&["--mode", mode]);
        let err = text(&out.stderr);
        assert!(!out.status.success(), "{mode}: {err}");
        assert!(err.contains("--peer-source"), "{mode}: {err}");
        assert!(
            err.contains("scripts/fetch-sglang-peer .peer/sglang"),
            "{mode}: {err}"
        );
        assert!(
            !text(&out.stdout).contains("SKIP"),
            "refused before the device check"
        );
    }
}

#[test]
fn peer_mode_with_an_empty_folder_refuses_and_says_how_to_fetch_it() {
    let dir = std::env::temp_dir().join(format!("tierkit-bench-peer-{}-empty", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = bench(&["--mode", "peer", "--peer-source", dir.to_str().unwrap()]);
    let _ = std::fs::remove_dir_all(&dir);
    let err = text(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("PROVENANCE"), "{err}");
    assert!(err.contains("scripts/fetch-sglang-peer"), "{err}");
}

/// A folder as the fetch script writes it (the files are stand-ins: only their record is read
/// before the device check).
fn fetched() -> (PathBuf, String) {
    let dir = std::env::temp_dir().join(format!("tierkit-bench-peer-{}-ok", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let hisparse = "namespace sglang {\ntemplate <int N> struct SmemLayout { static constexpr int BYTES = N; };\n\
                    template <int B> __global__ void load_cache_to_device_buffer_kernel(int* x) {}\n}\n";
    let kvcacheio = "// kvcacheio\n";
    std::fs::write(dir.join("hisparse.cuh"), hisparse).unwrap();
    std::fs::write(dir.join("kvcacheio.cuh"), kvcacheio).unwrap();
    let h = sha256_hex(hisparse.as_bytes());
    std::fs::write(
        dir.join("PROVENANCE"),
        format!(
            "sglang-0.5.23-cp312-cp312-manylinux_2_34_x86_64.whl\nsha256 {}\n\
             hisparse.cuh sglang/kernels/jit/csrc/kvcacheio/hisparse.cuh sha256 {h}\n\
             kvcacheio.cuh sglang/kernels/jit/include/sgl_kernel/deepseek_v4/kvcacheio.cuh sha256 {}\n",
            "cd".repeat(32),
            sha256_hex(kvcacheio.as_bytes())
        ),
    )
    .unwrap();
    (dir, h)
}

#[test]
fn peer_mode_records_the_release_and_the_sha256_of_what_it_read() {
    let (dir, h) = fetched();
    let out = bench(&["--mode", "peer", "--peer-source", dir.to_str().unwrap()]);
    let _ = std::fs::remove_dir_all(&dir);
    let (o, e) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{o}\n{e}");
    let first = o.lines().next().unwrap_or("");
    assert!(
        first.starts_with("peer: sglang 0.5.23 (wheel sglang-0.5.23-"),
        "{o}"
    );
    assert!(
        first.contains(&format!("sha256 {}", "cd".repeat(32))),
        "{o}"
    );
    assert!(first.contains(&format!("hisparse.cuh sha256 {h}")), "{o}");
    assert!(o.contains("SKIP: no CUDA device"), "{o}");
}
