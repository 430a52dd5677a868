//! Implementing the per-field owner trait for one's own type: the trait is sealed.

#[kvown::guarded]
pub struct Req {
    #[owned_by(alloc)]
    len: usize,
}

#[kvown::owner]
pub fn alloc(req: &mut Req) {
    req.set_len(owner, 1);
}

struct Intruder;

impl ReqLenOwner for Intruder {}

fn forge(req: &mut Req) {
    req.set_len(&Intruder, 99);
}

fn main() {}
