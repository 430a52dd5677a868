//! A `macro_rules!` that builds the token expands where it is called, outside the seal.

#[kvown::guarded]
pub struct Req {
    #[owned_by(alloc)]
    len: usize,
}

#[kvown::owner]
pub fn alloc(req: &mut Req) {
    req.set_len(owner, 1);
}

macro_rules! forge_token {
    ($token:ident) => {
        $token { _seal: kvown::__private::OwnerSeal::new() }
    };
}

fn forge(req: &mut Req) {
    req.set_len(&forge_token!(alloc), 99);
}

fn main() {}
