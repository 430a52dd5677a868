//! A trait method cannot be an owner: any code reaches it through the trait.

#[kvown::guarded]
pub struct Req {
    #[owned_by(alloc)]
    len: usize,
}

#[kvown::owner]
pub fn alloc() {}

pub trait Reset {
    fn reset(&mut self);
}

impl Reset for Req {
    #[kvown::owner]
    fn reset(&mut self) {
        let _ = self.len();
    }
}

fn main() {}
