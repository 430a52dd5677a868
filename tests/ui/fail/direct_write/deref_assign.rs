//! `*x = ..` through a mutable borrow of a guarded field.
#[kvown::guarded]
#[derive(Default)]
pub struct Req {
    #[owned_by(alloc)]
    len: usize,
    #[owned_by(alloc)]
    pair: (u32, u32),
    note: u8,
}

#[kvown::owner]
pub fn alloc(req: &mut Req) {
    req.set_len(owner, 1);
}

fn through_ref(req: &mut Req) {
    let len = &mut req.len;
    *len = 3;
}

fn main() {}
