//! The capability cannot be returned: it borrows a local of the owner's frame.

#[kvown::guarded]
pub struct Req {
    #[owned_by(alloc)]
    len: usize,
}

#[kvown::owner]
pub fn alloc(req: &mut Req) {
    req.set_len(owner, 1);
}

#[kvown::owner(token = cap)]
pub fn hand_out() -> &'static hand_out {
    cap
}

fn main() {}
