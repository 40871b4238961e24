//! The side-input files the commands read (controller configs, seed maps, counter dumps, routing
//! counts; the benchmark reports in `kv/report.rs`): every one through tier-core's bounded reader
//! (through the library loaders where the crate has one, with their caps), every error naming the
//! flag and the file. Trace and engine count files go through the lab's trace readers instead.

use std::path::Path;

use expert_residency::{
    ControllerConfig, CounterDump, ExpertError, Geometry, MapFile, ResidencyMap,
};

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

/// An `expert-residency` loader's (or saver's) error, named: the file-level ones
/// (`ExpertError::Format`) carry the path already, the others (an out-of-range value, a geometry
/// mismatch) get it.
pub fn expert(flag: &str, path: &Path, e: ExpertError) -> String {
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

/// `--seed-map FILE` as saved ([`MapFile::load`], at most
/// [`expert_residency::MAX_MAP_FILE_BYTES`]): read before the trace, so a bad file fails first.
///
/// # Errors
/// The loader's errors, naming the flag and the file.
pub fn map_file(flag: &str, path: &Path) -> Result<MapFile, String> {
    MapFile::load(path).map_err(|e| expert(flag, path, e))
}

/// A map file read by [`map_file`] as the map of geometry `g` ([`ResidencyMap::from_file`]).
///
/// # Errors
/// Format, geometry and hot-set errors, naming the flag and the file.
pub fn seed_map(
    flag: &str,
    path: &Path,
    file: MapFile,
    g: &Geometry,
) -> Result<ResidencyMap, String> {
    ResidencyMap::from_file(file, g).map_err(|e| expert(flag, path, e))
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

/// `--routing-counts FILE` (`{model: {domain: {layers, topk_counts}}}`, at most
/// [`MAX_ROUTING_COUNTS_BYTES`]): `model`/`domain`'s counts as a `layers × experts` dump,
/// unmeasured layers derived as the synthetic generator does.
///
/// # Errors
/// Read, parse, shape and profile errors, naming the flag and the file.
pub fn routing_counts(
    flag: &str,
    path: &Path,
    model: &str,
    domain: &str,
    layers: u32,
    experts: u32,
) -> Result<CounterDump, String> {
    let json = json(flag, path, MAX_ROUTING_COUNTS_BYTES)?;
    let prof = tierkit_sim::experts::trace::synth::DomainProfile::from_routing_counts(
        &json, model, domain, experts, layers,
    )
    .map_err(|e| named(flag, path, e))?;
    CounterDump::new(
        format!("{model}/{domain}"),
        layers,
        experts,
        prof.shares.concat(),
    )
    .map_err(|e| named(flag, path, e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use tierkit_testkit::hostile_bytes;

    const VALID: &str = r#"{"m": {"d": {"layers": [0, 1],
        "topk_counts": [{"0": 5, "1": 2, "2": 9, "3": 1}, {"0": 1, "1": 7, "2": 3, "3": 4}]}}}"#;

    fn temp(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("tierkit-input-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d.join(name)
    }

    #[test]
    fn routing_counts_read_a_valid_file() {
        let p = temp("rc.json");
        std::fs::write(&p, VALID).unwrap();
        let d = routing_counts("--routing-counts", &p, "m", "d", 2, 4).unwrap();
        assert_eq!((d.layers, d.experts_per_layer, d.counts.len()), (2, 4, 8));
        let e = routing_counts("--routing-counts", &p, "m", "x", 2, 4).unwrap_err();
        assert!(
            e.starts_with(&format!("--routing-counts {}: ", p.display())),
            "{e}"
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(10_000))]

        /// Any bytes: a dump of the asked shape or an error naming the flag and file.
        #[test]
        fn any_bytes_as_routing_counts_are_a_dump_or_a_named_error(
            bytes in hostile_bytes(VALID)
        ) {
            let p = temp("prop-rc.json");
            std::fs::write(&p, &bytes).unwrap();
            match routing_counts("--routing-counts", &p, "m", "d", 2, 4) {
                Ok(d) => prop_assert!(d.validate().is_ok() && d.counts.len() == 8),
                Err(e) => prop_assert!(
                    e.starts_with(&format!("--routing-counts {}: ", p.display())),
                    "{}", e
                ),
            }
        }
    }

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
