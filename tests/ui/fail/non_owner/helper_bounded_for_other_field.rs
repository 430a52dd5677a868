//! A helper bounded for field A (`ReqLenOwner`) cannot write field B, even when the owner that
//! calls it owns both.

#[kvown::guarded]
pub struct Req {
    #[owned_by(alloc)]
    len: usize,
    #[owned_by(alloc)]
    cap: usize,
}

fn grow(req: &mut Req, owner: &impl ReqLenOwner) {
    req.set_len(owner, req.len() + 1);
    req.set_cap(owner, req.cap() * 2);
}

#[kvown::owner]
pub fn alloc(req: &mut Req) {
    grow(req, owner);
}

fn main() {}
