//! The token cannot be moved out of the borrow the body sees.

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
pub fn take(req: &mut Req) {
    let _ = req;
    let token: take = *owner;
    drop(token);
}

fn main() {}
