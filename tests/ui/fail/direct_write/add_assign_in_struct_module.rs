//! `+=` on a guarded field in the module that defines the struct: sealing keeps it out too.
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

fn bump(req: &mut Req) {
    req.len += 1;
}

fn main() {}
