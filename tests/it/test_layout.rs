//! Every crate of the workspace builds at most two integration-test binaries (issue 38: one
//! `tests/it/main.rs` with modules, and the root crate's trybuild suite beside it), and no test
//! includes code from `examples/` through `#[path]`: fixtures live under `tests/`.

use std::collections::BTreeSet;
use std::path::Path;

/// The integration-test binaries cargo builds for the crate in `dir`: `tests/*.rs`,
/// `tests/*/main.rs` and the `[[test]]` targets of its manifest.
fn test_binaries(dir: &Path) -> BTreeSet<String> {
    let mut binaries = BTreeSet::new();
    let tests = dir.join("tests");
    if let Ok(entries) = std::fs::read_dir(&tests) {
        for entry in entries {
            let path = entry.unwrap().path();
            let name = path.file_stem().unwrap().to_str().unwrap().to_string();
            if path.extension().is_some_and(|ext| ext == "rs") || path.join("main.rs").is_file() {
                binaries.insert(name);
            }
        }
    }
    let manifest = std::fs::read_to_string(dir.join("Cargo.toml")).unwrap();
    for target in manifest.split("[[test]]").skip(1) {
        let name = target
            .lines()
            .find_map(|line| line.trim().strip_prefix("name = "))
            .expect("a [[test]] target has a name");
        binaries.insert(name.trim_matches('"').to_string());
    }
    binaries
}

#[test]
fn every_crate_has_at_most_two_test_binaries_and_no_test_includes_an_example() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let members = super::module_layout::members(root);
    assert!(
        members.len() > 5,
        "the workspace lists its members: {members:?}"
    );
    for member in &members {
        let dir = root.join(member);
        let binaries = test_binaries(&dir);
        assert!(
            binaries.len() <= 2,
            "{member} builds {} integration-test binaries {binaries:?}: put its tests in \
             tests/it/main.rs as modules",
            binaries.len()
        );
        let mut files = Vec::new();
        super::module_layout::rust_files(&dir.join("tests"), &mut files);
        for file in files {
            let text = std::fs::read_to_string(&file).unwrap();
            for line in text
                .lines()
                .filter(|line| line.trim_start().starts_with("#[path"))
            {
                assert!(
                    !line.contains("examples/"),
                    "{} includes an example's code ({line}): move the fixture under tests/",
                    file.display()
                );
            }
        }
    }
    assert_eq!(
        test_binaries(root),
        BTreeSet::from(["it".into(), "ui".into()])
    );
}
