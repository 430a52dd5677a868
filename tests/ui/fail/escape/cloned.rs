//! The token is not `Clone`: code gets only a borrow of it.

#[kvown::guarded]
pub struct Req {
    #[owned_by(alloc)]
    len: usize,
}

#[kvown::owner]
pub fn alloc(req: &mut Req) {
    req.set_len(owner, 1);
}

#[kvown::owner]
pub fn duplicate(req: &mut Req) {
    let copy: alloc = (*owner).clone();
    let _ = (req, copy);
}

fn main() {}
