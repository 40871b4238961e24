//! Arrival traces: request arrival times and input / output lengths (Mooncake JSONL or any
//! compatible JSONL), plus a built-in synthetic scenario that needs no file.

use std::io::BufRead;
use std::path::Path;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use kv_elastic::{KvError, Result};

/// Most tokens (input + output) of one trace request: 16 Mi, the selection model's
/// [`crate::kv::selection::MAX_HISTORY`] (Mooncake's longest conversation is about 128 Ki tokens).
pub const MAX_REQUEST_TOKENS: u32 = crate::kv::selection::MAX_HISTORY;

/// One request of an arrival trace.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TraceRequest {
    /// Arrival time, milliseconds from the trace start.
    #[serde(alias = "timestamp")]
    pub arrival_ms: u64,
    /// Prompt (history at admission) length, tokens.
    pub input_length: u32,
    /// Tokens generated (decode steps).
    pub output_length: u32,
}

/// A whole arrival trace, sorted by arrival time.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ArrivalTrace {
    /// A short name (file stem or scenario name).
    pub name: String,
    /// Requests, sorted by `arrival_ms`.
    pub requests: Vec<TraceRequest>,
}

impl ArrivalTrace {
    /// Reads JSONL with one object per line carrying `timestamp` (ms; or `arrival_ms`),
    /// `input_length` and `output_length` (tokens; other fields, e.g. Mooncake's `hash_ids`, are
    /// ignored). Requests with a zero input length are skipped (they have no history to place).
    /// Errors: `KvError::Trace` with the line number for an unreadable or malformed line or a request
    /// of more than [`MAX_REQUEST_TOKENS`] tokens (input + output); `KvError::Trace` when no request
    /// with history remains (an empty trace).
    pub fn from_reader(name: &str, reader: impl BufRead) -> Result<Self> {
        let mut requests = Vec::new();
        for (i, line) in reader.lines().enumerate() {
            let line = line.map_err(|e| KvError::Trace(format!("line {}: {e}", i + 1)))?;
            if line.trim().is_empty() {
                continue;
            }
            let r: TraceRequest = serde_json::from_str(&line)
                .map_err(|e| KvError::Trace(format!("line {}: {e}", i + 1)))?;
            let total = r.input_length as u64 + r.output_length as u64;
            if total > MAX_REQUEST_TOKENS as u64 {
                return Err(KvError::Trace(format!(
                    "line {}: request of {total} tokens (input + output), at most {MAX_REQUEST_TOKENS}",
                    i + 1
                )));
            }
            if r.input_length > 0 {
                requests.push(r);
            }
        }
        if requests.is_empty() {
            return Err(KvError::Trace(
                "no request with input_length > 0 (empty trace)".into(),
            ));
        }
        requests.sort_by_key(|r| r.arrival_ms);
        Ok(Self {
            name: name.to_string(),
            requests,
        })
    }

    /// Reads a JSONL file (see [`ArrivalTrace::from_reader`]); every error names the file.
    pub fn from_path(path: &Path) -> Result<Self> {
        let named = |m: String| KvError::Trace(format!("{}: {m}", path.display()));
        if path.is_dir() {
            return Err(named("is a directory, expected a JSONL file".into()));
        }
        let f = std::fs::File::open(path).map_err(|e| named(e.to_string()))?;
        let name = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        Self::from_reader(&name, std::io::BufReader::new(f)).map_err(|e| match e {
            KvError::Trace(m) => named(m),
            e => e,
        })
    }

    /// The built-in scenario (no file needed): `n` requests, Poisson arrivals at `rate_per_s`,
    /// log-normal input lengths (median 8,000, clipped to 1,000..=64,000 tokens, like the
    /// Mooncake conversation trace's bulk) and output lengths uniform in 100..=600.
    pub fn synthetic(n: usize, rate_per_s: f64, seed: u64) -> Self {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut t = 0.0f64;
        let requests = (0..n)
            .map(|_| {
                t += -(1.0 - rng.random::<f64>()).ln() / rate_per_s * 1000.0;
                // Box-Muller normal, sigma 0.8 in log space.
                let (u1, u2): (f64, f64) = (rng.random::<f64>().max(1e-12), rng.random());
                let z = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
                let input = (8000.0 * (0.8 * z).exp()).clamp(1000.0, 64000.0) as u32;
                TraceRequest {
                    arrival_ms: t as u64,
                    input_length: input,
                    output_length: rng.random_range(100..=600),
                }
            })
            .collect();
        Self {
            name: "synthetic".into(),
            requests,
        }
    }

    /// Keeps the first `n` requests.
    pub fn truncate(&mut self, n: usize) {
        self.requests.truncate(n);
    }

    /// Divides every arrival time by `factor` (> 1 = more load; finite and > 0, as
    /// [`crate::kv::serving::SimConfig::validate`] checks: a NaN factor would put every arrival at 0).
    pub fn speed_up(&mut self, factor: f64) {
        for r in &mut self.requests {
            r.arrival_ms = (r.arrival_ms as f64 / factor) as u64;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_mooncake_lines_and_reports_bad_lines() {
        let text = "{\"timestamp\": 5, \"input_length\": 10, \"output_length\": 2, \"hash_ids\": [0]}\n\n{\"timestamp\": 1, \"input_length\": 3, \"output_length\": 4}\n{\"timestamp\": 2, \"input_length\": 0, \"output_length\": 4}\n";
        let t = ArrivalTrace::from_reader("t", text.as_bytes()).unwrap();
        assert_eq!(t.requests.len(), 2);
        assert_eq!(
            t.requests[0],
            TraceRequest {
                arrival_ms: 1,
                input_length: 3,
                output_length: 4
            }
        );
        let bad = ArrivalTrace::from_reader("t", "{\"timestamp\": 1}\n".as_bytes());
        assert!(matches!(bad, Err(KvError::Trace(m)) if m.starts_with("line 1")));
    }

    #[test]
    fn empty_huge_and_directory_traces_are_typed_errors() {
        for text in [
            "",
            "\n\n",
            "{\"timestamp\": 2, \"input_length\": 0, \"output_length\": 4}\n",
        ] {
            let r = ArrivalTrace::from_reader("t", text.as_bytes());
            assert!(
                matches!(r, Err(KvError::Trace(m)) if m.contains("empty trace")),
                "{text:?}"
            );
        }
        let huge = "{\"timestamp\": 1, \"input_length\": 4294967295, \"output_length\": 1}\n";
        let r = ArrivalTrace::from_reader("t", huge.as_bytes());
        assert!(
            matches!(r, Err(KvError::Trace(m)) if m.starts_with("line 1") && m.contains("at most"))
        );
        let dir = std::env::temp_dir();
        let r = ArrivalTrace::from_path(&dir);
        assert!(
            matches!(&r, Err(KvError::Trace(m)) if m.contains(&dir.display().to_string()) && m.contains("directory")),
            "{r:?}"
        );
        let file = dir.join(format!("kv-trace-empty-{}.jsonl", std::process::id()));
        std::fs::write(&file, "{\"timestamp\": 1}\n").unwrap();
        let r = ArrivalTrace::from_path(&file);
        std::fs::remove_file(&file).unwrap();
        assert!(
            matches!(&r, Err(KvError::Trace(m)) if m.contains(&file.display().to_string()) && m.contains("line 1")),
            "{r:?}"
        );
    }

    #[test]
    fn synthetic_is_deterministic_and_sorted() {
        let a = ArrivalTrace::synthetic(100, 2.0, 3);
        assert_eq!(a, ArrivalTrace::synthetic(100, 2.0, 3));
        assert!(a
            .requests
            .windows(2)
            .all(|w| w[0].arrival_ms <= w[1].arrival_ms));
        assert!(a
            .requests
            .iter()
            .all(|r| (1000..=64000).contains(&r.input_length)));
    }
}
