//! `#[owners]` on a trait impl is rejected the same way.

#[kvown::guarded]
pub struct Req {
    #[owned_by(alloc)]
    len: usize,
}

#[kvown::owner]
pub fn alloc() {}

#[kvown::owners]
impl Clone for Req {
    #[owner]
    fn clone(&self) -> Self {
        unimplemented!()
    }
}

fn main() {}
