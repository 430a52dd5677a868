//! No import cycle in any crate of the workspace, at any depth: in every module, the child
//! modules import one another without a cycle. One checker for every member's `src/`.
//!
//! The scan reads the code of each file (comments, string and character literals, and
//! `#[cfg(test)]` modules left out): every `use` tree and every `crate::`, `super::` and
//! `self::` path. A path from module `a::b::x` to `a::c::...` is an import of sibling `c` by
//! sibling `b` inside `a`; a path to an item that `a` re-exports from its child `c`
//! (`pub use c::Item`) counts as an import of `c` too.
//!
//! The exceptions are the links `#[owned_by]` asks for, each through one named path
//! ([`OWNER_LINKS`]); a link that is gone must leave the list.
//!
//! Where a crate documents its modules as floors ([`FLOORS`]: kvown-runtime's top level), each
//! module imports only the floors below it, the owner links aside.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The imports allowed to close a cycle: (crate directory, parent module, from, to, the only
/// path used that way, why).
const OWNER_LINKS: &[(&str, &str, &str, &str, &str, &str)] = &[
    (
        "kvown-runtime",
        "crate",
        "batch",
        "check",
        "crate::check::reclaim_leaks",
        "an owner of ReqKvInfo::kv_cache, named in #[owned_by]",
    ),
    (
        "kvown-runtime",
        "crate",
        "cache",
        "batch",
        "crate::batch::Req",
        "KvCache takes the requests whose rows and locks it holds (their owners in batch take \
         the KvCache)",
    ),
];

/// Documented floors, top to bottom: (crate directory, the modules of its top level by floor).
/// Each imports only the floors below it; every top-level module has a floor.
const FLOORS: &[(&str, &[&[&str]])] = &[(
    "kvown-runtime",
    &[
        &["check"],
        &["batch"],
        &["cache"],
        &["error"],
        &["radix", "kv"],
        &["alloc"],
        &["slots", "ownership", "shared_error"],
        &["ids"],
    ],
)];

/// A module's path from its crate's root (`[]` for `lib.rs`).
type ModPath = Vec<String>;

/// One crate's modules and the imports between siblings.
#[derive(Default)]
struct Crate {
    /// Every module with a file, with its children.
    children: BTreeMap<ModPath, BTreeSet<String>>,
    /// (module, name) -> the child of `module` that its `pub use` takes `name` from.
    reexports: BTreeMap<(ModPath, String), String>,
    /// (parent, from, to) -> the paths that import `to` from inside `from`.
    imports: BTreeMap<(ModPath, String, String), BTreeSet<String>>,
}

/// The workspace's member directories, the root crate (`.`) first.
pub(crate) fn members(root: &Path) -> Vec<String> {
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
    let list = manifest
        .split("members = [")
        .nth(1)
        .and_then(|rest| rest.split(']').next())
        .expect("the workspace Cargo.toml lists its members");
    let mut members = vec![".".to_string()];
    members.extend(
        list.split(',')
            .map(|m| m.trim().trim_matches('"').to_string()),
    );
    members.retain(|m| !m.is_empty());
    members
}

/// Every `.rs` file under `dir`, at any depth.
pub(crate) fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            out.push(path);
        }
    }
}

/// The `.rs` files under `src/` and the module each one is (`src/bin/` left out: its files are
/// crates of their own).
fn module_files(src: &Path) -> Vec<(PathBuf, ModPath)> {
    let mut paths = Vec::new();
    rust_files(src, &mut paths);
    let bin = src.join("bin");
    paths
        .into_iter()
        .filter(|path| !path.starts_with(&bin))
        .map(|path| {
            let relative = path.strip_prefix(src).unwrap().with_extension("");
            let mut module: ModPath = relative
                .components()
                .map(|c| c.as_os_str().to_str().unwrap().to_string())
                .collect();
            if matches!(
                module.last().map(String::as_str),
                Some("mod" | "lib" | "main")
            ) {
                module.pop();
            }
            (path, module)
        })
        .collect()
}

/// `text` with comments, string and character literals blanked out.
fn code_of(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
            out.push(' ');
        } else if c == 'r' && (next == Some('"') || next == Some('#')) && !ident_before(&chars, i) {
            let hashes = chars[i + 1..].iter().take_while(|&&h| h == '#').count();
            if chars.get(i + 1 + hashes) != Some(&'"') {
                out.push(c);
                i += 1;
                continue;
            }
            i += 2 + hashes;
            let close: String = std::iter::once('"')
                .chain("#".repeat(hashes).chars())
                .collect();
            while i < chars.len() && !chars[i..].iter().collect::<String>().starts_with(&close) {
                i += 1;
            }
            i += close.len();
            out.push_str("\"\"");
        } else if c == '"' {
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                i += if chars[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str("\"\"");
        } else if c == '\'' && (chars.get(i + 2) == Some(&'\'') || next == Some('\\')) {
            i += if next == Some('\\') { 2 } else { 1 };
            while i < chars.len() && chars[i] != '\'' {
                i += 1;
            }
            i += 1;
            out.push_str("' '");
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

fn ident_before(chars: &[char], i: usize) -> bool {
    i > 0 && (chars[i - 1].is_alphanumeric() || chars[i - 1] == '_')
}

/// `code` without its `#[cfg(test)]` modules, and the names of those declared as files.
fn without_test_modules(code: &str) -> (String, Vec<String>) {
    let mut kept = String::new();
    let mut test_files = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find("#[cfg(test)]") {
        kept.push_str(&rest[..at]);
        let after = &rest[at + "#[cfg(test)]".len()..];
        let item = after.trim_start();
        let item = item.strip_prefix("pub ").unwrap_or(item);
        let Some(module) = item.strip_prefix("mod ") else {
            rest = after;
            continue;
        };
        let name: String = module.chars().take_while(|c| is_ident(*c)).collect();
        let module = module[name.len()..].trim_start();
        if let Some(after_declaration) = module.strip_prefix(';') {
            test_files.push(name);
            rest = after_declaration;
        } else {
            let body = module.find('{').expect("a test module has a body");
            let mut depth = 0;
            let mut end = module.len();
            for (at, c) in module[body..].char_indices() {
                depth += match c {
                    '{' => 1,
                    '}' => -1,
                    _ => 0,
                };
                if depth == 0 {
                    end = body + at + 1;
                    break;
                }
            }
            rest = &module[end..];
        }
    }
    kept.push_str(rest);
    (kept, test_files)
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// The paths a `use` tree names: `a::{b, c::{d as e}}` -> `a::b`, `a::c::d` (with the
/// name each is bound to).
fn expand_use(tree: &str) -> Vec<(Vec<String>, String)> {
    fn expand(prefix: &[String], tree: &str, out: &mut Vec<(Vec<String>, String)>) {
        let tree = tree.trim();
        if let Some(open) = tree.find('{') {
            let head: Vec<String> = split_path(&tree[..open]);
            let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
            let mut full = prefix.to_vec();
            full.extend(head);
            let mut depth = 0;
            let mut start = 0;
            for (at, c) in inner.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        expand(&full, &inner[start..at], out);
                        start = at + 1;
                    }
                    _ => {}
                }
            }
            expand(&full, &inner[start..], out);
        } else if !tree.is_empty() {
            let (path, alias) = match tree.split_once(" as ") {
                Some((path, alias)) => (path, Some(alias.trim().to_string())),
                None => (tree, None),
            };
            let mut full = prefix.to_vec();
            full.extend(split_path(path));
            if full.last().is_some_and(|last| last == "self") {
                full.pop();
            }
            let bound = alias.or_else(|| full.last().cloned()).unwrap_or_default();
            out.push((full, bound));
        }
    }
    let mut out = Vec::new();
    expand(&[], tree, &mut out);
    out
}

fn split_path(path: &str) -> Vec<String> {
    path.split("::")
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect()
}

/// `path` (from inside `module`) as a path from the crate's root, if it starts at `crate`,
/// `super` or `self`.
fn absolute(module: &[String], path: &[String]) -> Option<ModPath> {
    let mut at: ModPath = match path.first()?.as_str() {
        "crate" => Vec::new(),
        "super" | "self" => module.to_vec(),
        _ => return None,
    };
    let mut rest = if path[0] == "crate" { &path[1..] } else { path };
    while let Some(first) = rest.first() {
        match first.as_str() {
            "super" => {
                at.pop()?;
            }
            "self" => {}
            _ => break,
        }
        rest = &rest[1..];
    }
    at.extend(rest.iter().cloned());
    Some(at)
}

/// The `use` trees and the other `crate::`, `super::`, `self::` paths in `code`.
fn paths_in(code: &str) -> (Vec<(bool, String)>, Vec<String>) {
    let mut uses = Vec::new();
    let mut others = Vec::new();
    let bytes = code.as_bytes();
    let mut i = 0;
    while i < code.len() {
        let word_start = i == 0 || !is_ident(bytes[i - 1] as char) && bytes[i - 1] != b'$';
        if word_start && code[i..].starts_with("use ") {
            let end = code[i..].find(';').map_or(code.len(), |e| i + e);
            let public =
                code[..i].trim_end().ends_with(')') || code[..i].trim_end().ends_with("pub");
            uses.push((public, code[i + 4..end].to_string()));
            i = end;
            continue;
        }
        let starts_path = ["crate", "super", "self"].iter().find(|kw| {
            code[i..].starts_with(**kw) && code[i + kw.len()..].trim_start().starts_with("::")
        });
        if word_start && starts_path.is_some() {
            let in_visibility = code[..i].trim_end().ends_with("(in");
            let path: String = code[i..]
                .chars()
                .take_while(|c| is_ident(*c) || *c == ':' || c.is_whitespace())
                .collect();
            i += path.len();
            if !in_visibility {
                others.push(path.split_whitespace().collect::<String>());
            }
            continue;
        }
        i += code[i..].chars().next().map_or(1, char::len_utf8);
    }
    (uses, others)
}

fn scan(crate_dir: &Path) -> Crate {
    let src = crate_dir.join("src");
    let mut krate = Crate::default();
    let files = module_files(&src);
    let mut code = Vec::new();
    let mut test_only = BTreeSet::new();
    for (path, module) in &files {
        let (kept, test_files) =
            without_test_modules(&code_of(&std::fs::read_to_string(path).unwrap()));
        for name in test_files {
            let mut child = module.clone();
            child.push(name);
            test_only.insert(child);
        }
        code.push((module.clone(), kept));
    }
    code.retain(|(module, _)| !(1..=module.len()).any(|n| test_only.contains(&module[..n])));
    for (module, _) in &code {
        krate.children.entry(module.clone()).or_default();
        if let Some((name, parent)) = module.split_last() {
            krate
                .children
                .entry(parent.to_vec())
                .or_default()
                .insert(name.clone());
        }
    }
    let mut found = Vec::new();
    for (module, text) in &code {
        let (uses, others) = paths_in(text);
        for (public, tree) in uses {
            for (path, bound) in expand_use(&tree) {
                let children = &krate.children[module];
                let target = match path.first() {
                    Some(first) if children.contains(first) => {
                        Some(module.iter().chain(&path).cloned().collect())
                    }
                    _ => absolute(module, &path),
                };
                let Some(target) = target else { continue };
                if public && target.len() > module.len() && target.starts_with(module) {
                    let child = target[module.len()].clone();
                    if child != bound {
                        krate.reexports.insert((module.clone(), bound), child);
                    }
                }
                found.push((module.clone(), target, path.join("::")));
            }
        }
        for path in others {
            if let Some(target) = absolute(module, &split_path(&path)) {
                found.push((module.clone(), target, path));
            }
        }
    }
    for (from, target, path) in found {
        let shared = from.iter().zip(&target).take_while(|(a, b)| a == b).count();
        if shared == from.len() || shared == target.len() {
            continue;
        }
        let parent = from[..shared].to_vec();
        let siblings = &krate.children[&parent];
        let to = if siblings.contains(&target[shared]) {
            target[shared].clone()
        } else if let Some(child) = krate
            .reexports
            .get(&(parent.clone(), target[shared].clone()))
        {
            child.clone()
        } else {
            continue;
        };
        if to != from[shared] {
            let key = (parent, from[shared].clone(), to);
            krate.imports.entry(key).or_default().insert(path);
        }
    }
    krate
}

fn module_name(parent: &[String]) -> String {
    if parent.is_empty() {
        "crate".to_string()
    } else {
        format!("crate::{}", parent.join("::"))
    }
}

/// A path of imports from `start` back to itself among `edges`, if there is one.
fn cycle_through(start: &str, edges: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    let mut stack = vec![vec![start.to_string()]];
    let mut seen = BTreeSet::new();
    while let Some(path) = stack.pop() {
        for next in edges.get(path.last().unwrap()).into_iter().flatten() {
            let mut longer = path.clone();
            longer.push(next.clone());
            if next == start {
                return Some(longer);
            }
            if seen.insert(next.clone()) {
                stack.push(longer);
            }
        }
    }
    None
}

#[test]
fn no_crate_has_an_import_cycle_at_any_depth() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut cycles = Vec::new();
    let mut used_links = BTreeSet::new();
    let mut scanned = BTreeMap::new();
    for member in members(root) {
        let krate = scan(&root.join(&member));
        let mut edges: BTreeMap<ModPath, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
        for ((parent, from, to), paths) in &krate.imports {
            let link = OWNER_LINKS.iter().position(|&(c, p, f, t, _, _)| {
                c == member && p == module_name(parent) && f == from && t == to
            });
            if let Some(link) = link {
                let allowed = OWNER_LINKS[link].4;
                if paths.iter().all(|path| path == allowed) {
                    used_links.insert(link);
                    continue;
                }
            }
            edges
                .entry(parent.clone())
                .or_default()
                .entry(from.clone())
                .or_default()
                .insert(to.clone());
        }
        for (parent, edges) in &edges {
            let mut reported = BTreeSet::new();
            for from in edges.keys() {
                let Some(cycle) = cycle_through(from, edges) else {
                    continue;
                };
                let mut members = cycle.clone();
                members.sort();
                members.dedup();
                if !reported.insert(members) {
                    continue;
                }
                let steps: Vec<String> = cycle
                    .windows(2)
                    .map(|pair| {
                        let key = (parent.clone(), pair[0].clone(), pair[1].clone());
                        format!("{} -> {} ({:?})", pair[0], pair[1], krate.imports[&key])
                    })
                    .collect();
                cycles.push(format!(
                    "{member}: in {}: {}",
                    module_name(parent),
                    steps.join(", ")
                ));
            }
        }
        scanned.insert(member, krate);
    }
    let runtime = &scanned["kvown-runtime"];
    let top = |from: &str, to: &str| (Vec::new(), from.to_string(), to.to_string());
    assert!(
        runtime.imports.contains_key(&top("batch", "cache"))
            && runtime.children[&vec!["alloc".to_string()]].len() > 3,
        "the scan found nothing: it reads the wrong files"
    );
    assert!(cycles.is_empty(), "import cycles:\n{}", cycles.join("\n"));
    for (member, floors) in FLOORS {
        let floor = |module: &str| {
            floors
                .iter()
                .position(|floor| floor.contains(&module))
                .unwrap_or_else(|| panic!("{member}: module `{module}` has no floor in FLOORS"))
        };
        let krate = &scanned[*member];
        for module in &krate.children[&Vec::new()] {
            floor(module);
        }
        for ((parent, from, to), paths) in &krate.imports {
            let owner_link = OWNER_LINKS.iter().any(|&(c, p, f, t, allowed, _)| {
                c == *member
                    && p == "crate"
                    && f == from
                    && t == to
                    && paths.iter().all(|path| path == allowed)
            });
            assert!(
                !parent.is_empty() || floor(from) < floor(to) || owner_link,
                "{member}: `{from}` (floor {}) imports `{to}` (floor {}) through {paths:?}; a \
                 module imports only the floors below it",
                floor(from) + 1,
                floor(to) + 1
            );
        }
    }
    for (at, (krate, parent, from, to, path, why)) in OWNER_LINKS.iter().enumerate() {
        assert!(
            used_links.contains(&at),
            "{krate}: the owner link {parent}: {from} -> {to} through {path} ({why}) is gone or \
             takes other paths: remove it from OWNER_LINKS or keep to the one path"
        );
    }
}
