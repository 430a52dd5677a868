//! No compiler message of the trybuild suite names kvown's machinery.
//!
//! Every `error`, `warning`, `help` and `note` line of every `.stderr` snapshot under `tests/ui`
//! (with the continuation lines of a `= help:` / `= note:` list) is checked for internal names:
//! kvown's hidden support paths (`__kvown`, `__private`, `__seal`, `kvown_runtime`) and a method
//! owner's capability token spelled `Type_method`. A line may name one only when rustc's own
//! layout forces it: such lines are listed in [`ALLOWED`], each with the reason, and a listed
//! line that no snapshot contains any more fails the test too, so the list only shrinks.

use std::path::{Path, PathBuf};

/// Names that only kvown's expansion uses.
const INTERNAL: &[&str] = &["__kvown", "__private", "__seal", "kvown_runtime"];

/// `(snapshot, text of the line, why rustc prints it)`.
const ALLOWED: &[(&str, &str, &str)] = &[];

/// The snapshots, sorted.
fn snapshots(dir: &Path, found: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("tests/ui is readable")
        .map(|entry| entry.expect("a directory entry").path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            snapshots(&path, found);
        } else if path.extension().is_some_and(|e| e == "stderr") {
            found.push(path);
        }
    }
}

/// The message lines of a snapshot: headlines (`error..`, `warning..`, `help:`, `note:`), the
/// `= help:` / `= note:` lines, and the indented lines that continue those.
fn message_lines(text: &str) -> Vec<&str> {
    let mut lines = Vec::new();
    let mut in_list = false;
    for line in text.lines() {
        let trimmed = line.trim_start();
        let headline = ["error", "warning", "help:", "note:"]
            .iter()
            .any(|p| line.starts_with(p));
        let attached = trimmed.starts_with("= help:") || trimmed.starts_with("= note:");
        let continued = in_list && line.starts_with("   ") && !trimmed.starts_with('|');
        if headline || attached || continued {
            lines.push(line);
        }
        in_list = (attached || continued) && !trimmed.is_empty();
    }
    lines
}

/// A backticked name of the shape of a method owner's token, `Type_method`: an UpperCamelCase
/// identifier, `_`, then a lower-case one.
fn names_a_method_token(line: &str) -> bool {
    line.split('`').skip(1).step_by(2).any(|quoted| {
        quoted
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .any(|word| match word.split_once('_') {
                Some((ty, method)) => {
                    ty.starts_with(|c: char| c.is_ascii_uppercase())
                        && !ty.contains(|c: char| !c.is_ascii_alphanumeric())
                        && method.starts_with(|c: char| c.is_ascii_lowercase())
                        && ty.chars().any(|c| c.is_ascii_lowercase())
                }
                None => false,
            })
    })
}

fn internal_name(line: &str) -> Option<&'static str> {
    if let Some(name) = INTERNAL.iter().find(|name| line.contains(*name)) {
        return Some(name);
    }
    names_a_method_token(line).then_some("a method token `Type_method`")
}

#[test]
fn no_message_names_kvown_internals() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    snapshots(&root.join("tests/ui"), &mut files);
    assert!(!files.is_empty(), "no .stderr snapshot found");
    let mut offending = Vec::new();
    let mut used = vec![false; ALLOWED.len()];
    for file in &files {
        let shown = file.strip_prefix(root).unwrap().display().to_string();
        let text = std::fs::read_to_string(file).unwrap();
        for line in message_lines(&text) {
            let Some(name) = internal_name(line) else {
                continue;
            };
            let allowed = ALLOWED
                .iter()
                .position(|(path, allowed, _)| *path == shown && line.trim() == allowed.trim());
            match allowed {
                Some(index) => used[index] = true,
                None => offending.push(format!("{shown}: {name}:\n    {line}")),
            }
        }
    }
    let stale: Vec<String> = ALLOWED
        .iter()
        .zip(&used)
        .filter(|(_, used)| !**used)
        .map(|((path, line, _), _)| format!("{path}:\n    {line}"))
        .collect();
    assert!(
        offending.is_empty(),
        "{} message line(s) name kvown internals (fix the expansion, or list a line rustc's \
         layout forces in ALLOWED with the reason):\n{}",
        offending.len(),
        offending.join("\n")
    );
    assert!(
        stale.is_empty(),
        "ALLOWED lists lines that no snapshot has any more; remove them:\n{}",
        stale.join("\n")
    );
}

#[test]
fn the_scan_sees_headlines_lists_and_tokens() {
    let text = "error[E0616]: field `len` of struct `__kvown_guarded_Req::Req` is private\n \
                --> a.rs:1:1\n  |\n1 | x\n  | ^ label with `__kvown`\n   = help: the following \
                type implements the trait:\n             __kvown_owner_alloc::alloc\n   = note: \
                end\n";
    let lines = message_lines(text);
    assert_eq!(lines.len(), 4, "{lines:?}");
    assert!(names_a_method_token("`Order_reopen` is not an owner"));
    assert!(!names_a_method_token("`ReqKvInfo::kv_committed_len`"));
    assert!(!names_a_method_token("`alloc_for_decode`, `SCREAMING_CASE`"));
}
