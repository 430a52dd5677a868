//! `#[cfg]` on guarded fields, on plain fields and on owners: everything generated for a
//! compiled-out field or owner is compiled out with it, also when the `#[cfg]` comes from a
//! `#[cfg_attr(predicate, cfg(..))]`.

// `cfg(all())` and `cfg(any())` are the always-on and always-off predicates under test.
#![allow(clippy::non_minimal_cfg)]

#[kvown::guarded]
#[derive(Debug, Default)]
pub struct Req {
    #[owned_by(alloc)]
    len: usize,
    #[cfg(any())]
    #[owned_by(alloc, trace)]
    traced: usize,
    #[cfg(all())]
    #[owned_by(alloc)]
    pages: u32,
    #[cfg(any())]
    debug_note: String,
    #[cfg_attr(all(), cfg(any()))]
    #[owned_by(alloc)]
    gated: u32,
    #[cfg_attr(all(), doc = "kept", cfg_attr(all(), cfg(any())))]
    gated_note: String,
    #[cfg_attr(any(), cfg(any()))]
    #[owned_by(alloc)]
    kept: u8,
}

#[kvown::owner]
pub fn alloc(req: &mut Req) {
    req.set_len(owner, 1);
    #[cfg(any())]
    req.set_traced(owner, 1);
    req.set_pages(owner, 2);
    req.set_kept(owner, 3);
}

#[cfg(any())]
#[kvown::owner]
pub fn trace(req: &mut Req) {
    req.set_traced(owner, 5);
}

#[kvown::owner]
#[cfg(any())]
pub fn also_gone(req: &mut Req) {
    req.set_missing(owner, 5);
}

#[test]
fn compiles_and_runs() {
    let mut req = Req::default();
    alloc(&mut req);
    assert_eq!((req.len(), req.pages()), (1, 2));
    assert_eq!(req.kept(), 3);
    let _ = Req::from(ReqInit {
        len: 0,
        pages: 0,
        kept: 0,
    });
}
