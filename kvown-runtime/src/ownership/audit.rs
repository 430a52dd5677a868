//! The audit register: every guarded field and every owner site, collected at link time.
//!
//! `#[guarded]` registers one [`GuardedField`] per `#[owned_by]` field and `#[owner]` /
//! `#[owners]` register one [`OwnerSite`] per owner body, with a syntactic count of the guarded
//! writes (`set_<field>(owner, ..)` / `<field>_mut(owner)` calls) it makes. [`AuditTable`] joins
//! the two into the ownership table, the compile-time successor of sglang's `_OWNER_SITES` test:
//! the compiler already rejects writes from non-owners, and a snapshot of this table catches an
//! owner site that was added, removed or changed its number of writes.

use std::any::TypeId;
use std::collections::BTreeMap;
use std::fmt;

/// A field declared `#[owned_by(..)]` in a `#[guarded]` struct. Registered by the macro.
#[derive(Debug)]
pub struct GuardedField {
    /// Name of the struct, as written.
    pub struct_name: &'static str,
    /// Name of the field.
    pub field: &'static str,
    /// Owner paths as written in `#[owned_by(..)]`, e.g. `alloc_for_decode` or `Batch::retract`.
    pub owners: &'static [&'static str],
    /// The capability token type each of `owners` resolves to, in the same order: what joins a
    /// declared owner to its [`OwnerSite`], whatever path or import names it.
    pub owner_tokens: &'static [fn() -> TypeId],
    /// `module_path!()` where the struct expansion lives (the sealed module is trimmed on read).
    pub module: &'static str,
    /// Source file of the struct.
    pub file: &'static str,
    /// Source line of the field.
    pub line: u32,
}

/// How many guarded writes an owner body makes to one field (by field name).
#[derive(Debug)]
pub struct FieldWrites {
    /// Field name.
    pub field: &'static str,
    /// Number of `set_<field>(owner, ..)` and `<field>_mut(owner)` calls in the body.
    pub count: u32,
}

/// A function or method marked `#[owner]`. Registered by the macro.
#[derive(Debug)]
pub struct OwnerSite {
    /// `fn_name` for a free function, `Type::method` for a method.
    pub owner: &'static str,
    /// The owner's capability token type.
    pub token: fn() -> TypeId,
    /// `module_path!()` where the owner expansion lives (the sealed module is trimmed on read).
    pub module: &'static str,
    /// Source file of the owner.
    pub file: &'static str,
    /// Source line of the owner's name.
    pub line: u32,
    /// Guarded writes made directly in the body, per field name.
    pub writes: &'static [FieldWrites],
    /// Calls that pass the capability on to a helper (delegated writes).
    pub delegations: u32,
}

inventory::collect!(GuardedField);
inventory::collect!(OwnerSite);

/// Prefixes of the modules the macros generate (`sealed_Req`, `sealed_fn_alloc`); the macros
/// register `module_path!()` from inside them, and this segment is trimmed on read.
const SEALED_MODULE_PREFIX: &str = "sealed_";

fn user_module(module: &'static str) -> &'static str {
    match module.rsplit_once("::") {
        Some((parent, last)) if last.starts_with(SEALED_MODULE_PREFIX) => parent,
        _ => module,
    }
}

/// The name an owner path designates: `crate::a::f` -> `f`, `a::Batch::retract` -> `Batch::retract`.
fn owner_name(path: &str) -> &str {
    let mut segments = path.rsplit("::");
    let last = segments.next().unwrap_or(path);
    match segments.next() {
        Some(parent) if parent.starts_with(|c: char| c.is_ascii_uppercase()) => {
            &path[path.len() - last.len() - 2 - parent.len()..]
        }
        _ => last,
    }
}

/// The crate segment of a module path: `my_crate::a::b` -> `my_crate`.
fn crate_of(module: &str) -> &str {
    module.split("::").next().unwrap_or(module)
}

/// One row of the ownership table: an owner site of one guarded field.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct AuditRow {
    /// Module that declares the struct (`crate_name::path`).
    pub struct_module: &'static str,
    /// Struct that declares the field.
    pub struct_name: &'static str,
    /// The guarded field.
    pub field: &'static str,
    /// Owner name: `fn_name` or `Type::method`, as the site names itself (an owner listed
    /// through a renamed import shows its own name); the declared path's last name(s) when there
    /// is no site.
    pub owner: &'static str,
    /// Module of the owner site; `None` when a declared owner has no registered site.
    pub owner_module: Option<&'static str>,
    /// Guarded writes of this field in the owner's body.
    pub writes: u32,
    /// Calls in the owner's body that hand its capability to a helper (which may write any
    /// field its bound allows); the same for every field the owner owns.
    pub delegations: u32,
    /// `file:line` of the owner site, or of the field when there is no site.
    pub location: String,
}

/// An expected row for [`AuditTable::assert_matches`]: `(struct, field, owner, writes)`.
pub type ExpectedSite<'a> = (&'a str, &'a str, &'a str, u32);

/// Why the register could not produce a table.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AuditError {
    /// Nothing registered: the binary links no crate with guarded structs.
    #[error(
        "the kvown audit register is empty: this binary links no #[guarded] struct. A test \
         binary sees only the crates it references; add `use the_crate as _;` (or call into it) \
         so its registrations are linked"
    )]
    Empty,
    /// The register holds guarded fields, none of them declared in the crate asked for.
    #[error(
        "the kvown audit register has no #[guarded] struct of crate `{crate_name}` (crates with \
         guarded structs in this binary: {linked}). `kvown::audit_table!()` audits the crate it \
         is written in; from an integration test, name the library: \
         `kvown::audit_table!(\"my_crate\")`, and link it (`use my_crate as _;`)"
    )]
    NoneInCrate {
        /// The crate asked for, as `module_path!()` spells it.
        crate_name: String,
        /// The crates that did register guarded fields, comma-separated.
        linked: String,
    },
}

/// The ownership table of every guarded field linked into this binary.
#[derive(Debug, Clone)]
pub struct AuditTable {
    rows: Vec<AuditRow>,
}

impl AuditTable {
    /// Collects the table from the link-time register: every linked crate's guarded fields,
    /// kvown's own runtime included. For the calling crate's table alone, use
    /// `kvown::audit_table!()` ([`AuditTable::collect_crate`]).
    ///
    /// Fails with [`AuditError::Empty`] when no guarded field is registered, so a test that
    /// forgot to link the crate under audit fails instead of comparing two empty tables.
    pub fn collect() -> Result<Self, AuditError> {
        let fields: Vec<&GuardedField> = inventory::iter::<GuardedField>.into_iter().collect();
        if fields.is_empty() {
            return Err(AuditError::Empty);
        }
        let sites: Vec<&OwnerSite> = inventory::iter::<OwnerSite>.into_iter().collect();
        let mut rows = Vec::new();
        for field in fields {
            let struct_module = user_module(field.module);
            for (&declared, token) in field.owners.iter().zip(field.owner_tokens) {
                // The site whose token is the declared owner's: exact, whether the path names
                // the owner's module, a re-export or a renamed import.
                let token = token();
                let matching: Vec<&&OwnerSite> = sites
                    .iter()
                    .filter(|site| (site.token)() == token)
                    .collect();
                if matching.is_empty() {
                    rows.push(AuditRow {
                        struct_module,
                        struct_name: field.struct_name,
                        field: field.field,
                        owner: owner_name(declared),
                        owner_module: None,
                        writes: 0,
                        delegations: 0,
                        location: format!("{}:{}", field.file, field.line),
                    });
                }
                for site in matching {
                    let writes = site
                        .writes
                        .iter()
                        .filter(|w| w.field == field.field)
                        .map(|w| w.count)
                        .sum();
                    rows.push(AuditRow {
                        struct_module,
                        struct_name: field.struct_name,
                        field: field.field,
                        owner: site.owner,
                        owner_module: Some(user_module(site.module)),
                        writes,
                        delegations: site.delegations,
                        location: format!("{}:{}", site.file, site.line),
                    });
                }
            }
        }
        rows.sort();
        rows.dedup();
        Ok(AuditTable { rows })
    }

    /// The table of one crate: [`AuditTable::collect`] restricted to the structs declared in
    /// the crate that `crate_or_module` names (`"ledger"`, or a `module_path!()` such as
    /// `"ledger::accounts"`). What `kvown::audit_table!()` returns for the calling crate.
    ///
    /// Fails with [`AuditError::NoneInCrate`] when that crate registered nothing (an
    /// integration test auditing itself instead of its library, say), so a table is never
    /// silently empty.
    pub fn collect_crate(crate_or_module: &str) -> Result<Self, AuditError> {
        let crate_name = crate_of(crate_or_module);
        let all = Self::collect()?;
        let table = all.of_crate(crate_name);
        if table.rows.is_empty() {
            let mut linked: Vec<&str> =
                all.rows.iter().map(|r| crate_of(r.struct_module)).collect();
            linked.dedup();
            return Err(AuditError::NoneInCrate {
                crate_name: crate_name.to_string(),
                linked: linked.join(", "),
            });
        }
        Ok(table)
    }

    /// The rows, sorted by struct, field, owner.
    pub fn rows(&self) -> &[AuditRow] {
        &self.rows
    }

    /// The table restricted to the named structs (for a snapshot that other crates' structs,
    /// linked into the same binary, do not disturb).
    pub fn of_structs(&self, struct_names: &[&str]) -> AuditTable {
        AuditTable {
            rows: self
                .rows
                .iter()
                .filter(|r| struct_names.contains(&r.struct_name))
                .cloned()
                .collect(),
        }
    }

    /// The table restricted to structs declared in crate `crate_name` (as `module_path!()`
    /// spells it: `my_crate`), so two crates' structs of the same name are told apart.
    pub fn of_crate(&self, crate_name: &str) -> AuditTable {
        AuditTable {
            rows: self
                .rows
                .iter()
                .filter(|r| crate_of(r.struct_module) == crate_name)
                .cloned()
                .collect(),
        }
    }

    /// The rows of one struct.
    pub fn rows_of<'a>(&'a self, struct_name: &'a str) -> impl Iterator<Item = &'a AuditRow> {
        self.rows
            .iter()
            .filter(move |r| r.struct_name == struct_name)
    }

    /// Compares the rows of the structs named in `expected` with `expected` and panics with
    /// the owner sites that were added, removed or recounted.
    ///
    /// Structs not named in `expected` are ignored, so a crate can audit its own structs
    /// while other crates' registrations are linked into the same binary.
    #[track_caller]
    pub fn assert_matches(&self, expected: &[ExpectedSite<'_>]) {
        if let Err(diff) = self.diff(expected) {
            panic!("ownership table changed:\n{diff}\ncurrent table:\n{self}");
        }
    }

    /// Like [`AuditTable::assert_matches`], returning the difference as text instead of panicking.
    pub fn diff(&self, expected: &[ExpectedSite<'_>]) -> Result<(), String> {
        let audited: Vec<&str> = expected.iter().map(|e| e.0).collect();
        let mut want: BTreeMap<(&str, &str, &str), u32> = BTreeMap::new();
        for &(s, f, o, n) in expected {
            *want.entry((s, f, o)).or_default() += n;
        }
        let mut have: BTreeMap<(&str, &str, &str), u32> = BTreeMap::new();
        for row in self
            .rows
            .iter()
            .filter(|r| audited.contains(&r.struct_name))
        {
            *have
                .entry((row.struct_name, row.field, row.owner))
                .or_default() += row.writes;
        }
        let mut report = String::new();
        for (key, n) in &have {
            match want.get(key) {
                None => report.push_str(&format!(
                    "  added:     {}::{} by {} ({} writes)\n",
                    key.0, key.1, key.2, n
                )),
                Some(m) if m != n => report.push_str(&format!(
                    "  recounted: {}::{} by {}: expected {} writes, found {}\n",
                    key.0, key.1, key.2, m, n
                )),
                Some(_) => {}
            }
        }
        for (key, n) in &want {
            if !have.contains_key(key) {
                report.push_str(&format!(
                    "  removed:   {}::{} by {} ({} writes expected)\n",
                    key.0, key.1, key.2, n
                ));
            }
        }
        if report.is_empty() {
            Ok(())
        } else {
            Err(report)
        }
    }
}

impl fmt::Display for AuditTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const COLUMNS: usize = 6;
        const RIGHT_ALIGNED: [bool; COLUMNS] = [false, false, true, true, false, false];
        let header = [
            "struct::field",
            "owner",
            "writes",
            "delegated",
            "module",
            "site",
        ];
        let body: Vec<[String; COLUMNS]> = self
            .rows
            .iter()
            .map(|r| {
                [
                    format!("{}::{}", r.struct_name, r.field),
                    r.owner.to_string(),
                    r.writes.to_string(),
                    r.delegations.to_string(),
                    r.owner_module.unwrap_or("(no site)").to_string(),
                    r.location.clone(),
                ]
            })
            .collect();
        let mut widths = header.map(str::len);
        for row in &body {
            for (w, cell) in widths.iter_mut().zip(row) {
                *w = (*w).max(cell.len());
            }
        }
        let line = |f: &mut fmt::Formatter<'_>, cells: [&str; COLUMNS]| -> fmt::Result {
            for (i, cell) in cells.iter().enumerate() {
                let width = widths[i];
                if RIGHT_ALIGNED[i] {
                    write!(f, "| {cell:>width$} ")?;
                } else {
                    write!(f, "| {cell:<width$} ")?;
                }
            }
            writeln!(f, "|")
        };
        line(f, header)?;
        let rule = widths.map(|w| "-".repeat(w));
        line(f, rule.each_ref().map(String::as_str))?;
        for row in &body {
            line(f, row.each_ref().map(String::as_str))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_names_strip_modules_but_keep_types() {
        assert_eq!(owner_name("alloc_for_decode"), "alloc_for_decode");
        assert_eq!(
            owner_name("crate::batch::alloc_for_decode"),
            "alloc_for_decode"
        );
        assert_eq!(owner_name("Batch::retract"), "Batch::retract");
        assert_eq!(owner_name("super::batch::Batch::retract"), "Batch::retract");
    }

    #[test]
    fn sealed_module_segment_is_trimmed() {
        assert_eq!(user_module("a::b::sealed_fn_f"), "a::b");
        assert_eq!(user_module("a::b::sealed_Req"), "a::b");
        assert_eq!(user_module("a::b"), "a::b");
    }
}
