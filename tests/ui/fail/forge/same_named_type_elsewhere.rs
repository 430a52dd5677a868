//! A same-named `struct alloc` in another module is a different type: not an owner.

#[kvown::guarded]
pub struct Req {
    #[owned_by(alloc)]
    len: usize,
}

#[kvown::owner]
pub fn alloc(req: &mut Req) {
    req.set_len(owner, 1);
}

mod elsewhere {
    #[allow(non_camel_case_types)]
    pub struct alloc;

    pub fn forge(req: &mut super::Req) {
        req.set_len(&alloc, 99);
    }
}

fn main() {}
