//! A non-`Copy` guarded field is read by `&T`: mutating through the getter does not compile.

#[kvown::guarded]
pub struct Req {
    #[owned_by(alloc)]
    tokens: Vec<u32>,
}

#[kvown::owner]
pub fn alloc(req: &mut Req) {
    req.tokens_mut(owner).push(1);
}

fn append(req: &mut Req) {
    req.tokens().push(2);
}

fn main() {}
