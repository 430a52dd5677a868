//! An owner listed twice.

#[kvown::guarded]
pub struct Req {
    #[owned_by(alloc, release, alloc)]
    len: usize,
}

#[kvown::owner]
pub fn alloc() {}

#[kvown::owner]
pub fn release() {}

fn main() {}
