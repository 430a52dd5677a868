//! An owned field cannot be `pub`: anyone could write it.

#[kvown::guarded]
pub struct Req {
    #[owned_by(alloc)]
    pub len: usize,
}

#[kvown::owner]
pub fn alloc(req: &mut Req) {
    req.set_len(owner, 1);
}

fn main() {}
