//! The runtime's top-level modules read as floors, each importing only the floors below it:
//!
//! 1. `check` (the invariant checker, reclaim);
//! 2. `batch` (a request's whole life: the request, its ladder and the functions that own it);
//! 3. `cache` (the allocator, table and prefix cache a batch flow keeps consistent);
//! 4. `error`;
//! 5. `radix`, `kv`;
//! 6. `alloc`;
//! 7. `slots`, `ownership`;
//! 8. `ids`.
//!
//! Two references go up a floor, both what `#[owned_by]` asks for, and nothing else may:
//! `batch` names `check::reclaim_leaks` as an owner of `ReqKvInfo::kv_cache`, and `cache`
//! takes the `batch::Req`s whose rows and locks it holds (the owners in `batch` take the
//! `KvCache` in turn).
//!
//! The scan reads every `crate::<module>` path in the code of `src/` (comments, string literals
//! and the test modules at the ends of files left out).

use std::collections::BTreeMap;
use std::path::Path;

const FLOORS: &[&[&str]] = &[
    &["check"],
    &["batch"],
    &["cache"],
    &["error"],
    &["radix", "kv"],
    &["alloc"],
    &["slots", "ownership"],
    &["ids"],
];

/// The references allowed to go up: (from, to, the only path used that way, why).
const OWNER_LINKS: &[(&str, &str, &str, &str)] = &[
    (
        "batch",
        "check",
        "crate::check::reclaim_leaks",
        "an owner of ReqKvInfo::kv_cache, named in #[owned_by]",
    ),
    (
        "cache",
        "batch",
        "crate::batch::Req",
        "KvCache takes the requests whose rows and locks it holds",
    ),
];

fn floor(module: &str) -> usize {
    FLOORS
        .iter()
        .position(|floor| floor.contains(&module))
        .unwrap_or_else(|| panic!("module `{module}` has no floor: add it to FLOORS"))
}

/// Every `crate::<module>...` path in the code of each top-level module: (from, to) -> paths.
fn references() -> BTreeMap<(String, String), Vec<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut found = BTreeMap::new();
    let mut stack = vec![src.clone()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            let relative = path.strip_prefix(&src).unwrap();
            let first = relative.components().next().unwrap().as_os_str();
            let from = first.to_str().unwrap().trim_end_matches(".rs").to_string();
            if from == "lib" {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            let mut lines = text.lines().peekable();
            while let Some(line) = lines.next() {
                // A test module (at the end of its file) may import what it tests with.
                let test_module = lines.peek().is_some_and(|next| {
                    next.trim_start().starts_with("mod ") && next.trim_end().ends_with('{')
                });
                if line.trim() == "#[cfg(test)]" && test_module {
                    break;
                }
                let code = strip_strings(line.split("//").next().unwrap_or(""));
                for (at, _) in code.match_indices("crate::") {
                    let path: String = code[at..]
                        .chars()
                        .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':')
                        .collect();
                    let to = path["crate::".len()..]
                        .split("::")
                        .next()
                        .unwrap()
                        .to_string();
                    if to != from && !to.is_empty() && to != "__private" {
                        found
                            .entry((from.clone(), to))
                            .or_insert_with(Vec::new)
                            .push(path.trim_end_matches(':').to_string());
                    }
                }
            }
        }
    }
    found
}

/// `line` with the contents of its string literals removed.
fn strip_strings(line: &str) -> String {
    let mut inside = false;
    line.chars()
        .filter(|&c| {
            if c == '"' {
                inside = !inside;
            }
            !inside
        })
        .collect()
}

#[test]
fn each_module_imports_only_the_floors_below_it_but_for_the_owner_links() {
    let references = references();
    assert!(
        references.contains_key(&("batch".to_string(), "cache".to_string())),
        "the scan found nothing: it reads the wrong files"
    );
    for ((from, to), paths) in &references {
        if floor(from) < floor(to) {
            continue;
        }
        let link = OWNER_LINKS
            .iter()
            .find(|(f, t, _, _)| f == from && t == to)
            .unwrap_or_else(|| {
                panic!(
                    "`{from}` (floor {}) imports `{to}` (floor {}): {paths:?}; a module imports \
                     only the floors below it",
                    floor(from) + 1,
                    floor(to) + 1
                )
            });
        for path in paths {
            assert_eq!(
                path, link.2,
                "`{from}` reaches up into `{to}` only for {} ({}), not through `{path}`",
                link.2, link.3
            );
        }
    }
    for (from, to, path, why) in OWNER_LINKS {
        assert!(
            references.contains_key(&(from.to_string(), to.to_string())),
            "the owner link {from} -> {to} ({path}: {why}) is gone: remove it from OWNER_LINKS"
        );
    }
}
