//! Delegation shows in signatures: a helper takes the capability, bounded by the field's owner
//! trait (`&impl ReqLenOwner`; several fields: `&(impl ReqLenOwner + ReqCapOwner)`; or a named
//! generic). Helpers chain: one helper hands the capability to another.

#[kvown::guarded]
#[derive(Default)]
pub struct Req {
    #[owned_by(grow, reserve)]
    len: usize,
    #[owned_by(grow)]
    cap: usize,
}

fn bump_len(req: &mut Req, owner: &impl ReqLenOwner) {
    *req.len_mut(owner) += 1;
}

fn grow_both(req: &mut Req, owner: &(impl ReqLenOwner + ReqCapOwner)) {
    bump_len(req, owner);
    let cap = req.cap().max(1) * 2;
    req.set_cap(owner, cap);
}

fn set_len_generic<O: ReqLenOwner>(req: &mut Req, owner: &O, len: usize) {
    req.set_len(owner, len);
}

#[kvown::owner]
pub fn grow(req: &mut Req) {
    grow_both(req, owner);
}

#[kvown::owner]
pub fn reserve(req: &mut Req, len: usize) {
    set_len_generic(req, owner, len);
    bump_len(req, owner);
}

#[test]
fn compiles_and_runs() {
    let mut req = Req::default();
    grow(&mut req);
    grow(&mut req);
    assert_eq!((req.len(), req.cap()), (2, 4));
    reserve(&mut req, 10);
    assert_eq!(req.len(), 11);
}
