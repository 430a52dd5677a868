//! `#[owned_by]` and `#[owned_by()]` list no owner.

#[kvown::guarded]
pub struct Req {
    #[owned_by()]
    len: usize,
    #[owned_by]
    cap: usize,
}

fn main() {}
