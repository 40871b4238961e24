//! `kv_serving_bench --out` JSON reports, read for `kv fit-time`, `kv simulate --time-from` and
//! `kv plot-bench`: bounded reads, several reports pooled only when they describe the same
//! scenario on the same device, and the per-placement views those commands need.

use std::path::{Path, PathBuf};

use serde_json::Value;

use tierkit_sim::kv::serving::Placement;

use crate::{input, plot};

type Error = Box<dyn std::error::Error>;

/// (batch, misses, µs) steps of one placement.
pub type Steps = Vec<(u32, u64, f64)>;

/// The runs of one or more reports, in the order given.
pub struct Reports {
    /// The reports' `device` (all agree), when it is a string.
    pub device: Option<String>,
    /// Every report's `runs[]`, each annotated with `"scenario_max_batch"`: its own report's
    /// scenario batch limit (to tell a run capped below it).
    pub runs: Vec<Value>,
    /// Each report's `commit` (the commit `kv_serving_bench` was built from), in the order given;
    /// `unknown` for reports written before it was recorded (no `commit` field) or not a string.
    pub commits: Vec<String>,
    paths: Vec<PathBuf>,
}

impl Reports {
    /// Reads `paths`, given with `flag` (named in read errors), each a JSON object with a `runs`
    /// array, at most [`MAX_REPORT_BYTES`] together (a bounded read: a larger file or stream
    /// fails without being held). Several reports must name the same `device` and the same
    /// `scenario` apart from its `max_batch` (runs of one workload on one GPU; their steps then
    /// pool per placement), and no report may be given twice, under its name or another (same
    /// contents: its steps would count double).
    pub fn load(paths: &[PathBuf], flag: &str) -> Result<Self, Error> {
        let mut runs = Vec::new();
        let mut commits = Vec::new();
        let mut first: Option<(PathBuf, Value, Value)> = None;
        let mut digests: Vec<(u64, u64)> = Vec::new();
        let mut left = MAX_REPORT_BYTES;
        for path in paths {
            let (mut v, digest) = read(flag, path, left)?;
            left -= digest.0;
            if let Some(j) = digests.iter().position(|&d| d == digest) {
                return Err(input::named(
                    flag,
                    path,
                    format!(
                        "given twice (the same contents as {}; its steps would count double)",
                        paths[j].display()
                    ),
                )
                .into());
            }
            digests.push(digest);
            let Some(obj) = v.as_object_mut() else {
                return Err(input::named(
                    flag,
                    path,
                    "not a JSON object (a kv_serving_bench --out report?)",
                )
                .into());
            };
            commits.push(match obj.remove("commit") {
                Some(Value::String(c)) if !c.is_empty() => c,
                _ => "unknown".to_string(),
            });
            let device = obj.remove("device").unwrap_or(Value::Null);
            let mut scenario = obj.remove("scenario").unwrap_or(Value::Null);
            let max_batch = scenario
                .as_object_mut()
                .and_then(|s| s.remove("max_batch"))
                .unwrap_or(Value::Null);
            match &first {
                None => first = Some((path.clone(), device, scenario)),
                Some((p0, d0, s0)) => {
                    let why = if *d0 != device {
                        format!("measured on different devices ({d0} vs {device})")
                    } else if *s0 != scenario {
                        "different scenarios (row bytes, layers, top-k, hot rows, budget, ...; only max_batch may differ)".into()
                    } else {
                        String::new()
                    };
                    if !why.is_empty() {
                        return Err(format!(
                            "{} and {}: {why}; fit or plot them separately",
                            p0.display(),
                            path.display()
                        )
                        .into());
                    }
                }
            }
            let Some(Value::Array(rs)) = obj.remove("runs") else {
                return Err(input::named(
                    flag,
                    path,
                    "no `runs` array (a kv_serving_bench --out report?)",
                )
                .into());
            };
            for (i, mut r) in rs.into_iter().enumerate() {
                let Some(run) = r.as_object_mut() else {
                    return Err(
                        input::named(flag, path, format!("runs[{i}] is not an object")).into(),
                    );
                };
                run.insert("scenario_max_batch".into(), max_batch.clone());
                runs.push(r);
            }
        }
        let device = first
            .as_ref()
            .and_then(|(_, d, _)| d.as_str().map(str::to_string));
        Ok(Reports {
            device,
            runs,
            commits,
            paths: paths.to_vec(),
        })
    }

    /// The distinct [`Reports::commits`] in order of first appearance, comma separated.
    pub fn commits_shown(&self) -> String {
        let mut seen: Vec<&str> = Vec::new();
        for c in &self.commits {
            if !seen.contains(&c.as_str()) {
                seen.push(c);
            }
        }
        seen.join(", ")
    }

    /// The reports' paths for messages: `a.json` or `a.json + b.json`.
    pub fn shown(&self) -> String {
        shown(&self.paths)
    }

    /// The measured steps per placement name, in report order (several reports pooled), and
    /// how many step records were left out: not an object, or a `batch` that is not a whole
    /// number below 2³², `misses` not a whole number, `step_us` not finite and ≥ 0.
    pub fn steps_by_placement(&self) -> (Vec<(String, Steps)>, usize) {
        let mut by: Vec<(String, Steps)> = Vec::new();
        let mut skipped = 0usize;
        for r in &self.runs {
            let name = r["placement"].as_str().unwrap_or("?").to_string();
            let steps = r["steps"].as_array().map(|s| s.as_slice()).unwrap_or(&[]);
            let mut pts: Steps = Vec::with_capacity(steps.len());
            for s in steps {
                let step = (|| {
                    Some((
                        u32::try_from(s["batch"].as_u64()?).ok()?,
                        s["misses"].as_u64()?,
                        s["step_us"]
                            .as_f64()
                            .filter(|t| t.is_finite() && *t >= 0.0)?,
                    ))
                })();
                match step {
                    Some(p) => pts.push(p),
                    None => skipped += 1,
                }
            }
            match by.iter_mut().find(|(n, _)| *n == name) {
                Some((_, v)) => v.extend(pts),
                None => by.push((name, pts)),
            }
        }
        (by, skipped)
    }

    /// [`Reports::steps_by_placement`], with a warning on stderr when step records were left out.
    pub fn steps_by_placement_warned(&self) -> Vec<(String, Steps)> {
        let (by, skipped) = self.steps_by_placement();
        if skipped > 0 {
            errln!(
                "warning: {}: {skipped} step records left out (fields missing or out of range)",
                self.shown()
            );
        }
        by
    }

    /// The fully resident placement's admission copy rate (its runs' admission bytes over their
    /// copy time), GB/s; None without such runs.
    pub fn admission_gbps(&self) -> Option<f64> {
        let (mut bytes, mut ms) = (0.0f64, 0.0f64);
        for r in self
            .runs
            .iter()
            .filter(|r| r["placement"] == Placement::FullyResident.name())
        {
            bytes += r["admission_bytes"].as_f64().unwrap_or(0.0);
            ms += r["admission_copy_ms"].as_f64().unwrap_or(0.0);
        }
        (bytes > 0.0 && ms > 0.0).then(|| bytes / (ms * 1e6))
    }

    /// One line per placement against the load for `kv plot-bench`: x = log2(load) (so 0.5 … 64
    /// spread evenly), y = `f(run)`; points sorted by load. A run capped below its report's
    /// scenario batch limit is its own line (`elastic, batch ≤ 112`). Runs without a positive
    /// load or without `f` are left out.
    ///
    /// # Errors
    /// Two runs on one line at the same load (e.g. one load's runs from two reports): the chart
    /// would join them with a vertical segment; plot such reports separately.
    pub fn series_by_load(
        &self,
        f: &dyn Fn(&Value) -> Option<f64>,
    ) -> Result<Vec<plot::Series>, Error> {
        let mut out: Vec<plot::Series> = Vec::new();
        for r in &self.runs {
            let (Some(placement), Some(load), Some(y)) =
                (r["placement"].as_str(), r["load"].as_f64(), f(r))
            else {
                continue;
            };
            if load.is_nan() || load <= 0.0 {
                continue;
            }
            let name = match (r["max_batch"].as_u64(), r["scenario_max_batch"].as_u64()) {
                (Some(b), Some(limit)) if b < limit => format!("{placement}, batch ≤ {b}"),
                _ => placement.to_string(),
            };
            let pt = (load.log2(), y);
            match out.iter_mut().find(|(n, _)| *n == name) {
                Some((_, pts)) if pts.iter().any(|p| p.0 == pt.0) => {
                    return Err(format!(
                        "{}: two `{name}` runs at load {load}; plot these reports separately",
                        self.shown()
                    )
                    .into())
                }
                Some((_, pts)) => pts.push(pt),
                None => out.push((name, vec![pt])),
            }
        }
        for (_, pts) in &mut out {
            pts.sort_by(|a, b| a.0.total_cmp(&b.0));
        }
        Ok(out)
    }
}

/// Paths for messages: `a.json` or `a.json + b.json`.
pub fn shown(paths: &[PathBuf]) -> String {
    paths
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(" + ")
}

/// Most bytes of reports read by one command, all files together: a parsed report takes ~20× its
/// size in memory; the H200 runs of 1,500 steps × 3 placements are under 1 MiB.
pub const MAX_REPORT_BYTES: u64 = 64 << 20;

/// One report as JSON, parsed as it streams through tier-core's bounded reader with `left` of the
/// [`MAX_REPORT_BYTES`] still to read (so garbage, `/dev/zero` included, fails at its first bad
/// byte, not at the cap); errors name `flag` and the file. Also returns the file's length and a
/// hash of its bytes, to tell a copy of a report given under another name.
fn read(flag: &str, path: &Path, left: u64) -> Result<(Value, (u64, u64)), Error> {
    let mut r = tier_core::open_capped(path, left).map_err(|e| too_large(flag, path, left, e))?;
    parse(flag, path, left, &mut r)
}

/// A read error of a report, with a cap below [`MAX_REPORT_BYTES`] said to be the reports' total.
fn too_large(flag: &str, path: &Path, left: u64, e: tier_core::ReadError) -> String {
    match e {
        tier_core::ReadError::TooLarge { .. } if left < MAX_REPORT_BYTES => input::named(
            flag,
            path,
            format!(
                "the reports given hold more than {} together, the most one command reads",
                tier_core::show_bytes(MAX_REPORT_BYTES)
            ),
        ),
        e => input::named(flag, path, e),
    }
}

/// Bytes read through it, and their hash.
struct Hashing<R> {
    inner: R,
    len: u64,
    hash: std::collections::hash_map::DefaultHasher,
}

impl<R: std::io::Read> std::io::Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        use std::hash::Hasher;
        let n = self.inner.read(buf)?;
        self.hash.write(&buf[..n]);
        self.len += n as u64;
        Ok(n)
    }
}

/// [`read`]'s parse of `r` (capped at `left` bytes): JSON streamed, hashed as it goes.
fn parse<R: std::io::Read>(
    flag: &str,
    path: &Path,
    left: u64,
    r: &mut tier_core::CappedReader<R>,
) -> Result<(Value, (u64, u64)), Error> {
    use std::hash::Hasher;
    let mut h = Hashing {
        inner: &mut *r,
        len: 0,
        hash: Default::default(),
    };
    let parsed: Result<Value, _> = serde_json::from_reader(std::io::BufReader::new(&mut h));
    let digest = (h.len, h.hash.finish());
    match parsed {
        Ok(v) => Ok((v, digest)),
        Err(_) if r.exceeded() => {
            let e = tier_core::ReadError::TooLarge {
                path: path.display().to_string(),
                cap: r.cap(),
            };
            Err(too_large(flag, path, left, e).into())
        }
        Err(e) if e.is_io() => Err(input::named(flag, path, e).into()),
        Err(e) => Err(input::named(
            flag,
            path,
            format!("not a kv_serving_bench JSON report: {e}"),
        )
        .into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn report(dir: &Path, name: &str, v: Value) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, v.to_string()).unwrap();
        p
    }

    fn scenario(max_batch: u64, hot_rows: u64) -> Value {
        json!({"row_bytes": 656, "hot_rows": hot_rows, "max_batch": max_batch})
    }

    fn run(placement: &str, load: f64, max_batch: u64, tokens: f64) -> Value {
        json!({"placement": placement, "load": load, "max_batch": max_batch,
               "summary": {"tokens_per_s": tokens},
               "steps": [{"batch": 2, "misses": 10, "step_us": 100.0}]})
    }

    fn tmp(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("tierkit-report-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn the_build_commit_is_read_and_old_reports_without_one_read_as_unknown() {
        let d = tmp("commit");
        let body = |commit: Option<&str>, load: f64| {
            let mut v = json!({"device": "H200", "scenario": scenario(256, 4096),
                "runs": [run("elastic", load, 256, 1.0)]});
            if let Some(c) = commit {
                v["commit"] = json!(c);
            }
            v
        };
        let paths = [
            report(&d, "new.json", body(Some("abc1234"), 1.0)),
            report(&d, "old.json", body(None, 2.0)),
            report(&d, "again.json", body(Some("abc1234"), 4.0)),
        ];
        let r = Reports::load(&paths, "report").unwrap();
        assert_eq!(r.commits, ["abc1234", "unknown", "abc1234"]);
        assert_eq!(r.commits_shown(), "abc1234, unknown");
        assert_eq!(
            r.runs.len(),
            3,
            "the commit does not take part in the scenario check"
        );
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn series_are_sorted_by_load_and_a_capped_run_is_its_own_line() {
        let d = tmp("series");
        let a = report(
            &d,
            "a.json",
            json!({"device": "H200", "scenario": scenario(256, 4096), "runs": [
            run("elastic", 64.0, 112, 3.0), run("fixed hot cache", 64.0, 256, 2.0)]}),
        );
        let b = report(
            &d,
            "b.json",
            json!({"device": "H200", "scenario": scenario(256, 4096), "runs": [
            run("elastic", 0.5, 112, 1.0), run("fixed hot cache", 0.5, 256, 0.5)]}),
        );
        let r = Reports::load(&[a, b], "report").unwrap();
        let s = r
            .series_by_load(&|r| r["summary"]["tokens_per_s"].as_f64())
            .unwrap();
        assert_eq!(
            s,
            vec![
                (
                    "elastic, batch ≤ 112".to_string(),
                    vec![(-1.0, 1.0), (6.0, 3.0)]
                ),
                ("fixed hot cache".to_string(), vec![(-1.0, 0.5), (6.0, 2.0)]),
            ]
        );
        // the steps pool per placement
        let (by, skipped) = r.steps_by_placement();
        assert_eq!(skipped, 0);
        assert_eq!(by[0].0, "elastic");
        assert_eq!(by[0].1.len(), 2);
    }

    #[test]
    fn a_run_capped_by_its_own_scenario_keeps_the_plain_name_and_clashes_are_errors() {
        let d = tmp("clash");
        // --max-batch 112 for every placement: the scenario says 112, the run is not "capped"
        let a = report(
            &d,
            "a.json",
            json!({"device": "H200", "scenario": scenario(112, 4096), "runs": [
            run("fixed hot cache", 64.0, 112, 3.0)]}),
        );
        let b = report(
            &d,
            "b.json",
            json!({"device": "H200", "scenario": scenario(256, 4096), "runs": [
            run("fixed hot cache", 64.0, 256, 2.0)]}),
        );
        let r = Reports::load(&[a.clone(), b], "report").unwrap();
        let e = r
            .series_by_load(&|r| r["summary"]["tokens_per_s"].as_f64())
            .unwrap_err();
        assert!(
            e.to_string()
                .contains("two `fixed hot cache` runs at load 64"),
            "{e}"
        );
        // the same file twice, another scenario, another device: refused, naming the files
        let e = Reports::load(&[a.clone(), a.clone()], "report")
            .err()
            .unwrap();
        assert!(e.to_string().contains("given twice"), "{e}");
        let copy = d.join("copy-of-a.json");
        std::fs::copy(&a, &copy).unwrap();
        let e = Reports::load(&[a.clone(), copy], "report").err().unwrap();
        assert!(e.to_string().contains("same contents"), "{e}");
        let c = report(
            &d,
            "c.json",
            json!({"device": "H200", "scenario": scenario(256, 2048), "runs": []}),
        );
        let e = Reports::load(&[a.clone(), c], "report").err().unwrap();
        assert!(e.to_string().contains("different scenarios"), "{e}");
        for (name, bad, want) in [
            ("arr.json", json!([]), "not a JSON object"),
            ("num.json", json!(5), "not a JSON object"),
            ("runs.json", json!({"runs": 3}), "no `runs` array"),
            ("run.json", json!({"runs": [1]}), "runs[0] is not an object"),
        ] {
            let p = report(&d, name, bad);
            let e = Reports::load(&[p], "report").err().unwrap();
            assert!(e.to_string().contains(want), "{name}: {e}");
        }
        // odd field types are left out, not a panic
        let odd = report(
            &d,
            "odd.json",
            json!({"scenario": 7, "runs": [{"placement": 5, "load": "a"}]}),
        );
        let r = Reports::load(&[odd], "report").unwrap();
        assert!(r
            .series_by_load(&|r| r["load"].as_f64())
            .unwrap()
            .is_empty());
        assert_eq!(r.steps_by_placement().0[0].1.len(), 0);
        // steps with fields of the wrong type or range are counted as left out
        let bad = report(
            &d,
            "steps.json",
            json!({"runs": [{"placement": "elastic", "steps": [
                {"batch": 2, "misses": 1, "step_us": 10.0},
                {"batch": "2", "misses": 1, "step_us": 10.0},
                {"batch": 4294967298u64, "misses": 1, "step_us": 10.0},
                {"batch": 2, "misses": null, "step_us": 10.0},
                {"batch": 2, "misses": 1, "step_us": -1.0},
                7
            ]}]}),
        );
        let (by, skipped) = Reports::load(&[bad], "report")
            .unwrap()
            .steps_by_placement();
        assert_eq!((by[0].1.len(), skipped), (1, 5));
        let g = report(
            &d,
            "g.json",
            json!({"device": "B200", "scenario": scenario(112, 4096), "runs": []}),
        );
        let e = Reports::load(&[a, g], "report").err().unwrap();
        assert!(e.to_string().contains("different devices"), "{e}");
    }

    #[test]
    fn garbage_is_refused_at_its_first_bytes_not_read_to_the_cap() {
        use std::io::Read;
        // A stream of zeros (`/dev/zero`) or of any non-JSON byte: one buffer read, then the
        // refusal; before, the whole 64 MiB cap was read (and hashed) first.
        for byte in [0u8, b'x', 0xff] {
            let mut src = std::io::repeat(byte).take(1 << 30);
            let mut r = tier_core::CappedReader::new(&mut src, MAX_REPORT_BYTES);
            let e = parse("report", Path::new("/dev/zero"), MAX_REPORT_BYTES, &mut r)
                .err()
                .unwrap()
                .to_string();
            assert!(
                e.starts_with("report /dev/zero: not a kv_serving_bench JSON report"),
                "{e}"
            );
            let read = (1u64 << 30) - src.limit();
            assert!(read <= 64 << 10, "{read} bytes read before refusing");
        }
        // A valid report followed by endless whitespace still hits the cap, named as before.
        let mut src = std::io::Read::chain(VALID.as_bytes(), std::io::repeat(b' ').take(1 << 20));
        let mut r = tier_core::CappedReader::new(&mut src, 4096);
        let e = parse("report", Path::new("r.json"), 4096, &mut r)
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains("the reports given hold more than 64 MiB together"),
            "{e}"
        );
        let mut r = tier_core::CappedReader::new(VALID.as_bytes(), MAX_REPORT_BYTES);
        let (v, (len, _)) = parse("report", Path::new("r.json"), MAX_REPORT_BYTES, &mut r).unwrap();
        assert_eq!(len, VALID.len() as u64);
        assert_eq!(v["device"], "H200");
    }

    const VALID: &str = r#"{"device": "H200", "commit": "abc", "scenario": {"max_batch": 8},
        "runs": [{"placement": "elastic", "load": 2, "max_batch": 4, "miss_bytes_per_step": 3,
        "summary": {"tokens_per_s": 5, "median_batch": 2},
        "steps": [{"batch": 2, "misses": 4, "step_us": 10.5}, {"batch": 3, "misses": 0,
        "step_us": 11}]}, {"placement": "fully resident", "load": 1, "admission_bytes": 5,
        "admission_copy_ms": 1}]}"#;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(10_000))]

        /// Any bytes as a report: read, and every view the commands take of it, without a
        /// panic; or an error naming the flag and the file.
        #[test]
        fn any_bytes_as_a_report_are_read_or_a_named_error(
            bytes in tierkit_testkit::hostile_bytes(VALID)
        ) {
            let d = tmp("prop");
            let p = d.join("r.json");
            std::fs::write(&p, &bytes).unwrap();
            match Reports::load(std::slice::from_ref(&p), "--time-from") {
                Ok(r) => {
                    let _ = r.steps_by_placement();
                    let _ = r.admission_gbps();
                    let _ = r.commits_shown();
                    let _ = r.series_by_load(&|v| v["summary"]["tokens_per_s"].as_f64());
                }
                Err(e) => {
                    let e = e.to_string();
                    prop_assert!(e.starts_with(&format!("--time-from {}: ", p.display())), "{}", e);
                }
            }
        }
    }
}
