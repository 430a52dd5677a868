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

/// Why rustc names a method owner's token when an `#[owned_by(Type::method)]` entry finds no
/// owner: the entry resolves, in rustc's name resolution, to the token `#[owners]` re-exports as
/// `Type_method` next to the type; when there is none (a misspelt method, a method without
/// `#[owners]`), rustc says which name it looked for. A check through the type itself
/// (`Type::method` as a value) cannot replace it: a generic `Type<T>` named without its
/// parameters does not resolve as a value.
const METHOD_ENTRY_RESOLVES_TO_ITS_TOKEN: &str =
    "rustc reports the name an `#[owned_by(Type::method)]` entry resolves to";

/// Why a name of the shape `Type_method` is the user's own: the macro quotes it back.
const THE_USERS_OWN_NAME: &str =
    "the user's own identifier, quoted back by the macro's error about its shape";

/// Why rustc prints `kvown::__private`: the items there are what makes a token a token, and they
/// are outside the public API on purpose (implementing `OwnerToken` or building an `OwnerSeal`
/// by hand is how one would forge an owner); rustc names a foreign item by the path its crate
/// exports it at.
const SUPPORT_ITEM_OF_A_FORGERY: &str =
    "a forgery names kvown's support item, which rustc prints at its only exported path";

/// `(snapshot, text of the line, why rustc prints it)`.
const ALLOWED: &[(&str, &str, &str)] = &[
    (
        "tests/ui/fail/first_contact/method_owner_typo.stderr",
        "error[E0425]: cannot find type `Meter_tik` in module `super`",
        METHOD_ENTRY_RESOLVES_TO_ITS_TOKEN,
    ),
    (
        "tests/ui/fail/forge/method_owner_impersonated_by_other_type.stderr",
        "error[E0425]: cannot find type `Batch_retract` in module `super`",
        METHOD_ENTRY_RESOLVES_TO_ITS_TOKEN,
    ),
    (
        "tests/ui/fail/misuse/owner_method_without_owners.stderr",
        "error[E0425]: cannot find type `Batch_alloc` in module `super`",
        METHOD_ENTRY_RESOLVES_TO_ITS_TOKEN,
    ),
    (
        "tests/ui/fail/misuse/owners_type_name.stderr",
        "error[E0425]: cannot find type `Batch_x_y` in module `super`",
        METHOD_ENTRY_RESOLVES_TO_ITS_TOKEN,
    ),
    (
        "tests/ui/fail/forge/method_owner_impersonated_by_free_fn.stderr",
        "error: #[owner] function `Batch_retract` needs a snake_case name: kvown finds a method \
         owner `Type::method` by a name that starts with the type's, so a function named with an \
         upper-case letter could pass for one",
        THE_USERS_OWN_NAME,
    ),
    (
        "tests/ui/fail/misuse/owners_type_name.stderr",
        "error: #[kvown::owners] needs an UpperCamelCase type name without `_` (found `Batch_x`): \
         kvown finds a method owner `Type::method` by the type's and the method's names joined \
         with `_`, which must split one way only",
        THE_USERS_OWN_NAME,
    ),
    (
        "tests/ui/fail/forge/default_token.stderr",
        "error[E0277]: the trait bound `kvown::__private::OwnerSeal: Default` is not satisfied",
        SUPPORT_ITEM_OF_A_FORGERY,
    ),
    (
        "tests/ui/fail/forge/unit_struct_named_like_owner.stderr",
        "help: the trait `kvown::__private::OwnerToken` is not implemented for `alloc`",
        SUPPORT_ITEM_OF_A_FORGERY,
    ),
];

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
    assert!(!names_a_method_token(
        "`alloc_for_decode`, `SCREAMING_CASE`"
    ));
}
