//! Every trace and counts reader on arbitrary bytes, and on valid files with random bytes
//! changed: a typed result (a trace or a `TraceError`), never a panic or an abort. Three
//! properties × 10,000 cases = 30,000 cases, each run through all nine readers.

use proptest::prelude::*;
use tierkit_sim::experts::trace::{
    binary, capture, counts, llamacpp, logger, mixtral, vllm, ReadOptions, Trace,
};

const CASES: u32 = 10_000;

/// Runs every reader on `bytes`; each must return (a trace or an error) without panicking.
fn all_readers(bytes: &[u8]) {
    let opts = ReadOptions::default();
    let n = || "f".to_string();
    let _ = binary::read_binary_bytes(bytes, "f");
    let _ = serde_json::from_slice::<Trace>(bytes).map(|t| t.validate());
    let _ = mixtral::read_mixtral_from(bytes, "f", &opts, n());
    let _ = logger::read_logger_from(bytes, "f", &opts, n());
    let _ = vllm::read_routes_from(bytes, "f", &opts, n());
    let _ = capture::read_capture_from(bytes, "f", &opts, n());
    let _ = llamacpp::read_csv_from(bytes, "f", &opts, n());
    let _ = counts::read_counts_bytes(bytes, "f", n(), &counts::CountsOptions::default());
    // Raw captures need a shape: try one too.
    let shaped = ReadOptions {
        layers: Some(3),
        top_k: Some(2),
        ..ReadOptions::default()
    };
    let _ = capture::read_capture_from(bytes, "f", &shaped, n());
}

/// One valid sample of each text format.
fn samples() -> Vec<Vec<u8>> {
    let npy_b64 = "k05VTVBZAQB2AHsnZGVzY3InOiAnPGk0JywgJ2ZvcnRyYW5fb3JkZXInOiBGYWxzZSwgJ3NoYXBlJzogKDEsIDEsIDIpLCB9ICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgIAoBAAAAAgAAAA==";
    vec![
        b"{\"token_pos\": 0, \"layer\": 0, \"experts\": [1, 2]}\n{\"token_pos\": 1, \"layer\": 0, \"experts\": [3, 2]}\n{\"token_pos\": 0, \"layer\": 1, \"experts\": [0, 5]}\n".to_vec(),
        b"{\"type\":\"meta\",\"num_experts\":8,\"top_k\":2}\n{\"type\":\"route\",\"token_idx\":0,\"layer\":1,\"topk_ids\":[7,1]}\n".to_vec(),
        b"{\"dataset\": \"d\", \"problem_id\": 0, \"layer\": 0, \"experts\": [7, 0], \"token_idx\": 0}\n".to_vec(),
        b"{\"tierkit_trace\": 1, \"layers\": 2}\n{\"step\": 0, \"layer\": 1, \"topk_ids\": [1, 2]}\n{\"forward_pass_end\": true}\n".to_vec(),
        b"{\"usage\": {\"prompt_tokens\": 1}, \"choices\": [{\"routed_experts\": [[[1, 2], [3, 4]], [[0, 0], [2, 7]]]}]}".to_vec(),
        b"{\"meta_info\": {\"prompt_tokens\": 1, \"routed_experts\": \"AQAAAAIAAAADAAAABAAAAAUAAAAGAAAA\"}}".to_vec(),
        format!("{{\"choices\": [{{\"routed_experts\": \"{npy_b64}\"}}]}}").into_bytes(),
        b"phase,token,layer,rank,expert\nprefill,0,0,0,1\nprefill,0,0,1,2\ndecode,1,0,0,3\n".to_vec(),
        b"layer,expert\n0,1\n0,2\n1,3\n".to_vec(),
        b"{\"expert_usage_by_layer\": {\"1\": {\"0\": 747, \"1\": 12}, \"3\": {\"2\": 5}}}".to_vec(),
        b"{\"expert_load_window\": [[[1, 2, 3], [0, 1, 0]]], \"physical_to_logical_map\": [[0, 1, 0], [1, 0, 1]]}".to_vec(),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(CASES))]

    #[test]
    fn arbitrary_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..128)) {
        all_readers(&bytes);
    }

    #[test]
    fn arbitrary_text(text in "[\\[\\]{}\",:0-9a-z_ .\\-\\n]{0,96}") {
        all_readers(text.as_bytes());
    }

    #[test]
    fn mutated_samples(
        which in 0usize..11,
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>(), 0u8..3), 1..6),
    ) {
        let mut b = samples()[which].clone();
        for (at, byte, op) in edits {
            let len = b.len();
            let i = at.index(len.max(1));
            match op {
                0 if len > 0 => b[i.min(len - 1)] = byte,
                1 => b.insert(i.min(len), byte),
                _ if len > 0 => {
                    b.remove(i.min(len - 1));
                }
                _ => {}
            }
        }
        all_readers(&b);
    }
}

#[test]
fn the_samples_read() {
    // The mutation base is valid: each sample reads in its own format.
    let opts = ReadOptions::default();
    let s = samples();
    assert!(vllm::read_routes_from(&s[0][..], "f", &opts, "n".into()).is_ok());
    assert!(vllm::read_routes_from(&s[1][..], "f", &opts, "n".into()).is_ok());
    assert!(mixtral::read_mixtral_from(&s[2][..], "f", &opts, "n".into()).is_ok());
    assert!(logger::read_logger_from(&s[3][..], "f", &opts, "n".into()).is_ok());
    assert!(capture::read_capture_from(&s[4][..], "f", &opts, "n".into()).is_ok());
    let shaped = ReadOptions {
        layers: Some(3),
        top_k: Some(2),
        ..ReadOptions::default()
    };
    assert!(capture::read_capture_from(&s[5][..], "f", &shaped, "n".into()).is_ok());
    let (t, _) = capture::read_capture_from(&s[6][..], "f", &opts, "n".into()).unwrap();
    assert_eq!(t.steps[0].layers[0], vec![1, 2]);
    assert!(llamacpp::read_csv_from(&s[7][..], "f", &opts, "n".into()).is_ok());
    assert!(llamacpp::read_csv_from(&s[8][..], "f", &opts, "n".into()).is_ok());
    let c = counts::CountsOptions::default();
    assert!(counts::read_counts_bytes(&s[9], "f", "n".into(), &c).is_ok());
    assert!(counts::read_counts_bytes(&s[10], "f", "n".into(), &c).is_ok());
}
