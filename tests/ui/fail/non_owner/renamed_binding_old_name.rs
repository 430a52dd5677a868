//! With `#[owner(token = cap)]` the capability is `cap`; `owner` is not bound.

#[kvown::guarded]
pub struct Req {
    #[owned_by(alloc)]
    len: usize,
}

#[kvown::owner(token = cap)]
pub fn alloc(req: &mut Req) {
    req.set_len(cap, 1);
    req.set_len(owner, 2);
}

fn main() {}
