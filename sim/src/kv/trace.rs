//! Arrival traces: request arrival times and input / output lengths (Mooncake JSONL or any
//! compatible JSONL), plus a built-in synthetic scenario that needs no file.

use std::io::{BufRead, Read};
use std::path::Path;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use kv_elastic::{KvError, Result};

/// Most tokens (input + output) of one trace request: 16 Mi, the selection model's
/// [`crate::kv::selection::MAX_HISTORY`] (Mooncake's longest conversation is about 128 Ki tokens).
pub const MAX_REQUEST_TOKENS: u32 = crate::kv::selection::MAX_HISTORY;

/// Bounds of an arrival-trace read ([`ArrivalTrace::from_reader_bounded`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TraceLimits {
    /// Most bytes of one line, without its newline.
    pub max_line_bytes: usize,
    /// Most lines, blank ones included.
    pub max_lines: usize,
    /// Most requests (lines with `input_length > 0`).
    pub max_requests: usize,
}

impl TraceLimits {
    /// 1 MiB per line (a Mooncake line is under 10 KiB), 64 Mi lines, 16 Mi requests (Mooncake's
    /// conversation trace has about 12 K).
    pub const DEFAULT: TraceLimits = TraceLimits {
        max_line_bytes: 1 << 20,
        max_lines: 1 << 26,
        max_requests: 1 << 24,
    };
}

impl Default for TraceLimits {
    fn default() -> Self {
        Self::DEFAULT
    }
}

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
    /// The read is bounded by [`TraceLimits::DEFAULT`] (see [`ArrivalTrace::from_reader_bounded`]),
    /// so an endless input (`/dev/zero`, a pipe) ends in an error, not an unbounded allocation.
    /// Errors: `KvError::Trace` with the line number for an unreadable, malformed, non-UTF-8 or
    /// over-long line or a request of more than [`MAX_REQUEST_TOKENS`] tokens (input + output);
    /// `KvError::Trace` when the trace has more lines or requests than the limits allow, or when
    /// no request with history remains (an empty trace).
    pub fn from_reader(name: &str, reader: impl BufRead) -> Result<Self> {
        Self::from_reader_bounded(name, reader, TraceLimits::DEFAULT)
    }

    /// [`ArrivalTrace::from_reader`] under explicit `limits`: each line is read through a
    /// `take(max_line_bytes + 1)` reader (at most `max_line_bytes + 1` bytes are buffered per
    /// line), at most `max_lines` lines (blank ones included) and `max_requests` requests are read.
    pub fn from_reader_bounded(
        name: &str,
        mut reader: impl BufRead,
        limits: TraceLimits,
    ) -> Result<Self> {
        let mut requests = Vec::new();
        let mut buf = Vec::new();
        let mut line_no = 0usize;
        loop {
            buf.clear();
            let n = (&mut reader)
                .take(limits.max_line_bytes as u64 + 1)
                .read_until(b'\n', &mut buf)
                .map_err(|e| KvError::Trace(format!("line {}: {e}", line_no + 1)))?;
            if n == 0 {
                break;
            }
            line_no += 1;
            if line_no > limits.max_lines {
                return Err(KvError::Trace(format!(
                    "more than {} lines (the trace limit)",
                    limits.max_lines
                )));
            }
            if buf.last() == Some(&b'\n') {
                buf.pop();
            } else if buf.len() > limits.max_line_bytes {
                return Err(KvError::Trace(format!(
                    "line {line_no}: longer than {} bytes (the line limit)",
                    limits.max_line_bytes
                )));
            }
            let line = std::str::from_utf8(&buf)
                .map_err(|e| KvError::Trace(format!("line {line_no}: {e}")))?;
            if line.trim().is_empty() {
                continue;
            }
            let r: TraceRequest = serde_json::from_str(line)
                .map_err(|e| KvError::Trace(format!("line {line_no}: {e}")))?;
            let total = r.input_length as u64 + r.output_length as u64;
            if total > MAX_REQUEST_TOKENS as u64 {
                return Err(KvError::Trace(format!(
                    "line {line_no}: request of {total} tokens (input + output), at most {MAX_REQUEST_TOKENS}"
                )));
            }
            if r.input_length > 0 {
                if requests.len() >= limits.max_requests {
                    return Err(KvError::Trace(format!(
                        "line {line_no}: more than {} requests (the trace limit)",
                        limits.max_requests
                    )));
                }
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

    /// Whether [`ArrivalTrace::speed_up`] by `load` keeps every arrival time meaningful: finite
    /// and > 0, and the last arrival, scaled, at most 1e15 ms (a load so small that it overflows
    /// the millisecond clock would saturate every time silently).
    ///
    /// # Errors
    /// A one-line message naming `--loads` and the value.
    pub fn check_load(&self, load: f64) -> Result<(), String> {
        if !(load.is_finite() && load > 0.0) {
            return Err(format!("--loads {load}: must be finite and > 0"));
        }
        let last_ms = self
            .requests
            .iter()
            .map(|q| q.arrival_ms)
            .max()
            .unwrap_or(0) as f64;
        if last_ms / load > 1e15 {
            return Err(format!(
                "--loads {load:e}: the trace's last arrival ({last_ms} ms) would come after 1e15 ms"
            ));
        }
        Ok(())
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

    /// An endless reader cycling over `pattern`.
    struct Cycle(&'static [u8], usize);

    impl Read for Cycle {
        fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
            for b in out.iter_mut() {
                *b = self.0[self.1 % self.0.len()];
                self.1 += 1;
            }
            Ok(out.len())
        }
    }

    #[test]
    fn endless_inputs_end_in_typed_errors() {
        // One endless line (what /dev/zero is): stops after the line limit.
        let r = ArrivalTrace::from_reader("t", std::io::BufReader::new(std::io::repeat(0)));
        assert!(
            matches!(&r, Err(KvError::Trace(m)) if m.starts_with("line 1: longer than 1048576")),
            "{r:?}"
        );
        let small = TraceLimits {
            max_line_bytes: 64,
            max_lines: 1000,
            max_requests: 10,
        };
        // Endless valid requests: stops at the request limit.
        let line: &'static [u8] =
            b"{\"timestamp\": 1, \"input_length\": 3, \"output_length\": 4}\n";
        let r =
            ArrivalTrace::from_reader_bounded("t", std::io::BufReader::new(Cycle(line, 0)), small);
        assert!(
            matches!(&r, Err(KvError::Trace(m)) if m.contains("more than 10 requests")),
            "{r:?}"
        );
        // Endless blank lines: stops at the line limit.
        let r =
            ArrivalTrace::from_reader_bounded("t", std::io::BufReader::new(Cycle(b"\n", 0)), small);
        assert!(
            matches!(&r, Err(KvError::Trace(m)) if m.contains("more than 1000 lines")),
            "{r:?}"
        );
        // A line of exactly the limit is read; one byte more is refused.
        let mut ok = "{\"timestamp\": 1, \"input_length\": 3, \"output_length\": 4}".to_string();
        ok.push_str(&" ".repeat(64 - ok.len()));
        assert!(ArrivalTrace::from_reader_bounded("t", ok.as_bytes(), small).is_ok());
        let long = format!("{ok} \n");
        let r = ArrivalTrace::from_reader_bounded("t", long.as_bytes(), small);
        assert!(
            matches!(&r, Err(KvError::Trace(m)) if m.contains("longer than 64")),
            "{r:?}"
        );
        // Not UTF-8: a typed error with the line number.
        let r = ArrivalTrace::from_reader("t", &b"\xff\xfe\n"[..]);
        assert!(
            matches!(&r, Err(KvError::Trace(m)) if m.starts_with("line 1")),
            "{r:?}"
        );
    }

    #[cfg(unix)]
    #[test]
    fn dev_zero_is_a_typed_error_naming_the_file() {
        let p = Path::new("/dev/zero");
        let r = ArrivalTrace::from_path(p);
        assert!(
            matches!(&r, Err(KvError::Trace(m)) if m.starts_with("/dev/zero: line 1: longer than")),
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

    const VALID: &str = "{\"timestamp\": 5, \"input_length\": 3, \"output_length\": 4}\n\
        {\"arrival_ms\": 1, \"input_length\": 9, \"output_length\": 0, \"hash_ids\": [1, 2]}\n\n\
        {\"timestamp\": 2, \"input_length\": 0, \"output_length\": 7}\n";

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(10_000))]

        /// Any bytes as an arrival trace (`kv simulate --trace`): a trace of sorted requests with
        /// history, each within the request limit, or a `KvError::Trace`; never a panic.
        #[test]
        fn any_bytes_are_a_sorted_trace_or_a_trace_error(
            bytes in tierkit_testkit::hostile_bytes(VALID)
        ) {
            match ArrivalTrace::from_reader("t", &bytes[..]) {
                Ok(t) => {
                    proptest::prop_assert!(!t.requests.is_empty());
                    proptest::prop_assert!(t.requests.windows(2).all(|w| w[0].arrival_ms <= w[1].arrival_ms));
                    proptest::prop_assert!(t.requests.iter().all(|r| r.input_length > 0
                        && r.input_length as u64 + r.output_length as u64 <= MAX_REQUEST_TOKENS as u64));
                }
                Err(e) => proptest::prop_assert!(matches!(e, KvError::Trace(_)), "{}", e),
            }
        }
    }
}
