//! The trybuild suite: what must fail to compile (with which message) and what must keep
//! compiling. Snapshots are blessed with the pinned toolchain (`rust-toolchain.toml`):
//! `TRYBUILD=overwrite cargo test --test ui`, then read the diff.

#[test]
fn ui() {
    let cases = trybuild::TestCases::new();
    cases.compile_fail("tests/ui/fail/*/*.rs");
    cases.pass("tests/ui/pass/*/*.rs");
}
