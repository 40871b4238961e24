//! `tierkit experts synth`: a synthetic routing trace written to a file.

use super::inspect::{print_summary, summarize_trace};
use super::source::{generate, ScenarioArgs};
use super::CliResult;
use crate::input;
use clap::{Args, ValueEnum};
use std::path::PathBuf;
use tierkit_sim::experts::trace::{self, binary, logger};

#[derive(Debug, Clone, Copy, ValueEnum)]
enum OutFormat {
    /// From the extension: .json → json, .jsonl → logger-jsonl, anything else → binary.
    Auto,
    Binary,
    Json,
    LoggerJsonl,
}

/// `tierkit experts synth` arguments.
#[derive(Debug, Args)]
pub struct SynthArgs {
    #[command(flatten)]
    scenario: ScenarioArgs,
    /// Output file.
    #[arg(long)]
    out: PathBuf,
    /// Output format.
    #[arg(long, value_enum, default_value_t = OutFormat::Auto)]
    format: OutFormat,
    /// Print the summary as JSON.
    #[arg(long)]
    json: bool,
}

pub(super) fn synth_cmd(a: SynthArgs) -> CliResult {
    let cfg = a.scenario.config()?;
    cfg.validate_in_memory()?;
    // Create the output before generating: a bad path fails at once, not after the whole run.
    let p = a.out.display().to_string();
    let mut w = std::io::BufWriter::new(
        std::fs::File::create(&a.out).map_err(|e| input::named("--out", &a.out, e))?,
    );
    let t = generate(&cfg, a.json)?;
    let fmt = match a.format {
        OutFormat::Auto => match a.out.extension().and_then(|x| x.to_str()) {
            Some("json") => OutFormat::Json,
            Some("jsonl") => OutFormat::LoggerJsonl,
            _ => OutFormat::Binary,
        },
        f => f,
    };
    let named = |e: trace::TraceError| -> Box<dyn std::error::Error> {
        match e {
            trace::TraceError::Io { source, .. } => format!("--out {p}: {source}").into(),
            other => other.into(),
        }
    };
    match fmt {
        OutFormat::Binary => {
            binary::write_binary(&t, &mut w).map_err(named)?;
        }
        OutFormat::Json => {
            serde_json::to_writer(&mut w, &t).map_err(|e| format!("--out {p}: {e}"))?;
            std::io::Write::flush(&mut w).map_err(|e| format!("--out {p}: {e}"))?;
        }
        OutFormat::LoggerJsonl => {
            logger::write_logger(&t, &mut w).map_err(named)?;
        }
        OutFormat::Auto => unreachable!("resolved above"),
    }
    let s = summarize_trace(&t)?;
    if a.json {
        outln!("{}", serde_json::to_string_pretty(&s)?)?;
    } else {
        print_summary(&s)?;
        outln!("written to {p} ({fmt:?})")?;
    }
    Ok(())
}
