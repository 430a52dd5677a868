//! The crate's modules (`src/*.rs` and `src/*/`) import one another without a cycle: every
//! `crate::<module>` path in the code of a module names one that does not reach back to it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Every `crate::<module>` path in the code of each top-level module of `src/`, test modules at
/// the ends of files and comments left out: module -> the modules it imports.
fn imports() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut found: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut stack = vec![src.clone()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            if path.extension().is_none_or(|ext| ext != "rs") {
                continue;
            }
            let relative = path.strip_prefix(&src).unwrap();
            let first = relative.components().next().unwrap().as_os_str();
            let from = first.to_str().unwrap().trim_end_matches(".rs").to_string();
            if from == "lib" {
                continue;
            }
            let imported = found.entry(from.clone()).or_default();
            let text = std::fs::read_to_string(&path).unwrap();
            for line in text.lines() {
                if line.trim() == "#[cfg(test)]" {
                    break;
                }
                let code = line.split("//").next().unwrap_or("");
                for (at, _) in code.match_indices("crate::") {
                    let to: String = code[at + "crate::".len()..]
                        .chars()
                        .take_while(|c| c.is_alphanumeric() || *c == '_')
                        .collect();
                    if to != from && !to.is_empty() {
                        imported.insert(to);
                    }
                }
            }
        }
    }
    found
}

/// A path of imports from `module` back to itself, if there is one.
fn cycle_through(
    module: &str,
    imports: &BTreeMap<String, BTreeSet<String>>,
) -> Option<Vec<String>> {
    let mut stack = vec![vec![module.to_string()]];
    let mut seen = BTreeSet::new();
    while let Some(path) = stack.pop() {
        let last = path.last().unwrap();
        for next in imports.get(last).into_iter().flatten() {
            if next == module {
                let mut cycle = path.clone();
                cycle.push(next.clone());
                return Some(cycle);
            }
            if seen.insert(next.clone()) {
                let mut longer = path.clone();
                longer.push(next.clone());
                stack.push(longer);
            }
        }
    }
    None
}

#[test]
fn no_module_imports_one_that_imports_it_back() {
    let imports = imports();
    assert!(
        imports
            .get("detect")
            .is_some_and(|to| to.contains("kernels")),
        "the scan found nothing: it reads the wrong files"
    );
    for module in imports.keys() {
        if let Some(cycle) = cycle_through(module, &imports) {
            panic!("an import cycle: {}", cycle.join(" -> "));
        }
    }
}
