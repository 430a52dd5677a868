//! The audit register: every guarded struct, its owned fields and their owner sites, collected
//! at link time.
//!
//! `#[guarded]` registers one [`GuardedStruct`] per struct, listing its `#[owned_by]` fields, and
//! each field names the [`OwnerSite`]s of its owners: `#[owner]` / `#[owners]` attach a site to
//! each owner's capability token, with a syntactic count of the guarded writes
//! (`set_<field>(owner, ..)` / `<field>_mut(owner)` calls) its body makes. [`AuditTable`] flattens
//! them into the ownership table, the compile-time successor of sglang's `_OWNER_SITES` test: the
//! compiler already rejects writes from non-owners, and a snapshot of this table catches an owner
//! site that was added, removed or changed its number of writes.

use std::collections::BTreeMap;
use std::fmt;

/// A `#[guarded]` struct with its owned fields. Registered by the macro, one per struct.
#[derive(Debug)]
pub struct GuardedStruct {
    /// Name of the struct, as written.
    pub name: &'static str,
    /// `module_path!()` where the struct expansion lives (the sealed module is trimmed on read).
    pub module: &'static str,
    /// Source file of the struct.
    pub file: &'static str,
    /// The fields declared `#[owned_by(..)]` (those compiled in).
    pub fields: &'static [GuardedField],
}

impl GuardedStruct {
    /// A struct's registration, as the macro writes it.
    pub const fn new(
        name: &'static str,
        module: &'static str,
        file: &'static str,
        fields: &'static [GuardedField],
    ) -> Self {
        GuardedStruct {
            name,
            module,
            file,
            fields,
        }
    }
}

/// A field declared `#[owned_by(..)]` in a `#[guarded]` struct.
#[derive(Debug)]
pub struct GuardedField {
    /// Name of the field.
    pub name: &'static str,
    /// Source line of the field.
    pub line: u32,
    /// The sites of its owners, in the order `#[owned_by(..)]` lists them, whatever path,
    /// re-export or renamed import names them there.
    pub owners: &'static [&'static OwnerSite],
}

impl GuardedField {
    /// A field entry, as the macro writes it.
    pub const fn new(name: &'static str, line: u32, owners: &'static [&'static OwnerSite]) -> Self {
        GuardedField { name, line, owners }
    }
}

/// How many guarded writes an owner body makes to one field (by field name).
#[derive(Debug)]
pub struct FieldWrites {
    /// Field name.
    pub field: &'static str,
    /// Number of `set_<field>(owner, ..)` and `<field>_mut(owner)` calls in the body.
    pub count: u32,
}

impl FieldWrites {
    /// A write count, as the macro writes it.
    pub const fn new(field: &'static str, count: u32) -> Self {
        FieldWrites { field, count }
    }
}

/// A function or method marked `#[owner]`: what its capability token knows of it.
#[derive(Debug)]
pub struct OwnerSite {
    /// `fn_name` for a free function, `Type::method` for a method.
    pub owner: &'static str,
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

impl OwnerSite {
    /// An owner's site, as the macro writes it.
    pub const fn new(
        owner: &'static str,
        module: &'static str,
        file: &'static str,
        line: u32,
        writes: &'static [FieldWrites],
        delegations: u32,
    ) -> Self {
        OwnerSite {
            owner,
            module,
            file,
            line,
            writes,
            delegations,
        }
    }
}

inventory::collect!(GuardedStruct);

/// Prefixes of the modules the macros generate (`sealed_Req`, `sealed_fn_alloc`); the macros
/// register `module_path!()` from inside them, and this segment is trimmed on read.
const SEALED_MODULE_PREFIX: &str = "sealed_";

fn user_module(module: &'static str) -> &'static str {
    match module.rsplit_once("::") {
        Some((parent, last)) if last.starts_with(SEALED_MODULE_PREFIX) => parent,
        _ => module,
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
    /// through a renamed import shows its own name).
    pub owner: &'static str,
    /// Module of the owner site.
    pub owner_module: &'static str,
    /// Guarded writes of this field in the owner's body.
    pub writes: u32,
    /// Calls in the owner's body that hand its capability to a helper (which may write any
    /// field its bound allows); the same for every field the owner owns.
    pub delegations: u32,
    /// `file:line` of the owner site.
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
        let structs: Vec<&GuardedStruct> = inventory::iter::<GuardedStruct>.into_iter().collect();
        if structs.iter().all(|guarded| guarded.fields.is_empty()) {
            return Err(AuditError::Empty);
        }
        let mut rows = Vec::new();
        for guarded in structs {
            let struct_module = user_module(guarded.module);
            for field in guarded.fields {
                for site in field.owners {
                    let writes = site
                        .writes
                        .iter()
                        .filter(|w| w.field == field.name)
                        .map(|w| w.count)
                        .sum();
                    rows.push(AuditRow {
                        struct_module,
                        struct_name: guarded.name,
                        field: field.name,
                        owner: site.owner,
                        owner_module: user_module(site.module),
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
                    r.owner_module.to_string(),
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
    fn sealed_module_segment_is_trimmed() {
        assert_eq!(user_module("a::b::sealed_fn_f"), "a::b");
        assert_eq!(user_module("a::b::sealed_Req"), "a::b");
        assert_eq!(user_module("a::b"), "a::b");
    }
}
