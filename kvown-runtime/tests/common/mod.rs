//! Shared by the property tests.

use proptest::test_runner::Config;

/// Cases per property: 96 in a normal run (`cargo test` stays quick on 2 cores), or
/// `PROPTEST_CASES` when set, for a soak run: `PROPTEST_CASES=5000 cargo test --release -p
/// kvown-runtime --test batch_proptest`.
pub fn proptest_config() -> Config {
    if std::env::var_os("PROPTEST_CASES").is_some() {
        Config::default()
    } else {
        Config::with_cases(96)
    }
}
