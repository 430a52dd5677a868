//! A struct literal naming guarded fields, in the struct's own module.
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

fn forge() -> Req {
    Req { len: 5, pair: (0, 0), note: 0 }
}

fn main() {}
