//! Every kernel source NVRTC compiles, parsed by the host C++ compiler against a stand-in for the
//! CUDA headers (`tests/fake_cuda.h`): on machines without NVRTC (CI) a kernel edit that does not
//! parse, names an undeclared function or passes the wrong arguments fails here instead of at the
//! first device run. The SGLang peer is read from its released wheel at bench time: behind its shim
//! it is parsed here too, with every entry point's template instantiation, when
//! `scripts/fetch-sglang-peer` has put it in `.peer/sglang` (SKIP otherwise). SKIP without `g++`.

use std::path::{Path, PathBuf};
use std::process::Command;

use cuda_kernels::{KernelSource, COUNT_MODULE, KV_MODULE, TABLE_MODULE};
use tierkit_testkit::{router_standins, EXPERT_READERS_MODULE, KV_LAB, KV_STANDINS};

const FAKE_CUDA: &str = include_str!("fake_cuda.h");

fn gxx() -> Option<&'static str> {
    let ok = Command::new("g++")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    ok.then_some("g++")
}

/// A scratch folder of this process for one test (`tag`: tests run in parallel).
fn dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "tierkit-kernel-syntax-{}-{tag}",
        std::process::id()
    ));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// `g++ -fsyntax-only` of `src` with `defines`: the compiler's errors, if any.
fn parse(cxx: &str, d: &Path, src: &KernelSource, defines: &[&str]) -> Option<String> {
    parse_code(cxx, d, src.name, src.code, defines)
}

/// `g++ -fsyntax-only` of the source `code` (written as `NAME.cu`) with `defines`.
fn parse_code(cxx: &str, d: &Path, name: &str, code: &str, defines: &[&str]) -> Option<String> {
    let header = d.join("fake_cuda.h");
    std::fs::write(&header, FAKE_CUDA).unwrap();
    let file = d.join(format!("{name}.cu"));
    std::fs::write(&file, code).unwrap();
    let mut cmd = Command::new(cxx);
    cmd.args(["-std=c++17", "-fsyntax-only", "-w", "-x", "c++", "-include"])
        .arg(&header)
        .arg(&file);
    for def in defines {
        cmd.arg(format!("-D{def}"));
    }
    let out = cmd.output().expect("g++ runs");
    (!out.status.success()).then(|| {
        format!(
            "{name} {defines:?}:\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

#[test]
fn every_kernel_source_parses() {
    let Some(cxx) = gxx() else {
        println!("SKIP: no g++ to parse the kernel sources");
        return;
    };
    let d = dir("all");
    let sources = [
        KV_MODULE,
        COUNT_MODULE,
        TABLE_MODULE,
        EXPERT_READERS_MODULE,
        KV_STANDINS,
        KV_LAB,
        router_standins(),
    ];
    let errors: Vec<String> = sources
        .iter()
        .filter_map(|s| parse(cxx, &d, s, &[]))
        .collect();
    // The check itself: a source with an undeclared builtin must fail.
    let broken = KernelSource {
        name: "broken",
        code: "__device__ int f(int x) { return __no_such_builtin(x); }",
    };
    assert!(
        parse(cxx, &d, &broken, &[]).is_some(),
        "the parse check accepts anything"
    );
    let _ = std::fs::remove_dir_all(&d);
    assert!(
        errors.is_empty(),
        "kernel sources that do not parse:\n{}",
        errors.join("\n")
    );
}

/// The released SGLang peer behind tierkit's shim (`scripts/fetch-sglang-peer` into `.peer/sglang`
/// at the repository root), parsed as the other kernel sources are: the shim's stand-ins for the
/// wheel's JIT headers, the peer's device code with its includes and host launchers removed, and
/// the shim's `extern "C"` entry points (every template instantiation SGLang's launch values
/// name). SKIP when the peer was not fetched or without `g++`.
#[test]
fn the_released_peer_parses_behind_the_shim() {
    let Some(cxx) = gxx() else {
        println!("SKIP: no g++ to parse the kernel sources");
        return;
    };
    let peer = Path::new(env!("CARGO_MANIFEST_DIR")).join("../.peer/sglang");
    let source = match tierkit_testkit::SglangSource::load(&peer) {
        Ok(s) => s,
        Err(e) => {
            println!("SKIP: {e}");
            return;
        }
    };
    let d = dir("peer");
    let errors = parse_code(cxx, &d, "sglang_hisparse", source.code(), &[]);
    let _ = std::fs::remove_dir_all(&d);
    assert!(errors.is_none(), "{}", errors.unwrap_or_default());
}
