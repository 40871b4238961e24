//! Real engine output, written here in the engines' own shapes: vLLM's MoE routing logger (meta
//! line, `"type": "route"` records, one file per layer, dummy profiling and warm-up passes, a
//! batched prefill, decode passes), the raw `token_pos` layout (prefill layer-major, decode at
//! position 0), and hostile inputs (`/dev/zero`, one 100 MB line) that must fail quickly.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tierkit_sim::experts::trace::{
    detect_format, logger, mixtral, read_trace, read_traces, vllm, ReadOptions, TraceError,
    TraceFormat,
};

fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir()
        .join(format!("tierkit-engine-logs-{}", std::process::id()))
        .join(name);
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

const EXPERTS: u32 = 16;
const PREFILL_ROWS: u64 = 12;
const DECODE_PASSES: u64 = 4;
const DECODE_BATCH: u64 = 3;

/// The experts layer `layer` picks for row `row` of real pass `pass` (varied, top-2, distinct).
fn picks(layer: u32, pass: u64, row: u64) -> [u32; 2] {
    let a = ((layer as u64 * 5 + pass * 3 + row * 7) % EXPERTS as u64) as u32;
    [a, (a + 1 + (row % 3) as u32) % EXPERTS]
}

fn route(layer: u32, row: u64, ids: [u32; 2], extra: &str) -> String {
    format!(
        "{{\"type\":\"route\",\"req_id\":\"r{}\",\"token_idx\":{row},\"layer\":{layer},\"topk_ids\":[{},{}],\"topk_weights\":[0.6,0.4]{extra}}}\n",
        row % 3,
        ids[0],
        ids[1]
    )
}

/// One vLLM routing-logger file for `layer`: meta line, 8,192-row dummy profiling pass, 256-row
/// warm-up, a 12-row batched prefill (pass 0), a non-route record, 4 decode passes of 3 rows.
fn vllm_layer_log(layer: u32) -> String {
    let mut s = format!(
        "{{\"type\":\"meta\",\"model\":\"tiny-moe\",\"layer\":{layer},\"num_experts\":{EXPERTS},\"top_k\":2}}\n"
    );
    for row in 0..8192 {
        s += &route(layer, row, [0, 1], "");
    }
    for row in 0..256 {
        s += &route(layer, row, [3, 2], "");
    }
    for row in 0..PREFILL_ROWS {
        s += &route(layer, row, picks(layer, 0, row), "");
    }
    s += "{\"type\":\"stats\",\"forward_time_ms\":12.5}\n";
    for pass in 1..=DECODE_PASSES {
        for row in 0..DECODE_BATCH {
            s += &route(layer, row, picks(layer, pass, row), "");
        }
    }
    s
}

fn write(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap();
}

#[test]
fn vllm_logger_file_drops_dummy_and_warmup_passes() {
    let d = dir("one");
    let f = d.join("moe_layer2.jsonl");
    write(&f, &vllm_layer_log(2));
    assert_eq!(detect_format(&f).unwrap(), TraceFormat::RoutesJsonl);
    let t = read_trace(&f, &ReadOptions::default()).unwrap();
    assert_eq!(t.name, "tiny-moe");
    assert_eq!(t.shape.layers, 3, "layers = logged layer + 1");
    assert_eq!(t.shape.experts_per_layer, EXPERTS);
    assert_eq!(t.shape.top_k, 2);
    assert_eq!(t.steps.len() as u64, 1 + DECODE_PASSES);
    assert!(t.shifts.is_empty());
    let prefill: Vec<u32> = (0..PREFILL_ROWS).flat_map(|r| picks(2, 0, r)).collect();
    assert_eq!(t.steps[0].layers, vec![vec![], vec![], prefill]);
    let decode: Vec<u32> = (0..DECODE_BATCH).flat_map(|r| picks(2, 4, r)).collect();
    assert_eq!(t.steps[4].layers[2], decode);

    let keep = ReadOptions {
        keep_dummy_passes: true,
        ..ReadOptions::default()
    };
    let all = read_trace(&f, &keep).unwrap();
    assert_eq!(all.steps.len() as u64, 3 + DECODE_PASSES);
    assert_eq!(all.steps[0].layers[2].len(), 8192 * 2);
    assert_eq!(all.steps[1].layers[2].len(), 256 * 2);

    // The meta line removed: still detected and read the same way.
    let bare = d.join("bare.jsonl");
    let text = vllm_layer_log(2);
    write(&bare, text.split_once('\n').unwrap().1);
    assert_eq!(detect_format(&bare).unwrap(), TraceFormat::RoutesJsonl);
    let b = read_trace(&bare, &ReadOptions::default()).unwrap();
    assert_eq!(b.steps, t.steps);
}

#[test]
fn a_directory_of_per_layer_logs_is_one_trace() {
    let d = dir("layers");
    for l in [0, 1, 3] {
        write(&d.join(format!("moe_layer{l}.jsonl")), &vllm_layer_log(l));
    }
    let t = read_traces(std::slice::from_ref(&d), &ReadOptions::default()).unwrap();
    assert_eq!(t.shape.layers, 4, "max L + 1");
    assert!(t.shifts.is_empty(), "no spurious shift: {:?}", t.shifts);
    assert_eq!(t.steps.len() as u64, 1 + DECODE_PASSES);
    for (s, step) in t.steps.iter().enumerate() {
        assert!(step.layers[2].is_empty(), "layer 2 was not logged");
        for l in [0u32, 1, 3] {
            let rows = if s == 0 { PREFILL_ROWS } else { DECODE_BATCH };
            let want: Vec<u32> = (0..rows).flat_map(|r| picks(l, s as u64, r)).collect();
            assert_eq!(step.layers[l as usize], want, "step {s} layer {l}");
        }
    }
    // The files given one by one merge the same way; --skip-steps applies once.
    let files: Vec<PathBuf> = [0, 1, 3]
        .iter()
        .map(|l| d.join(format!("moe_layer{l}.jsonl")))
        .collect();
    let skip = ReadOptions {
        skip_steps: 1,
        ..ReadOptions::default()
    };
    let s = read_traces(&files, &skip).unwrap();
    assert_eq!(s.steps[..], t.steps[1..]);

    // A layer file cut short names both files.
    let mut cut = vllm_layer_log(1);
    cut.truncate(cut.rfind("{\"type\":\"route\",\"req_id\":\"r0\"").unwrap());
    write(&d.join("moe_layer1.jsonl"), &cut);
    let e = read_traces(std::slice::from_ref(&d), &ReadOptions::default()).unwrap_err();
    let m = e.to_string();
    assert!(
        matches!(e, TraceError::ShapeMismatch(_)) && m.contains("moe_layer1.jsonl"),
        "{m}"
    );
}

#[test]
fn pass_kinds_decide_over_the_identical_rows_rule() {
    let mut s = String::new();
    // 20 identical rows named `decode`: real, kept.
    for row in 0..20 {
        s += &route(0, row, [4, 5], ",\"pass\":\"decode\"");
    }
    // A small pass named `warmup` and one named `draft`: dropped.
    s += &route(0, 0, [1, 2], ",\"pass\":\"warmup\"");
    s += &route(0, 0, [1, 3], ",\"pass\":\"Draft\"");
    s += &route(0, 0, [6, 7], ",\"pass\":\"prefill\"");
    s += &route(0, 1, [6, 8], ",\"pass\":\"prefill\"");
    let f = dir("kinds").join("k.jsonl");
    write(&f, &s);
    let t = read_trace(&f, &ReadOptions::default()).unwrap();
    assert_eq!(t.steps.len(), 2);
    assert_eq!(t.steps[0].layers[0].len(), 40);
    assert_eq!(t.steps[1].layers[0], vec![6, 7, 6, 8]);
    let keep = ReadOptions {
        keep_dummy_passes: true,
        ..ReadOptions::default()
    };
    assert_eq!(read_trace(&f, &keep).unwrap().steps.len(), 4);
    // An unknown kind is an error with file and line.
    write(&f, &route(0, 0, [1, 2], ",\"pass\":\"verify\""));
    let e = read_trace(&f, &ReadOptions::default()).unwrap_err();
    assert!(
        matches!(&e, TraceError::Malformed { line: 1, .. }) && e.to_string().contains("verify"),
        "{e}"
    );
    // Only dummy passes: the error says how to keep them.
    let mut s = String::new();
    for row in 0..64 {
        s += &route(0, row, [0, 1], "");
    }
    write(&f, &s);
    let e = read_trace(&f, &ReadOptions::default()).unwrap_err();
    assert!(
        matches!(e, TraceError::Empty(_)) && e.to_string().contains("--keep-dummy-passes"),
        "{e}"
    );
}

#[test]
fn token_pos_layout_prefill_layer_major_then_decode_at_position_zero() {
    const LAYERS: u32 = 3;
    let mut s = String::new();
    let rec = |pos: u64, layer: u32, ids: [u32; 2]| {
        format!(
            "{{\"token_pos\":{pos},\"layer\":{layer},\"topk_ids\":[{},{}]}}\n",
            ids[0], ids[1]
        )
    };
    for layer in 0..LAYERS {
        for pos in 0..PREFILL_ROWS {
            s += &rec(pos, layer, picks(layer, 0, pos));
        }
    }
    for step in 1..=DECODE_PASSES {
        for layer in 0..LAYERS {
            s += &rec(0, layer, picks(layer, step, 0));
        }
    }
    let f = dir("pos").join("raw_routing.jsonl");
    write(&f, &s);
    assert_eq!(detect_format(&f).unwrap(), TraceFormat::RoutesJsonl);
    let t = read_trace(&f, &ReadOptions::default()).unwrap();
    assert_eq!(t.shape.layers, LAYERS);
    assert_eq!(t.steps.len() as u64, 1 + DECODE_PASSES);
    for layer in 0..LAYERS {
        let want: Vec<u32> = (0..PREFILL_ROWS).flat_map(|p| picks(layer, 0, p)).collect();
        assert_eq!(t.steps[0].layers[layer as usize], want);
        for step in 1..=DECODE_PASSES {
            assert_eq!(
                t.steps[step as usize].layers[layer as usize],
                picks(layer, step, 0).to_vec()
            );
        }
    }
    // A record without its layer is an error with file and line.
    write(&f, "{\"layer\":0,\"topk_ids\":[1,2],\"token_pos\":0}\n{\"type\":\"route\",\"token_pos\":1,\"topk_ids\":[1,2]}\n");
    let e = read_trace(&f, &ReadOptions::default()).unwrap_err();
    assert!(matches!(e, TraceError::Malformed { line: 2, .. }), "{e}");
}

/// An endless reader of one byte: a "file" that never ends, never written to disk.
struct Endless(u8);

impl Read for Endless {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        buf.fill(self.0);
        Ok(buf.len())
    }
}

fn quickly<T>(what: &str, f: impl FnOnce() -> T) -> T {
    let t0 = Instant::now();
    let out = f();
    assert!(
        t0.elapsed() < Duration::from_secs(10),
        "{what} took {:?}",
        t0.elapsed()
    );
    out
}

#[test]
fn dev_zero_fails_quickly_in_every_format() {
    let zero = Path::new("/dev/zero");
    if !zero.exists() {
        println!("SKIP /dev/zero test: no /dev/zero");
        return;
    }
    for format in [
        TraceFormat::Auto,
        TraceFormat::Binary,
        TraceFormat::Json,
        TraceFormat::MixtralJsonl,
        TraceFormat::LoggerJsonl,
        TraceFormat::RoutesJsonl,
        TraceFormat::CaptureJson,
        TraceFormat::RoutingCsv,
    ] {
        let opts = ReadOptions {
            format,
            ..ReadOptions::default()
        };
        let e = quickly(&format!("{format:?}"), || read_trace(zero, &opts)).unwrap_err();
        assert!(
            e.to_string().starts_with("/dev/zero"),
            "{format:?}: the error names the file: {e}"
        );
    }
    let e = quickly("counts", || {
        tierkit_sim::experts::trace::counts::read_counts(zero, &Default::default())
    })
    .unwrap_err();
    assert!(e.to_string().contains("/dev/zero"), "{e}");
    // Refused at its first bytes, not after reading up to the 1 GiB document cap (TooLarge).
    assert!(matches!(e, TraceError::Malformed { line: 1, .. }), "{e}");
}

#[test]
fn a_100_mb_single_line_fails_at_line_one() {
    const HUNDRED_MB: u64 = 100 << 20;
    let opts = ReadOptions::default();
    // A line opening a JSON object that never closes, then 100 MB of spaces.
    let line = || {
        std::io::BufReader::new(
            "{\"type\":\"route\",\"topk_ids\":["
                .as_bytes()
                .chain(Endless(b' ').take(HUNDRED_MB)),
        )
    };
    let e = quickly("routes", || {
        vllm::read_routes_from(line(), "huge.jsonl", &opts, "h".into())
    })
    .unwrap_err();
    assert!(matches!(e, TraceError::Malformed { line: 1, .. }), "{e}");
    assert!(e.to_string().contains("line longer than"), "{e}");
    let e = quickly("logger", || {
        logger::read_logger_from(line(), "huge.jsonl", &opts, "h".into())
    })
    .unwrap_err();
    assert!(matches!(e, TraceError::Malformed { line: 1, .. }), "{e}");
    let e = quickly("mixtral", || {
        mixtral::read_mixtral_from(line(), "huge.jsonl", &opts, "h".into())
    })
    .unwrap_err();
    assert!(matches!(e, TraceError::Malformed { line: 1, .. }), "{e}");
    let e = quickly("csv", || {
        tierkit_sim::experts::trace::llamacpp::read_csv_from(line(), "huge.csv", &opts, "h".into())
    })
    .unwrap_err();
    assert!(
        matches!(e, TraceError::Malformed { .. }) && e.to_string().contains("line longer than"),
        "{e}"
    );
    // Endless newlines: bounded too.
    let e = quickly("blank lines", || {
        vllm::read_routes_from(
            std::io::BufReader::new(Endless(b'\n')),
            "nl.jsonl",
            &opts,
            "n".into(),
        )
    })
    .unwrap_err();
    assert!(matches!(e, TraceError::Malformed { .. }), "{e}");
}
