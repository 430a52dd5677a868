//! The macros' compile-time suite: what must fail to compile (with which message) and what must
//! keep compiling and running.
//!
//! The compile-fail cases (`tests/ui/fail/<topic>/`) run through trybuild, which checks them all
//! in one `cargo check --keep-going` and compares each message with its `.stderr` snapshot.
//! Snapshots are blessed with the pinned toolchain (`rust-toolchain.toml`):
//! `TRYBUILD=overwrite cargo test --test ui`, then read the diff.
//!
//! The compile-pass cases (`tests/ui/pass/<topic>/`) are modules of this binary, each with a
//! `compiles_and_runs` test: compiling this file is their check, and their assertions run as
//! tests. (Built by trybuild, each pass case cost its own cargo build, 11 of the suite's 15
//! seconds.)

// kvown under another name in the extern prelude, as a renamed dependency is seen, for
// `pass/crate_path/renamed_dependency.rs`.
extern crate kvown as renamed;

#[test]
fn compile_fail_cases_fail_with_their_snapshot_messages() {
    trybuild::TestCases::new().compile_fail("tests/ui/fail/*/*.rs");
}

#[path = "ui/pass"]
pub mod pass {
    pub mod crate_path {
        pub mod renamed_dependency;
    }
    pub mod owners {
        pub mod async_const_unsafe;
        pub mod binding_beside_constants;
        pub mod closure_and_scoped_threads;
        pub mod delegation_to_helpers;
        pub mod deprecated_owners;
        pub mod generic_owners;
        pub mod macro_generated_owners;
        pub mod method_named_like_a_primitive;
        pub mod method_owners;
        pub mod modules_inside_owner_bodies;
        pub mod same_names_under_glob_import;
        pub mod super_paths_and_private_items;
        pub mod two_owners_and_readers;
    }
    pub mod sglang {
        pub mod alloc_for_decode_writes_committed;
    }
    pub mod structs {
        pub mod cfg_fields_and_owners;
        pub mod deprecated_structs_and_fields;
        pub mod docs_repr_and_attrs;
        pub mod drop_impls;
        pub mod field_named_from;
        pub mod forbid_unsafe_code;
        pub mod generic_structs;
        pub mod lifetime_named_like_the_view_lifetime;
        pub mod lint_suppressions_cover_generated_copies;
        pub mod lowercase_constants_named_like_parameters;
        pub mod raw_identifiers;
        pub mod self_in_field_types;
        pub mod self_in_where_clauses;
        pub mod split_borrow_view;
        pub mod std_derives_and_init;
        pub mod unsized_markers;
        pub mod unsized_tail;
        pub mod unused_generated_items_no_warnings;
        pub mod visibility_in_modules;
    }
    pub mod typestate {
        pub mod read_after_alloc;
    }
}

/// A pass case dropped into `tests/ui/pass/` without a `mod` line above would never compile.
#[test]
fn every_pass_case_is_a_module_of_this_binary() {
    let this_file = include_str!("ui.rs");
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/ui/pass");
    let mut cases = 0;
    for topic in std::fs::read_dir(&dir).unwrap() {
        let topic = topic.unwrap().path();
        let topic_name = topic.file_name().unwrap().to_str().unwrap().to_owned();
        // The topic's own block, from its `pub mod topic {` to the first `}` after it.
        let block = this_file
            .split_once(&format!("pub mod {topic_name} {{"))
            .and_then(|(_, rest)| rest.split_once('}'))
            .map(|(block, _)| block)
            .unwrap_or_else(|| panic!("topic {topic_name} has no `pub mod` block"));
        for case in std::fs::read_dir(&topic).unwrap() {
            let case = case.unwrap().path();
            let name = case.file_stem().unwrap().to_str().unwrap();
            assert!(
                block.contains(&format!("pub mod {name};")),
                "{} is not declared in its topic's block of tests/ui.rs",
                case.display()
            );
            cases += 1;
        }
    }
    assert!(cases > 0, "no pass cases under {}", dir.display());
}
