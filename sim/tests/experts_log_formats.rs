//! Every routing-log format issue 25 names, written here in its engine's shape (from the
//! engines' public code; no engine output is copied), read through the auto-detecting
//! [`read_trace_report`]: raw per-row logs under every id and position field name with rows
//! lost, vLLM and SGLang per-request captures (nested lists, base64 `.npy`, base64 raw int32),
//! llama.cpp's routing CSV, and count dumps keyed by layer strings.

use base64::Engine as _;
use std::path::PathBuf;
use tierkit_sim::experts::trace::{
    counts, detect_format, rawlog, read_trace, read_trace_report, read_traces_report, ReadOptions,
    StepPicks, TraceError, TraceFormat,
};

fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir()
        .join(format!("tierkit-log-formats-{}", std::process::id()))
        .join(name);
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn write(d: &std::path::Path, name: &str, text: &[u8]) -> PathBuf {
    let p = d.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

/// The picks of token `t` in layer `l` (top-2 of 8, distinct).
fn pick(t: u32, l: u32) -> [u32; 2] {
    let a = (t * 3 + l * 5) % 8;
    [a, (a + 1 + t % 3) % 8]
}

#[test]
fn raw_logs_under_every_field_name_with_lost_rows() {
    let d = dir("raw");
    for id in [
        "topk_ids",
        "experts",
        "selected_experts",
        "expert_ids",
        "routed_experts",
    ] {
        for pos in ["token_idx", "token_pos", "pos"] {
            // Prefill of 6 tokens over 4 layers, layer-major; layer 2 lost position 4. Then 3
            // decode steps at position 0; step 1 lost layer 3, step 2 lost layer 0.
            let mut s = String::new();
            let row = |p: u32, l: u32, ids: [u32; 2]| {
                format!(
                    "{{\"{pos}\": {p}, \"layer\": {l}, \"{id}\": [{}, {}], \"gating_probs\": [0.6, 0.4]}}\n",
                    ids[0], ids[1]
                )
            };
            for l in 0..4 {
                for p in 0..6 {
                    if (l, p) != (2, 4) {
                        s += &row(p, l, pick(p, l));
                    }
                }
            }
            for step in 0..3u32 {
                for l in 0..4 {
                    if (step, l) != (1, 3) && (step, l) != (2, 0) {
                        s += &row(0, l, pick(10 + step, l));
                    }
                }
            }
            let f = write(&d, &format!("{id}-{pos}.jsonl"), s.as_bytes());
            assert_eq!(
                detect_format(&f).unwrap(),
                TraceFormat::RoutesJsonl,
                "{id} {pos}"
            );
            let (t, r) = read_trace_report(&f, &ReadOptions::default()).unwrap();
            assert_eq!(t.steps.len(), 4, "{id} {pos}");
            assert_eq!(t.steps[0].layers[2].len(), 5 * 2);
            assert!(t.steps[2].layers[3].is_empty());
            assert!(t.steps[3].layers[0].is_empty());
            assert_eq!(t.steps[3].layers[1], pick(12, 1).to_vec());
            assert_eq!(r.rows.missing_rows, 3, "{id} {pos}");
            assert_eq!(r.rows.rows, 23 + 10);
            assert!(
                r.lines()
                    .iter()
                    .any(|l| l.starts_with("3 (token, layer) rows missing")),
                "{:?}",
                r.lines()
            );
        }
    }
}

/// The Mixtral decode logs of `../shared`, or `None` (with a SKIP line).
fn mixtral_dir() -> Option<PathBuf> {
    let d = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/data/moe/mixtral-decode");
    if d.is_dir() {
        Some(d)
    } else {
        println!("SKIP Mixtral raw-log test: ../shared/data/moe/mixtral-decode is absent");
        None
    }
}

#[test]
fn mixtral_logs_still_read_and_report_their_missing_rows() {
    let Some(d) = mixtral_dir() else { return };
    let (t, r) = read_traces_report(std::slice::from_ref(&d), &ReadOptions::default()).unwrap();
    assert_eq!(t.steps.len(), 168 + 79 + 83 + 255);
    assert_eq!(r.format, TraceFormat::MixtralJsonl);
    assert!(r.rows.missing_rows > 0, "the public files lack a few rows");
    assert!(r.rows.rows > 0);
}

#[test]
fn a_raw_log_made_from_the_mixtral_logs_reads_with_its_lost_rows_counted() {
    let Some(d) = mixtral_dir() else { return };
    let src = read_trace(&d.join("gsm8k_2_routing.jsonl"), &ReadOptions::default()).unwrap();
    let cfg = rawlog::RawLogConfig::default(); // 135-token prompt, 3% of rows dropped
    let out = dir("mixtral-raw");
    let f = out.join("mixtral_raw.jsonl");
    let log = rawlog::write_raw_log(
        &src,
        &cfg,
        std::io::BufWriter::new(std::fs::File::create(&f).unwrap()),
    )
    .unwrap();
    let share = log.rows_dropped as f64 / (log.rows_dropped + log.rows_written) as f64;
    assert!((0.02..0.04).contains(&share), "dropped share {share}");
    assert_eq!(detect_format(&f).unwrap(), TraceFormat::RoutesJsonl);
    let opts = ReadOptions {
        experts_per_layer: Some(8),
        ..ReadOptions::default()
    };
    let (t, r) = read_trace_report(&f, &opts).unwrap();
    assert_eq!(
        t.steps.len(),
        src.steps.len() + 1,
        "prefill + every decode step"
    );
    assert_eq!(t.steps, log.expected.steps);
    // The rows dropped, and the few the public files lack already.
    assert!(log.rows_absent < 100, "{}", log.rows_absent);
    assert_eq!(r.rows.missing_rows, log.rows_dropped + log.rows_absent);
    assert_eq!(t.shape.layers, 32);
    assert_eq!(t.steps[0].layers[0].len() % 2, 0);
}

/// An `np.save` file of int32 `ids` of `shape`, as vLLM base64-encodes it.
fn npy(shape: [usize; 3], ids: &[i32]) -> Vec<u8> {
    let mut header = format!(
        "{{'descr': '<i4', 'fortran_order': False, 'shape': ({}, {}, {}), }}",
        shape[0], shape[1], shape[2]
    );
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut b = b"\x93NUMPY\x01\x00".to_vec();
    b.extend_from_slice(&(header.len() as u16).to_le_bytes());
    b.extend_from_slice(header.as_bytes());
    for v in ids {
        b.extend_from_slice(&v.to_le_bytes());
    }
    b
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// Ids `[tokens, layers, 2]` of `tokens` tokens from `first`, row-major; layer 0 is dense
/// (zero-filled, as both engines capture it).
fn capture_ids(first: u32, tokens: u32, layers: u32) -> Vec<i32> {
    let mut v = Vec::new();
    for t in first..first + tokens {
        for l in 0..layers {
            let ids = if l == 0 { [0, 0] } else { pick(t, l) };
            v.extend(ids.iter().map(|&x| x as i32));
        }
    }
    v
}

fn nested(ids: &[i32], layers: usize) -> String {
    let tokens: Vec<String> = ids
        .chunks(layers * 2)
        .map(|tok| {
            let rows: Vec<String> = tok
                .chunks(2)
                .map(|r| format!("[{}, {}]", r[0], r[1]))
                .collect();
            format!("[{}]", rows.join(", "))
        })
        .collect();
    format!("[{}]", tokens.join(", "))
}

/// What a capture of a 4-token prompt and 3 more tokens over 3 layers reads to.
fn check_capture(steps: &[StepPicks]) {
    assert_eq!(steps.len(), 1 + 3, "prefill + 3 decode steps");
    assert!(
        steps.iter().all(|s| s.layers[0].is_empty()),
        "dense layer 0"
    );
    let prefill: Vec<u32> = (0..4).flat_map(|t| pick(t, 2)).collect();
    assert_eq!(steps[0].layers[2], prefill);
    assert_eq!(steps[3].layers[1], pick(6, 1).to_vec());
}

#[test]
fn vllm_captures_nested_split_and_npy() {
    let d = dir("vllm");
    let all = capture_ids(0, 7, 3);
    // OpenAI-compatible response, prompt at the response level, completion per choice (lists).
    let split = format!(
        "{{\"id\": \"cmpl-1\", \"prompt_routed_experts\": {}, \"choices\": [{{\"index\": 0, \"text\": \"x\", \"routed_experts\": {}}}], \"usage\": {{\"prompt_tokens\": 4, \"completion_tokens\": 4}}}}",
        nested(&all[..4 * 6], 3),
        nested(&all[4 * 6..], 3)
    );
    let f = write(&d, "split.json", split.as_bytes());
    assert_eq!(detect_format(&f).unwrap(), TraceFormat::CaptureJson);
    let (t, r) = read_trace_report(&f, &ReadOptions::default()).unwrap();
    check_capture(&t.steps);
    assert_eq!(r.padding_rows, 7, "one dense row per token");
    // One routed_experts over prompt and completion, base64 .npy, prompt length from usage.
    let one = format!(
        "{{\"choices\": [{{\"routed_experts\": \"{}\"}}], \"usage\": {{\"prompt_tokens\": 4}}}}",
        b64(&npy([7, 3, 2], &all))
    );
    let f = write(&d, "npy.json", one.as_bytes());
    let (t, _) = read_trace_report(&f, &ReadOptions::default()).unwrap();
    check_capture(&t.steps);
    // Offline `CompletionOutput.routed_experts.tolist()` per line (JSONL), prompt from
    // `prompt_token_ids`; two requests follow each other.
    let line = format!(
        "{{\"prompt_token_ids\": [1, 2, 3, 4], \"outputs\": [{{\"routed_experts\": {}}}]}}\n",
        nested(&all, 3)
    );
    let f = write(&d, "offline.jsonl", format!("{line}{line}").as_bytes());
    assert_eq!(detect_format(&f).unwrap(), TraceFormat::CaptureJson);
    let (t, r) = read_trace_report(&f, &ReadOptions::default()).unwrap();
    assert_eq!(t.steps.len(), 8);
    check_capture(&t.steps[4..]);
    assert_eq!(r.rows.rows, 2 * 7 * 3);
    // A bare nested list: no prompt length, every token a step (and a note says so).
    let f = write(&d, "bare.json", nested(&all, 3).as_bytes());
    let (t, r) = read_trace_report(&f, &ReadOptions::default()).unwrap();
    assert_eq!(t.steps.len(), 7);
    assert!(
        r.notes.iter().any(|n| n.contains("every token")),
        "{:?}",
        r.notes
    );
}

#[test]
fn sglang_captures_base64_raw_int32() {
    let d = dir("sglang");
    let all = capture_ids(0, 7, 3);
    let raw: Vec<u8> = all.iter().flat_map(|v| v.to_le_bytes()).collect();
    // /generate: seqlen - 1 = 4 + 4 - 1 = 7 rows.
    let generate = format!(
        "[{{\"text\": \"x\", \"meta_info\": {{\"id\": \"a\", \"prompt_tokens\": 4, \"completion_tokens\": 4, \"routed_experts\": \"{}\"}}}}]",
        b64(&raw)
    );
    let f = write(&d, "generate.json", generate.as_bytes());
    let e = read_trace(&f, &ReadOptions::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("--layers") && e.contains("--top-k"), "{e}");
    let opts = ReadOptions {
        layers: Some(3),
        top_k: Some(2),
        ..ReadOptions::default()
    };
    let (t, _) = read_trace_report(&f, &opts).unwrap();
    check_capture(&t.steps);
    // OpenAI endpoint: `choices[].sgl_ext.routed_experts`, prompt length from `usage`.
    let chat = format!(
        "{{\"object\": \"chat.completion\", \"choices\": [{{\"index\": 0, \"sgl_ext\": {{\"routed_experts\": \"{}\"}}}}], \"usage\": {{\"prompt_tokens\": 4}}}}",
        b64(&raw)
    );
    let f = write(&d, "chat.json", chat.as_bytes());
    let (t, _) = read_trace_report(&f, &opts).unwrap();
    check_capture(&t.steps);
    // A wrong --layers says so.
    let bad = ReadOptions {
        layers: Some(4),
        ..opts
    };
    assert!(read_trace(&f, &bad).is_err());
}

#[test]
fn llama_cpp_routing_csv() {
    let d = dir("llama");
    // Upstream #28544: `layer,expert`, one row per pick; a 3-token prompt then 2 decode tokens.
    let mut s = String::from("layer,expert\n");
    for l in 0..3 {
        for t in 0..3 {
            for e in pick(t, l) {
                s += &format!("{l},{e}\n");
            }
        }
    }
    for t in 3..5 {
        for l in 0..3 {
            for e in pick(t, l) {
                s += &format!("{l},{e}\n");
            }
        }
    }
    let f = write(&d, "moe_trace.csv", s.as_bytes());
    assert_eq!(detect_format(&f).unwrap(), TraceFormat::RoutingCsv);
    let (t, r) = read_trace_report(&f, &ReadOptions::default()).unwrap();
    assert_eq!(t.steps.len(), 3);
    assert_eq!(t.shape.top_k, 2);
    let prefill: Vec<u32> = (0..3).flat_map(|t| pick(t, 1)).collect();
    assert_eq!(t.steps[0].layers[1], prefill);
    assert_eq!(t.steps[2].layers[2], pick(4, 2).to_vec());
    assert_eq!(r.rows.missing_rows, 0);
    // The fork's `phase,token,layer,rank,expert`, extension-less: detected by its header.
    let mut s = String::from("phase,token,layer,rank,expert\n");
    for l in 0..3u32 {
        for t in 0..3u32 {
            if (l, t) == (1, 2) {
                continue; // a lost row
            }
            for (rank, e) in pick(t, l).iter().enumerate() {
                s += &format!("prefill,{t},{l},{rank},{e}\n");
            }
        }
    }
    for l in 0..3u32 {
        for (rank, e) in pick(3, l).iter().enumerate() {
            s += &format!("decode,3,{l},{rank},{e}\n");
        }
    }
    let f = write(&d, "fork_trace", s.as_bytes());
    assert_eq!(detect_format(&f).unwrap(), TraceFormat::RoutingCsv);
    let (t, r) = read_trace_report(&f, &ReadOptions::default()).unwrap();
    assert_eq!(t.steps.len(), 2);
    assert_eq!(t.steps[0].layers[1].len(), 2 * 2);
    assert_eq!(r.rows.missing_rows, 1);
}

#[test]
fn count_dumps_keyed_by_layer_strings() {
    let d = dir("counts");
    // The published shape: layers "1", "3", ..., "11" (not contiguous), experts keyed by id.
    let mut layers = Vec::new();
    for (i, l) in (1..=11).step_by(2).enumerate() {
        layers.push(format!(
            "\"{l}\": {{\"0\": {}, \"1\": 12, \"5\": 3}}",
            700 + i
        ));
    }
    let text = format!("{{\"expert_usage_by_layer\": {{{}}}}}", layers.join(", "));
    let f = write(&d, "usage.json", text.as_bytes());
    let (dump, report) = counts::read_counts_report(&f, &Default::default()).unwrap();
    assert_eq!((dump.layers, dump.experts_per_layer), (6, 6));
    assert_eq!(dump.counts[0], 700.0);
    assert_eq!(dump.counts[5 * 6], 705.0);
    assert_eq!(dump.counts[5], 3.0);
    assert_eq!(report.source, "expert_usage_by_layer");
    assert_eq!(report.layer_keys, vec!["1", "3", "5", "7", "9", "11"]);
    assert!(report
        .renumbering()
        .unwrap()
        .starts_with("0 ← \"1\", 1 ← \"3\""));
    // An object of arrays at the top level.
    let f = write(&d, "arrays.json", b"{\"0\": [5, 1, 0], \"1\": [0, 2, 9]}");
    let (dump, report) = counts::read_counts_report(&f, &Default::default()).unwrap();
    assert_eq!(dump.counts, vec![5.0, 1.0, 0.0, 0.0, 2.0, 9.0]);
    assert_eq!(report.renumbering(), None);
    // Nothing like counts: the error names the keys found.
    let f = write(
        &d,
        "other.json",
        b"{\"model\": \"m\", \"stats\": {\"a\": \"b\"}}",
    );
    let e = counts::read_counts(&f, &Default::default()).unwrap_err();
    assert!(
        matches!(e, TraceError::UnknownFormat { .. })
            && e.to_string().contains("\"model\", \"stats\""),
        "{e}"
    );
    // `replay --trace` on a count dump names its keys and where counts are read.
    let f = d.join("usage.json");
    let e = read_trace(&f, &ReadOptions::default())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("expert_usage_by_layer") && e.contains("fit-seed --eplb-counts"),
        "{e}"
    );
}
