//! The trybuild suite: what must fail to compile (with which message) and what must keep
//! compiling. Snapshots are blessed with the pinned toolchain (`rust-toolchain.toml`):
//! `TRYBUILD=overwrite cargo test --test ui`, then read the diff.
//!
//! Two runs, one after the other: trybuild checks a run of compile-fail cases alone in one
//! `cargo check --keep-going` over all of them, but builds and runs a run that holds any pass
//! case one case at a time.

#[test]
fn ui() {
    trybuild::TestCases::new().compile_fail("tests/ui/fail/*/*.rs");
    trybuild::TestCases::new().pass("tests/ui/pass/*/*.rs");
}
