//! Forging the token `alloc` with a struct literal in the owner's own module: its field is
//! private to the owner's sealed module (E0451), whoever can name `OwnerSeal`.

#[kvown::guarded]
pub struct Req {
    #[owned_by(alloc)]
    len: usize,
}

#[kvown::owner]
pub fn alloc(req: &mut Req) {
    req.set_len(owner, 1);
}

fn forge(req: &mut Req) {
    let token = alloc { _seal: kvown::__private::OwnerSeal::new() };
    req.set_len(&token, 99);
}

fn main() {}
