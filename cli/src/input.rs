//! The side-input files the commands read (controller configs, seed maps, counter dumps, routing
//! counts; the benchmark reports in `kv/report.rs`): every one through tier-core's bounded reader
//! (through the library loaders where the crate has one, with their caps), every error naming the
//! flag and the file. Trace and engine count files go through the lab's trace readers instead.

use std::path::Path;

use expert_residency::{ControllerConfig, CounterDump, ExpertError, Geometry, ResidencyMap};

/// Largest `--routing-counts` file: 16 MiB (the OLMoE file of 16 layers × 64 experts × 6 domains
/// holds 34 KB; a parsed JSON document takes several times its size in memory).
pub const MAX_ROUTING_COUNTS_BYTES: u64 = 16 << 20;

/// `{flag} {path}: {message}`, without repeating the path when the message starts with it.
pub fn named(flag: &str, path: &Path, message: impl std::fmt::Display) -> String {
    let shown = path.display().to_string();
    let m = message.to_string();
    if m.starts_with(&shown) {
        format!("{flag} {m}")
    } else {
        format!("{flag} {shown}: {m}")
    }
}

/// An `expert-residency` loader's error, named: the file-level ones (`ExpertError::Format`) carry
/// the path already, the others (an out-of-range value, a geometry mismatch) get it.
fn expert(flag: &str, path: &Path, e: ExpertError) -> String {
    match e {
        ExpertError::Format(m) => named(flag, path, m),
        other => named(flag, path, other),
    }
}

/// `--config FILE`: [`ControllerConfig::load`] (at most [`expert_residency::MAX_CONFIG_FILE_BYTES`]).
///
/// # Errors
/// The loader's errors, naming the flag and the file.
pub fn controller_config(flag: &str, path: &Path) -> Result<ControllerConfig, String> {
    ControllerConfig::load(path).map_err(|e| expert(flag, path, e))
}

/// `--seed-map FILE` for the geometry `g`: [`ResidencyMap::load`] (at most
/// [`expert_residency::MAX_MAP_FILE_BYTES`]).
///
/// # Errors
/// The loader's errors, naming the flag and the file.
pub fn seed_map(flag: &str, path: &Path, g: &Geometry) -> Result<ResidencyMap, String> {
    ResidencyMap::load(path, g).map_err(|e| expert(flag, path, e))
}

/// `--dump FILE`: [`CounterDump::load`] (at most [`expert_residency::MAX_DUMP_FILE_BYTES`]).
///
/// # Errors
/// The loader's errors, naming the flag and the file.
pub fn counter_dump(flag: &str, path: &Path) -> Result<CounterDump, String> {
    CounterDump::load(path).map_err(|e| expert(flag, path, e))
}

/// A JSON document of at most `cap` bytes ([`tier_core::read_json`]).
///
/// # Errors
/// Read and parse errors, naming the flag and the file.
pub fn json(flag: &str, path: &Path, cap: u64) -> Result<serde_json::Value, String> {
    tier_core::read_json(path, cap).map_err(|e| named(flag, path, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_the_flag_and_the_file_once() {
        let p = Path::new("/nonexistent/x.json");
        let e = controller_config("--config", p).unwrap_err();
        assert!(e.starts_with("--config /nonexistent/x.json: "), "{e}");
        assert_eq!(e.matches("/nonexistent/x.json").count(), 1, "{e}");
        let e = json("--routing-counts", Path::new("/"), 10).unwrap_err();
        assert_eq!(e, "--routing-counts /: is a directory, not a file");
        assert_eq!(named("--x", p, "bad"), "--x /nonexistent/x.json: bad");
    }
}
