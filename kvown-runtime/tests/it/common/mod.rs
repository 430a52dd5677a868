//! Fixtures shared by the test modules, and the property tests' configuration.

pub mod batch_setup;
pub mod cache_events;
pub mod faulty;
pub mod held_rows;
pub mod radix_setup;
pub mod sglang_radix;

use proptest::test_runner::{Config, FileFailurePersistence};

/// Cases per property: 96 in a normal run (`cargo test` stays quick on 2 cores), or
/// `PROPTEST_CASES` when set, for a soak run: `PROPTEST_CASES=5000 cargo test --release -p
/// kvown-runtime --test it batch_proptest::`. Failures are saved as [`beside_source`] says.
pub fn proptest_config() -> Config {
    if std::env::var_os("PROPTEST_CASES").is_some() {
        beside_source(Config::default())
    } else {
        beside_source(Config::with_cases(96))
    }
}

/// `config` with its failures saved beside the test module's source file
/// (`tests/it/<module>.proptest-regressions`). proptest's default, `SourceParallel`, would put
/// every module's in `tests/proptest-regressions/` once the modules share a `main.rs`.
pub fn beside_source(config: Config) -> Config {
    Config {
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource(
            "proptest-regressions",
        ))),
        ..config
    }
}

/// Every `<module>.proptest-regressions` file under `tests/it/` sits beside its module and is
/// read back in full where [`beside_source`] looks, resolving the module's path as proptest
/// resolves `file!()`: a moved module or a changed config would silently drop its saved cases.
#[test]
fn saved_failures_are_found_beside_their_modules() {
    let tests_it = std::path::Path::new(file!())
        .parent()
        .and_then(|common| common.parent());
    let tests_it = tests_it.expect("common/mod.rs sits in tests/it/");
    let on_disk = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/it");
    let mut files = 0;
    for entry in std::fs::read_dir(&on_disk).unwrap() {
        let path = entry.unwrap().path();
        if path.extension() != Some("proptest-regressions".as_ref()) {
            continue;
        }
        let saved = std::fs::read_to_string(&path).unwrap();
        let saved = saved.lines().filter(|line| line.starts_with("cc ")).count();
        let module = tests_it
            .join(path.file_name().unwrap())
            .with_extension("rs");
        let module: &'static str = Box::leak(module.to_str().unwrap().into());
        let persistence = beside_source(Config::default())
            .failure_persistence
            .unwrap();
        let loaded = persistence.load_persisted_failures2(Some(module)).len();
        assert_eq!(
            loaded,
            saved,
            "{} read back {loaded} of its {saved} cases",
            path.display()
        );
        assert!(saved > 0, "{} saves no case", path.display());
        files += 1;
    }
    assert!(
        files > 0,
        "no saved failures found under {}",
        on_disk.display()
    );
}
