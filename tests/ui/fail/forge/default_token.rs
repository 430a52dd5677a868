//! The token has no constructor: not `Default`, and `Default` cannot be derived or written
//! for it outside the seal.

#[kvown::guarded]
pub struct Req {
    #[owned_by(alloc)]
    len: usize,
}

#[kvown::owner]
pub fn alloc(req: &mut Req) {
    req.set_len(owner, 1);
}

impl Default for alloc {
    fn default() -> Self {
        alloc { _seal: Default::default() }
    }
}

fn main() {}
