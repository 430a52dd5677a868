//! A `'static` closure cannot capture the capability.

#[kvown::guarded]
pub struct Req {
    #[owned_by(alloc)]
    len: usize,
}

#[kvown::owner]
pub fn alloc(req: &mut Req) {
    req.set_len(owner, 1);
}

#[kvown::owner]
pub fn boxed() -> Box<dyn Fn() + 'static> {
    Box::new(move || {
        let _capability: &boxed = owner;
    })
}

fn main() {}
