//! Listing a plain function (no `#[owner]`) is an error at the list: it has no token type.

#[kvown::guarded]
pub struct Req {
    #[owned_by(alloc)]
    len: usize,
}

pub fn alloc(req: &mut Req) {
    let _ = req.len();
}

fn main() {}
