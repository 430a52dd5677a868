//! Unknown arguments of every attribute, all reported in one build.

#[kvown::guarded(init = ReqParts, frozen)]
pub struct Req {
    #[owned_by(alloc, read = copy, write = never)]
    len: usize,
    #[owned_by(alloc, read = maybe)]
    cap: usize,
}

#[kvown::owner(token = cap, inline)]
pub fn alloc() {}

pub struct Batch;

#[kvown::owners(strict)]
impl Batch {
    #[owner(tokn = cap)]
    pub fn grow(&self) {}
}

fn main() {}
