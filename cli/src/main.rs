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

mod experts;
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
#[cfg(unix)]
fn default_sigpipe() {
    // SAFETY: called first thing in `main`, before any thread exists; `SIG_DFL` is a valid
    // disposition for SIGPIPE and no handler of ours is replaced.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

fn main() {
    #[cfg(unix)]
    default_sigpipe();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Experts { command } => experts::run(command),
        Command::Kv(args) => kv::run(args),
    };
    if let Err(e) = result {
        eprintln!("error: {e}");
        let mut src = e.source();
        while let Some(s) = src {
            eprintln!("  caused by: {s}");
            src = s.source();
        }
        std::process::exit(1);
    }
}
