//! The crate's file loaders (`ControllerConfig::load`, `ResidencyMap::load`, `CounterDump::load`)
//! on hostile files: bounded reads (a sparse file above the cap, `/dev/zero`), directories,
//! missing files, arrays for objects, and arbitrary bytes (proptest): always a typed error naming
//! the file, never a panic or an unbounded read.

use expert_residency::{
    ControllerConfig, CounterDump, ExpertError, Geometry, ResidencyMap, MAX_CONFIG_FILE_BYTES,
    MAX_DUMP_FILE_BYTES, MAX_MAP_FILE_BYTES,
};
use proptest::prelude::*;
use std::path::{Path, PathBuf};
use tierkit_testkit::hostile_bytes as hostile;

fn temp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("er-loaders-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d.join(name)
}

fn geo() -> Geometry {
    Geometry::new(2, 8, 3, 16).unwrap()
}

/// A loader as a function of the path.
type Loader = Box<dyn Fn(&Path) -> Result<(), ExpertError>>;

/// Each loader, named.
fn loaders() -> [(&'static str, Loader); 3] {
    [
        ("config", Box::new(|p| ControllerConfig::load(p).map(drop))),
        ("map", Box::new(|p| ResidencyMap::load(p, &geo()).map(drop))),
        ("dump", Box::new(|p| CounterDump::load(p).map(drop))),
    ]
}

const VALID_MAP: &str = r#"{"format": "tierkit.expert-residency.rowmap", "version": 1,
    "model": "m", "geometry": {"layers": 2, "experts_per_layer": 8, "hot_per_layer": 3,
    "expert_bytes": 16}, "hot": [[7, 2, 5], [0, 1, 3]]}"#;
const VALID_DUMP: &str =
    r#"{"name": "d", "layers": 1, "experts_per_layer": 4, "counts": [1, 0, 2.5, 3]}"#;
const VALID_CONFIG: &str = r#"{"drain_every": 16, "half_life_steps": 64.0,
    "cost": {"payback": 2.0, "z": 1.0}, "shift_response": {"jump_ratio": 2.0},
    "adaptive": null, "policy": "ratio"}"#;

#[test]
fn valid_files_load() {
    let p = temp("valid.json");
    std::fs::write(&p, VALID_CONFIG).unwrap();
    assert_eq!(ControllerConfig::load(&p).unwrap().drain_every, 16);
    std::fs::write(&p, VALID_MAP).unwrap();
    let m = ResidencyMap::load(&p, &geo()).unwrap();
    assert_eq!(m.hot_sets(), vec![vec![7, 2, 5], vec![0, 1, 3]]);
    std::fs::write(&p, VALID_DUMP).unwrap();
    assert_eq!(CounterDump::load(&p).unwrap().counts, [1.0, 0.0, 2.5, 3.0]);
}

#[test]
fn files_above_the_cap_are_refused_before_reading() {
    for ((name, load), cap) in loaders().into_iter().zip([
        MAX_CONFIG_FILE_BYTES,
        MAX_MAP_FILE_BYTES,
        MAX_DUMP_FILE_BYTES,
    ]) {
        let p = temp(&format!("huge-{name}.json"));
        // Sparse: one byte above the cap, no disk used. A whole read of the old loaders took
        // as much memory as the file.
        std::fs::File::create(&p).unwrap().set_len(cap + 1).unwrap();
        let e = load(&p).unwrap_err().to_string();
        assert!(
            e.contains(&p.display().to_string()) && e.contains("the most this input may hold"),
            "{name}: {e}"
        );
        std::fs::remove_file(&p).unwrap();
    }
}

#[test]
fn directories_missing_files_and_endless_streams_are_named_errors() {
    let dir = std::env::temp_dir();
    let missing = temp("no-such-file.json");
    for (name, load) in loaders() {
        let e = load(&dir).unwrap_err().to_string();
        assert!(e.contains("is a directory"), "{name}: {e}");
        let e = load(&missing).unwrap_err().to_string();
        assert!(e.contains("no-such-file.json"), "{name}: {e}");
        let zero = Path::new("/dev/zero");
        if zero.exists() {
            // Used to read until the allocator failed; now stops at the first byte.
            let start = std::time::Instant::now();
            let e = load(zero).unwrap_err().to_string();
            assert!(e.starts_with("format: /dev/zero: "), "{name}: {e}");
            assert!(
                start.elapsed().as_secs() < 5,
                "{name}: {:?}",
                start.elapsed()
            );
        } else {
            println!("SKIP /dev/zero part of {name}: no /dev/zero");
        }
    }
}

#[test]
fn arrays_are_refused_where_objects_are_saved() {
    let p = temp("array.json");
    for (name, load) in loaders() {
        for bad in ["[1, 2]", "[]"] {
            std::fs::write(&p, bad).unwrap();
            let e = load(&p).unwrap_err().to_string();
            assert!(
                e.contains("invalid type: sequence") && e.contains("named fields"),
                "{name} {bad}: {e}"
            );
        }
    }
    // A map whose geometry is positional.
    std::fs::write(
        &p,
        VALID_MAP.replace(
            r#"{"layers": 2, "experts_per_layer": 8, "hot_per_layer": 3,
    "expert_bytes": 16}"#,
            "[2, 8, 3, 16]",
        ),
    )
    .unwrap();
    let e = ResidencyMap::load(&p, &geo()).unwrap_err().to_string();
    assert!(e.contains("a geometry as an object"), "{e}");
}

fn check(load: &dyn Fn(&Path) -> Result<(), ExpertError>, path: &Path, bytes: &[u8]) {
    std::fs::write(path, bytes).unwrap();
    if let Err(e) = load(path) {
        // Every failure is typed; file-level ones name the file.
        if let ExpertError::Format(m) = &e {
            assert!(m.starts_with(&path.display().to_string()), "{e}");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(10_000))]

    #[test]
    fn any_bytes_as_a_config_are_a_config_or_an_error(bytes in hostile(VALID_CONFIG)) {
        let p = temp("prop-config.json");
        check(&|p| ControllerConfig::load(p).and_then(|c| c.validate()), &p, &bytes);
    }

    #[test]
    fn any_bytes_as_a_seed_map_are_a_map_of_the_geometry_or_an_error(
        bytes in hostile(VALID_MAP)
    ) {
        let p = temp("prop-map.json");
        check(
            &|p| {
                let m = ResidencyMap::load(p, &geo())?;
                assert_eq!(*m.geometry(), geo());
                Ok(())
            },
            &p,
            &bytes,
        );
    }

    /// A control message (`Controller.apply_control` in Python, `tierkit_controller_apply_control`
    /// in C) from any text: a message that round-trips, or a `Format` error.
    #[test]
    fn any_text_as_a_control_message_is_a_message_or_a_format_error(
        bytes in hostile(r#"{"freeze": false, "baseline": true}"#)
    ) {
        let text = String::from_utf8_lossy(&bytes);
        match expert_residency::ControlMessage::from_json(&text) {
            Ok(m) => prop_assert_eq!(
                expert_residency::ControlMessage::from_json(&m.to_json()).unwrap(),
                m
            ),
            Err(e) => prop_assert!(matches!(e, ExpertError::Format(_)), "{}", e),
        }
    }

    #[test]
    fn any_bytes_as_a_dump_are_a_valid_dump_or_an_error(bytes in hostile(VALID_DUMP)) {
        let p = temp("prop-dump.json");
        check(&|p| CounterDump::load(p)?.validate(), &p, &bytes);
    }
}
