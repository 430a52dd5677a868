//! A struct whose own lifetime (or a field type's higher-ranked one) is named `'kvown`, the name
//! the generated view and `_mut` accessors would otherwise give their borrow: they pick another.

#[kvown::guarded]
pub struct Req<'kvown, 'kvown_> {
    #[owned_by(fill)]
    name: &'kvown str,
    #[owned_by(fill)]
    pick: for<'kvown__> fn(&'kvown__ str) -> &'kvown__ str,
    tag: &'kvown_ str,
}

fn first(s: &str) -> &str {
    &s[..1]
}

#[kvown::owner]
pub fn fill<'a>(req: &mut Req<'a, '_>, name: &'a str) {
    *req.name_mut(owner) = name;
    req.set_pick(owner, first);
}

#[test]
fn compiles_and_runs() {
    let mut req = Req::from(ReqInit {
        name: "",
        pick: |s| s,
        tag: "t",
    });
    fill(&mut req, "kv");
    let view = req.fields_mut();
    *view.tag = "u";
    assert_eq!(((req.pick())(req.name()), req.tag), ("k", "u"));
}
