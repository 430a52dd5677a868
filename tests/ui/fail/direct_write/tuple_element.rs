//! Writing one element (`.0`) of a guarded tuple field.
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

fn first(req: &mut Req) {
    req.pair.0 = 7;
}

fn main() {}
