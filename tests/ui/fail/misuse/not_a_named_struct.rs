//! `#[guarded]` needs a struct with named fields and at least one `#[owned_by]` field.

#[kvown::guarded]
pub struct Pair(#[owned_by(alloc)] usize, usize);

#[kvown::guarded]
pub enum Kind {
    A,
}

#[kvown::guarded]
pub struct Nothing {
    len: usize,
}

fn main() {}
