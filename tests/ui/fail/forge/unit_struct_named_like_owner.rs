//! A listed owner must be a real `#[owner]`: a unit struct of the listed name is not a token.

#[kvown::guarded]
pub struct Req {
    #[owned_by(alloc)]
    len: usize,
}

#[allow(non_camel_case_types)]
pub struct alloc;

fn forge(req: &mut Req) {
    req.set_len(&alloc, 99);
}

fn main() {}
