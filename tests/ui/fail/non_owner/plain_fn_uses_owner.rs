//! A plain function has no capability: `owner` is not in scope.

#[kvown::guarded]
pub struct Req {
    #[owned_by(alloc)]
    len: usize,
}

#[kvown::owner]
pub fn alloc(req: &mut Req) {
    req.set_len(owner, 1);
}

pub fn prepare(req: &mut Req) {
    req.set_len(owner, 2);
}

fn main() {}
