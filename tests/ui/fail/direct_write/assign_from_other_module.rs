//! `=` on a guarded field from another module: the field is private to the sealed module.
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

mod other {
    pub fn reset(req: &mut super::Req) {
        req.len = 0;
    }
}

fn main() {}
