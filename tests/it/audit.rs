//! The audit register: the ownership table of structs defined here, its printed form, the diff
//! messages of `assert_matches`, and the syntactic write counts (direct writes and delegations).

use kvown::audit::{AuditError, AuditTable};

#[kvown::guarded]
#[derive(Default)]
pub struct AuditReq {
    #[owned_by(alloc, sched::Sched::decode, release)]
    len: usize,
    #[owned_by(alloc)]
    cap: usize,
}

#[kvown::owner]
pub fn alloc(req: &mut AuditReq) {
    req.set_len(owner, 1);
    let grow = |r: &mut AuditReq| *r.len_mut(owner) += 1;
    grow(req);
    req.set_cap(owner, 8);
}

#[kvown::owner]
pub fn release(req: &mut AuditReq) {
    req.set_len(owner, 0);
}

/// Writes on an owner's behalf: not an owner site itself; the owner's row counts the delegation.
fn bump(req: &mut AuditReq, owner: &impl AuditReqLenOwner) {
    *req.len_mut(owner) += 1;
}

pub mod sched {
    use super::AuditReq;

    pub struct Sched;

    #[kvown::owners]
    impl Sched {
        #[owner]
        pub fn decode(req: &mut AuditReq) {
            super::bump(req, owner);
            super::bump(req, owner);
        }

        /// Compiled out inside the impl, where `#[owners]` sees the `#[cfg]` before rustc
        /// strips the method: its hidden module and token must go with it (its body calls a
        /// setter that does not exist, so this binary would not build otherwise).
        #[owner]
        #[cfg(any())]
        pub fn compiled_out(req: &mut AuditReq) {
            req.set_missing(owner, 9);
        }

        /// The same, with the `#[cfg]` from a `#[cfg_attr]`.
        #[owner]
        #[cfg_attr(all(), cfg(any()))]
        pub fn gated_out(req: &mut AuditReq) {
            req.set_missing(owner, 9);
        }
    }
}

/// Its owner shares its name with [`alloc`] above: the declared path picks the site in
/// `pipeline`.
#[kvown::guarded]
#[derive(Default)]
pub struct PipelineReq {
    #[owned_by(pipeline::alloc)]
    len: usize,
}

impl PipelineReq {
    /// Writes on its caller's behalf, called as a method: the caller's row counts a delegation.
    fn grow(&mut self, by: usize, owner: &impl PipelineReqLenOwner) {
        *self.len_mut(owner) += by;
    }
}

pub mod pipeline {
    use super::PipelineReq;

    /// Three writes (one with the capability in parentheses), one delegation by a method call,
    /// and a read, which counts as neither.
    #[kvown::owner]
    #[allow(unused_parens)]
    pub fn alloc(req: &mut PipelineReq) {
        req.set_len(owner, 1);
        req.set_len((owner), 2);
        req.set_len(owner, req.len() + 1);
        req.grow(1, owner);
    }
}

const EXPECTED: &[(&str, &str, &str, u32)] = &[
    ("AuditReq", "cap", "alloc", 1),
    ("AuditReq", "len", "Sched::decode", 0),
    ("AuditReq", "len", "alloc", 2),
    ("AuditReq", "len", "release", 1),
];

fn table() -> AuditTable {
    AuditTable::collect()
        .expect("this binary defines guarded structs")
        .of_structs(&["AuditReq"])
}

/// The 1-based line of the first line of this file containing `needle`.
fn line_of(needle: &str) -> usize {
    include_str!("audit.rs")
        .lines()
        .position(|l| l.contains(needle))
        .expect("needle in this file")
        + 1
}

#[test]
fn the_owners_behave() {
    let mut req = AuditReq::default();
    alloc(&mut req);
    sched::Sched::decode(&mut req);
    assert_eq!((req.len(), req.cap()), (4, 8));
    release(&mut req);
    assert_eq!(req.len(), 0);
}

#[test]
fn table_lists_every_owner_site_with_write_counts() {
    let table = table();
    table.assert_matches(EXPECTED);
    let rows: Vec<(&str, &str, u32, u32, &str)> = table
        .rows()
        .iter()
        .map(|r| (r.field, r.owner, r.writes, r.delegations, r.owner_module))
        .collect();
    assert_eq!(
        rows,
        [
            ("cap", "alloc", 1, 0, "it::audit"),
            ("len", "Sched::decode", 0, 2, "it::audit::sched"),
            ("len", "alloc", 2, 0, "it::audit"),
            ("len", "release", 1, 0, "it::audit"),
        ]
    );
}

#[test]
fn table_prints_readably() {
    let file = file!();
    let site = |needle| format!("{file}:{}", line_of(needle));
    let (alloc, decode, release) = (
        site("pub fn alloc("),
        site("pub fn decode("),
        site("pub fn release("),
    );
    let w = alloc.len();
    let expected = format!(
        "\
| struct::field | owner         | writes | delegated | module           | site{pad} |
| ------------- | ------------- | ------ | --------- | ---------------- | {rule} |
| AuditReq::cap | alloc         |      1 |         0 | it::audit        | {alloc:<w$} |
| AuditReq::len | Sched::decode |      0 |         2 | it::audit::sched | {decode:<w$} |
| AuditReq::len | alloc         |      2 |         0 | it::audit        | {alloc:<w$} |
| AuditReq::len | release       |      1 |         0 | it::audit        | {release:<w$} |
",
        pad = " ".repeat(w - 4),
        rule = "-".repeat(w),
    );
    assert_eq!(table().to_string(), expected);
}

#[test]
fn diff_reports_added_removed_and_recounted_sites() {
    let table = table();
    let stale: &[(&str, &str, &str, u32)] = &[
        ("AuditReq", "cap", "alloc", 1),
        ("AuditReq", "len", "alloc", 1),
        ("AuditReq", "len", "release", 1),
        ("AuditReq", "len", "retract", 1),
    ];
    let report = table.diff(stale).unwrap_err();
    assert_eq!(
        report,
        "  added:     AuditReq::len by Sched::decode (0 writes)\n\
         \x20 recounted: AuditReq::len by alloc: expected 1 writes, found 2\n\
         \x20 removed:   AuditReq::len by retract (1 writes expected)\n"
    );
    assert_eq!(table.diff(EXPECTED), Ok(()));
}

#[test]
#[should_panic(expected = "ownership table changed")]
fn assert_matches_panics_on_a_changed_table() {
    table().assert_matches(&[("AuditReq", "len", "alloc", 2)]);
}

#[test]
fn structs_not_named_are_ignored_and_an_empty_register_is_an_error() {
    let full = AuditTable::collect().unwrap();
    full.assert_matches(EXPECTED);
    assert!(full.rows_of("AuditReq").count() == 4);
    assert!(
        AuditError::Empty
            .to_string()
            .contains("audit register is empty")
    );
}

#[test]
fn a_declared_path_picks_its_owner_among_sites_of_the_same_name() {
    let table = AuditTable::collect().unwrap().of_structs(&["PipelineReq"]);
    let rows = table.rows();
    assert_eq!(rows.len(), 1, "{table}");
    assert_eq!(rows[0].owner, "alloc");
    assert_eq!(rows[0].owner_module, "it::audit::pipeline");
    assert_eq!(
        rows[0].writes, 3,
        "pipeline::alloc's writes, not the root alloc's"
    );
    assert_eq!(
        rows[0].delegations, 1,
        "the method call that passes the capability"
    );
    let mut req = PipelineReq::default();
    pipeline::alloc(&mut req);
    assert_eq!(req.len(), 4);
}

/// A raw-identifier field, registered and counted under its plain name.
#[kvown::guarded]
pub struct RawReq {
    #[owned_by(raw_alloc)]
    r#type: usize,
}

#[kvown::owner]
pub fn raw_alloc(req: &mut RawReq) {
    req.set_type(owner, 1);
    *req.type_mut(owner) += 1;
}

#[test]
fn a_raw_field_is_registered_and_counted_by_its_plain_name() {
    AuditTable::collect()
        .unwrap()
        .of_structs(&["RawReq"])
        .assert_matches(&[("RawReq", "type", "raw_alloc", 2)]);
}

/// Writes the count must see: inside a std macro, inside a local `macro_rules!`, through a
/// rebound capability and in UFCS form.
#[kvown::guarded]
#[derive(Default)]
pub struct MacroReq {
    #[owned_by(macro_alloc)]
    len: usize,
}

#[kvown::owner]
pub fn macro_alloc(req: &mut MacroReq) {
    assert!({
        req.set_len(owner, 1);
        true
    });
    macro_rules! bump {
        () => {
            *req.len_mut(owner) += 1
        };
    }
    bump!();
    let cap = owner;
    req.set_len(cap, req.len() + 1);
    MacroReq::set_len(req, owner, req.len() + 1);
}

#[test]
fn writes_in_macros_and_through_a_rebound_capability_are_counted() {
    let mut req = MacroReq::default();
    macro_alloc(&mut req);
    assert_eq!(req.len(), 4);
    let table = AuditTable::collect().unwrap().of_structs(&["MacroReq"]);
    table.assert_matches(&[("MacroReq", "len", "macro_alloc", 4)]);
    assert_eq!(table.rows()[0].delegations, 0, "{table}");
}

/// A helper `fn` nested in an owner's body takes its own `owner` parameter (it cannot capture the
/// body's): its writes are delegated ones, not the owner's.
#[kvown::guarded]
#[derive(Default)]
pub struct NestReq {
    #[owned_by(nest_alloc)]
    len: usize,
}

#[kvown::owner]
pub fn nest_alloc(req: &mut NestReq) {
    fn bump(req: &mut NestReq, owner: &impl NestReqLenOwner) {
        *req.len_mut(owner) += 1;
        *req.len_mut(owner) += 1;
    }
    req.set_len(owner, 1);
    bump(req, owner);
}

#[test]
fn writes_in_items_nested_in_an_owner_body_are_not_counted_as_its_own() {
    let mut req = NestReq::default();
    nest_alloc(&mut req);
    assert_eq!(req.len(), 3);
    let table = AuditTable::collect().unwrap().of_structs(&["NestReq"]);
    table.assert_matches(&[("NestReq", "len", "nest_alloc", 1)]);
    assert_eq!(table.rows()[0].delegations, 1, "{table}");
}

/// Listed through a renamed import: the row is the site the import names (`grow` is
/// `renamed::alloc`), with its writes, not an owner without a site.
#[kvown::guarded]
#[derive(Default)]
pub struct RenamedReq {
    #[owned_by(grow)]
    len: usize,
}

use renamed::alloc as grow;

pub mod renamed {
    #[kvown::owner]
    pub fn alloc(req: &mut super::RenamedReq) {
        req.set_len(owner, 5);
        req.set_len(owner, req.len() + 1);
    }
}

/// Listed through a plain import, in a crate with three owners named `alloc`: the row is the
/// imported one only (which writes no `pages`).
pub mod imported {
    use super::pipeline::alloc;

    #[kvown::guarded]
    #[derive(Default)]
    pub struct ImportedReq {
        #[owned_by(alloc)]
        pages: usize,
    }

    #[kvown::owner]
    pub fn unrelated(_req: &mut ImportedReq) {}
}

#[test]
fn an_owner_listed_through_an_import_is_the_site_it_names() {
    let mut req = RenamedReq::default();
    grow(&mut req);
    assert_eq!(req.len(), 6);
    let table = AuditTable::collect()
        .unwrap()
        .of_structs(&["RenamedReq", "ImportedReq"]);
    let rows: Vec<(&str, &str, u32, &str)> = table
        .rows()
        .iter()
        .map(|r| (r.struct_name, r.owner, r.writes, r.owner_module))
        .collect();
    assert_eq!(
        rows,
        [
            ("RenamedReq", "alloc", 2, "it::audit::renamed"),
            ("ImportedReq", "alloc", 0, "it::audit::pipeline"),
        ],
        "{table}"
    );
}

#[test]
fn the_audit_table_macro_gives_the_calling_crates_rows_only() {
    let own = kvown::audit_table!().unwrap();
    assert!(
        own.rows()
            .iter()
            .all(|r| r.struct_module.starts_with("it::audit"))
    );
    own.assert_matches(EXPECTED);
    let all = AuditTable::collect().unwrap();
    assert!(
        all.rows().len() > own.rows().len(),
        "kvown's runtime registers rows too"
    );
    let runtime = kvown::audit_table!("kvown_runtime").unwrap();
    assert!(
        runtime
            .rows()
            .iter()
            .all(|r| r.struct_module.starts_with("kvown_runtime"))
    );
}

#[test]
fn a_crate_without_guarded_fields_is_an_error_that_names_the_linked_crates() {
    let error = kvown::audit_table!("no_such_crate").unwrap_err();
    let AuditError::NoneInCrate { crate_name, linked } = &error else {
        panic!("{error}");
    };
    assert_eq!(crate_name, "no_such_crate");
    assert!(
        linked.split(", ").any(|name| name == "it") && linked.contains("kvown_runtime"),
        "{linked}"
    );
    assert!(
        error
            .to_string()
            .contains("kvown::audit_table!(\"my_crate\")")
    );
}
