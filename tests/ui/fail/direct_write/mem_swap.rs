//! `mem::swap` of a guarded field with a local.
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

fn swap(req: &mut Req) {
    let mut other = 9;
    std::mem::swap(&mut req.len, &mut other);
}

fn main() {}
