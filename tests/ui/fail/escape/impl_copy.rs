//! `Copy` cannot be added to a token: its sealed field is not `Copy` (E0204).

#[kvown::guarded]
pub struct Req {
    #[owned_by(alloc)]
    len: usize,
}

#[kvown::owner]
pub fn alloc(req: &mut Req) {
    req.set_len(owner, 1);
}

impl Clone for alloc {
    fn clone(&self) -> Self {
        unimplemented!()
    }
}

impl Copy for alloc {}

fn main() {}
