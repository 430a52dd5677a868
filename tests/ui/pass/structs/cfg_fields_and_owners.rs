//! `#[cfg]` on guarded fields, on plain fields and on owners: everything generated for a
//! compiled-out field or owner is compiled out with it.

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
}

#[kvown::owner]
pub fn alloc(req: &mut Req) {
    req.set_len(owner, 1);
    #[cfg(any())]
    req.set_traced(owner, 1);
    req.set_pages(owner, 2);
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

fn main() {
    let mut req = Req::default();
    alloc(&mut req);
    assert_eq!((req.len(), req.pages()), (1, 2));
    let _ = Req::from(ReqInit { len: 0, pages: 0 });
}
