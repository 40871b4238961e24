//! Runs the `tierkit` binary on tiny scenarios and checks its JSON, determinism, files and errors:
//! `replay` (the scoreboard's flags and outputs), `traces` (synth, inspect, fit-seed, real and
//! engine logs), `errors` (bad and hostile input). One test binary, split by subject.

#[path = "../common/mod.rs"]
mod common;

mod errors;
mod replay;
mod traces;

use std::path::PathBuf;

use common::ok_stdout;

pub(crate) fn temp(name: &str) -> PathBuf {
    common::temp("cli-tests", name)
}

pub(crate) const TINY: &[&str] = &["--steps", "240", "--tokens", "4", "--seed", "5"];

pub(crate) fn replay_json(extra: &[&str]) -> serde_json::Value {
    let mut args = vec!["experts", "replay", "--json"];
    args.extend_from_slice(TINY);
    args.extend_from_slice(extra);
    serde_json::from_str(&ok_stdout(&args)).unwrap()
}
