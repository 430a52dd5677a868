//! Every problem the macro can see is reported in the same build, each on its own tokens.

use std::cell::Cell;

#[kvown::guarded]
pub struct Req {
    #[owned_by(alloc)]
    pub len: usize,
    #[owned_by(alloc, alloc)]
    cap: usize,
    #[owned_by(alloc)]
    hits: Cell<u32>,
    #[owned_by()]
    free: usize,
    #[owned_by(alloc)]
    #[owned_by(release)]
    twice: usize,
}

#[kvown::owner]
pub fn alloc() {}

#[kvown::owner]
pub fn release() {}

fn main() {}
