//! `tierkit`: the command line of the tierkit workspace, a thin binary over the crates (no policy
//! code here): replay routing traces through residency policies, fit seed maps, synthesize
//! calibrated traces, inspect traces; tables on stdout, `--json` reports, PNG plots.
//!
//! ```text
//! tierkit experts replay                  # built-in OLMoE github → book scenario, all policies
//! tierkit experts replay --trace ../shared/data/moe/mixtral-decode --hot 4
//! tierkit experts synth --out trace.tkt
//! tierkit experts fit-seed --trace trace.tkt --hot 16 --out seed.json
//! tierkit experts inspect --trace trace.tkt
//! tierkit kv simulate                    # elastic KV pool vs fixed placements
//! ```

use clap::{Parser, Subcommand};

#[macro_use]
mod output;
mod experts;
mod input;
mod kv;
mod plot;
mod progress;

/// tierkit: memory tiering for LLM inference (MoE expert residency, elastic sparse-attention KV).
#[derive(Debug, Parser)]
#[command(name = "tierkit", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// MoE expert residency: replay traces through policies, fit seed maps, synthesize traces.
    Experts {
        #[command(subcommand)]
        command: experts::ExpertsCommand,
    },
    /// Elastic sparse-attention KV pool: simulate placements on arrival traces, calibrate the
    /// selection model.
    Kv(kv::KvArgs),
}

/// Restores the default SIGPIPE action, so `tierkit ... | head` ends quietly as other command-line
/// tools do, instead of panicking in `println!` on a closed pipe (the Rust runtime ignores SIGPIPE).
/// Every other failed write to stdout (a full disk: `> /dev/full`) is an error, exit 1
/// ([`output`]).
#[cfg(unix)]
fn default_sigpipe() {
    // SAFETY: called first thing in `main`, before any thread exists; `SIG_DFL` is a valid
    // disposition for SIGPIPE and no handler of ours is replaced.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// The error and its causes, one line each; a cause whose text the line above already shows
/// (an I/O error quoted in its file's message) is not repeated.
fn report(e: &dyn std::error::Error) {
    let mut shown = e.to_string();
    errln!("error: {shown}");
    let mut src = e.source();
    while let Some(s) = src {
        let line = s.to_string();
        if !shown.contains(&line) {
            errln!("  caused by: {line}");
        }
        shown = line;
        src = s.source();
    }
}

fn main() {
    #[cfg(unix)]
    default_sigpipe();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            // `--help` and `--version` go to stdout: a failed write is an error there too
            // (clap's own `exit` ignores it); usage errors go to stderr, exit 2.
            if let Err(io) = e
                .print()
                .and_then(|()| std::io::Write::flush(&mut std::io::stdout()))
            {
                if e.use_stderr() {
                    std::process::exit(e.exit_code());
                }
                report(&output::StdoutError::from(io));
                std::process::exit(1);
            }
            std::process::exit(e.exit_code());
        }
    };
    let result = match cli.command {
        Command::Experts { command } => experts::run(command),
        Command::Kv(args) => kv::run(args),
    }
    .and_then(|()| Ok(output::flush()?));
    if let Err(e) = result {
        report(e.as_ref());
        std::process::exit(1);
    }
}
