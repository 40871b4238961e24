//! Allocation-failure tests: run a body in a child process whose address space is capped
//! (`setrlimit(RLIMIT_AS)`), as a container's memory limit would, so an allocation the tier
//! cannot make fails there — a typed error where the code is fallible, an abort of the child
//! (never of the test binary) where it is not.

use std::process::Command;

/// Set in the child to the name of the test it runs under the limit.
const CHILD: &str = "TIERKIT_MEMLIMIT_CHILD";

/// Runs `body` under an address-space limit, in a child process: this test binary again,
/// running only `test` (its path as libtest names it: `tests::name` for a unit test in a
/// `tests` module, the function name in an integration test). The child runs `setup` (the
/// caller's input, allocated before the limit), caps its address space at what it maps then plus
/// `headroom` bytes, and runs `body` on the input: any allocation larger than `headroom` fails
/// there. The parent asserts the child ran that one test and passed (a panic, an abort or a
/// signal fail the test, with the child's output). Prints a line starting with `SKIP` and returns
/// where the limit cannot be set (not Linux, or a hard limit already below it). Nothing larger
/// than `setup` allocates is ever touched: lazily zeroed buffers (`vec![0u8; n]`) stay virtual.
///
/// # Panics
/// In the parent, when the child fails or does not run exactly `test`.
pub fn under_memory_limit<S>(
    test: &str,
    headroom: usize,
    setup: impl FnOnce() -> S,
    body: impl FnOnce(S),
) {
    if std::env::var(CHILD).as_deref() == Ok(test) {
        let input = setup();
        match limit_address_space(headroom) {
            Ok(limit) => {
                // On a line of its own (libtest printed the test's name without a newline).
                println!("\nmemory limit: address space capped at {limit} bytes ({headroom} of headroom)");
                body(input);
            }
            Err(why) => println!("\nSKIP: {why}"),
        }
        return;
    }
    if !cfg!(target_os = "linux") {
        println!("SKIP: address-space limits are tested on Linux only");
        return;
    }
    let exe = std::env::current_exe().expect("the test binary's path");
    let out = Command::new(exe)
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD, test)
        // glibc: one arena (a thread's own arena reserves 64 MiB of address space up front,
        // which would serve allocations past the cap) and a fixed mmap threshold (each large
        // buffer mapped and unmapped on its own, so freed ones do not linger in the heap).
        .env("MALLOC_ARENA_MAX", "1")
        .env("MALLOC_MMAP_THRESHOLD_", "131072")
        .output()
        .expect("run the test binary again as the memory-limited child");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let report = format!(
        "memory-limited child of `{test}`: {}\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
        describe(&out.status)
    );
    assert!(out.status.success(), "{report}");
    assert!(
        stdout.contains("test result: ok. 1 passed"),
        "the child did not run exactly `{test}`: {report}"
    );
    // The child's SKIP (counted as skipped by CI) or the cap it ran under.
    if let Some(line) = stdout
        .lines()
        .find(|l| l.starts_with("SKIP") || l.starts_with("memory limit:"))
    {
        println!("{line}");
    }
}

/// How a child ended, with the signal named (an abort shows as SIGABRT).
fn describe(status: &std::process::ExitStatus) -> String {
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        if let Some(sig) = status.signal() {
            let name = match sig {
                libc::SIGABRT => "SIGABRT (an allocation failure aborted it)",
                libc::SIGSEGV => "SIGSEGV",
                libc::SIGKILL => "SIGKILL",
                _ => "a signal",
            };
            return format!("killed by signal {sig}: {name}");
        }
    }
    format!("{status}")
}

/// Caps this process's address space at its current size plus `headroom` bytes; returns the cap.
#[cfg(target_os = "linux")]
fn limit_address_space(headroom: usize) -> Result<u64, String> {
    let statm = std::fs::read_to_string("/proc/self/statm")
        .map_err(|e| format!("cannot read /proc/self/statm: {e}"))?;
    let pages: u64 = statm
        .split_whitespace()
        .next()
        .and_then(|p| p.parse().ok())
        .ok_or_else(|| format!("unexpected /proc/self/statm: {statm:?}"))?;
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    let page = u64::try_from(page).map_err(|_| "no page size".to_string())?;
    let limit = pages * page + headroom as u64;
    let mut old = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `old` is a valid, writable rlimit.
    if unsafe { libc::getrlimit(libc::RLIMIT_AS, &mut old) } != 0 {
        return Err("getrlimit(RLIMIT_AS) failed".into());
    }
    if old.rlim_max != libc::RLIM_INFINITY && old.rlim_max < limit {
        return Err(format!(
            "the hard RLIMIT_AS ({}) is below the cap this test sets ({limit})",
            old.rlim_max
        ));
    }
    let new = libc::rlimit {
        rlim_cur: limit,
        rlim_max: old.rlim_max,
    };
    // SAFETY: `new` is a valid rlimit; lowering the soft limit needs no privilege.
    if unsafe { libc::setrlimit(libc::RLIMIT_AS, &new) } != 0 {
        return Err("setrlimit(RLIMIT_AS) failed".into());
    }
    Ok(limit)
}

#[cfg(not(target_os = "linux"))]
fn limit_address_space(_headroom: usize) -> Result<u64, String> {
    Err("address-space limits are tested on Linux only".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_allocation_past_the_headroom_fails_in_the_child() {
        under_memory_limit(
            "memlimit::tests::an_allocation_past_the_headroom_fails_in_the_child",
            32 << 20,
            || (),
            |()| {
                let mut v: Vec<u8> = Vec::new();
                assert!(
                    v.try_reserve_exact(256 << 20).is_err(),
                    "256 MiB past a 32 MiB cap"
                );
                assert!(v.try_reserve_exact(1 << 20).is_ok(), "1 MiB within it");
            },
        );
    }
}
