//! `scripts/fetch-sglang-peer`: what it extracts from a wheel and what it records, checked on a
//! wheel built here (offline) and on the released one (SKIP where the package registry cannot be
//! reached). SKIP without `bash` or `python3` (the script's own needs) or away from the source tree.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use tierkit_testkit::{sha256_hex, SglangSource};

const HISPARSE: &str = "sglang/kernels/jit/csrc/kvcacheio/hisparse.cuh";
const KVCACHEIO: &str = "sglang/kernels/jit/include/sgl_kernel/deepseek_v4/kvcacheio.cuh";

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/fetch-sglang-peer")
}

/// Whether the script and what it runs are here (a test binary carried to another machine finds
/// no source tree: SKIP there), printing the SKIP line otherwise.
fn tools() -> bool {
    if !script().is_file() {
        println!(
            "SKIP: no {} (a test binary away from its source tree)",
            script().display()
        );
        return false;
    }
    let ok = ["bash", "python3"].iter().all(|t| {
        Command::new(t)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    });
    if !ok {
        println!("SKIP: no bash or python3 to run scripts/fetch-sglang-peer");
    }
    ok
}

fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("tierkit-fetch-peer-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn fetch(out: &Path, wheel: Option<&Path>, env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new("bash");
    cmd.arg(script()).arg(out).arg("0.5.23");
    if let Some(w) = wheel {
        cmd.env("SGLANG_WHEEL", w);
    }
    cmd.envs(env.iter().copied());
    cmd.output().expect("bash runs the script")
}

/// A wheel (a zip) named as sglang 0.5.23's, holding `members` (`(path, text)`).
fn wheel(dir: &Path, members: &[(&str, &str)]) -> PathBuf {
    let path = dir.join("sglang-0.5.23-py3-none-any.whl");
    let mut py = String::from("import sys, zipfile\nz = zipfile.ZipFile(sys.argv[1], 'w')\n");
    for (i, (name, _)) in members.iter().enumerate() {
        py.push_str(&format!(
            "z.writestr({name:?}, open(sys.argv[{}]).read())\n",
            i + 2
        ));
    }
    py.push_str("z.close()\n");
    let mut cmd = Command::new("python3");
    cmd.arg("-c").arg(py).arg(&path);
    for (i, (_, text)) in members.iter().enumerate() {
        let f = dir.join(format!("member{i}"));
        std::fs::write(&f, text).unwrap();
        cmd.arg(f);
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    path
}

/// Every file `PROVENANCE` names holds what it recorded, and the wheel's line is `wheel`'s.
fn check_record(out: &Path, wheel_name: &str, wheel_sha: Option<&str>) {
    let prov = std::fs::read_to_string(out.join("PROVENANCE")).unwrap();
    let lines: Vec<&str> = prov.lines().collect();
    assert_eq!(lines[0], wheel_name, "{prov}");
    assert!(lines[1].starts_with("sha256 "), "{prov}");
    if let Some(s) = wheel_sha {
        assert_eq!(lines[1], format!("sha256 {s}"), "{prov}");
    }
    for (name, member) in [("hisparse.cuh", HISPARSE), ("kvcacheio.cuh", KVCACHEIO)] {
        let sha = sha256_hex(&std::fs::read(out.join(name)).unwrap());
        assert!(
            lines.contains(&format!("{name} {member} sha256 {sha}").as_str()),
            "{name}: {prov}"
        );
    }
}

#[test]
fn the_script_extracts_and_records_the_peer_from_a_wheel_on_disk() {
    if !tools() {
        return;
    }
    let d = scratch("disk");
    let hisparse = "namespace sglang {\ntemplate <int N> struct SmemLayout { static constexpr int BYTES = N; };\n\
                    template <int B> __global__ void load_cache_to_device_buffer_kernel(int* x) {}\n}\n";
    let kvcacheio = "namespace sglang {}\n";
    let w = wheel(
        &d,
        &[
            (HISPARSE, hisparse),
            (KVCACHEIO, kvcacheio),
            ("sglang/__init__.py", ""),
        ],
    );
    let out = d.join("peer");
    let run = fetch(&out, Some(&w), &[]);
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    assert_eq!(
        std::fs::read_to_string(out.join("hisparse.cuh")).unwrap(),
        hisparse
    );
    assert_eq!(
        std::fs::read_to_string(out.join("kvcacheio.cuh")).unwrap(),
        kvcacheio
    );
    let wheel_sha = sha256_hex(&std::fs::read(&w).unwrap());
    check_record(&out, "sglang-0.5.23-py3-none-any.whl", Some(&wheel_sha));
    // What the bench reads back from it.
    let src = SglangSource::load(&out).unwrap();
    assert_eq!(
        (src.version.as_str(), src.wheel_sha256.as_str()),
        ("0.5.23", wheel_sha.as_str())
    );

    // A wheel without the kernel (the peer moved) fails and says so.
    let d2 = scratch("moved");
    let w = wheel(&d2, &[(KVCACHEIO, kvcacheio)]);
    let run = fetch(&d2.join("peer"), Some(&w), &[]);
    let err = String::from_utf8_lossy(&run.stderr);
    assert!(
        !run.status.success() && err.contains("the peer moved"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&d);
    let _ = std::fs::remove_dir_all(&d2);
}

/// The released wheel from the package registry (pip, no dependencies); SKIP where the download
/// fails (no registry here). A failure after the download (the extraction) fails the test.
#[test]
fn the_script_extracts_the_released_peer_and_the_shim_assembles_it() {
    if !tools() {
        return;
    }
    let d = scratch("registry");
    let out = d.join("peer");
    let run = fetch(
        &out,
        None,
        &[("PIP_DEFAULT_TIMEOUT", "15"), ("PIP_RETRIES", "1")],
    );
    let err = String::from_utf8_lossy(&run.stderr).into_owned();
    if !run.status.success() && !err.contains("fetch-sglang-peer:") {
        let _ = std::fs::remove_dir_all(&d);
        let last = err.lines().last().unwrap_or("").to_string();
        println!("SKIP: the sglang wheel could not be downloaded ({last})");
        return;
    }
    assert!(run.status.success(), "{err}");
    let prov = std::fs::read_to_string(out.join("PROVENANCE")).unwrap();
    let wheel_name = prov.lines().next().unwrap_or("").to_string();
    assert!(wheel_name.starts_with("sglang-0.5.23-"), "{prov}");
    check_record(&out, &wheel_name, None);
    let src = SglangSource::load(&out).unwrap();
    assert_eq!(src.version, "0.5.23");
    assert!(src.code().contains("load_cache_to_device_buffer_kernel"));
    assert!(!src.code().contains("tvm::ffi::TensorView"));
    let _ = std::fs::remove_dir_all(&d);
}
