//! Shared bits of the proptest state-machine tests.

use proptest::test_runner::Config;

/// 64 cases unless `PROPTEST_CASES` says otherwise: keeps `cargo test` in
/// debug well under a minute; crank it up for a long run.
pub fn config() -> Config {
    let mut c = Config::default();
    if std::env::var("PROPTEST_CASES").is_err() {
        c.cases = 64;
    }
    c
}
