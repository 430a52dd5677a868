//! `#[owned_by]` inside `#[cfg_attr]`: the macro runs before rustc expands `cfg_attr`, so it
//! would see the field as unowned; it says so instead of leaving rustc's "cannot find
//! attribute `owned_by`".

#[kvown::guarded]
pub struct Req {
    #[owned_by(alloc)]
    len: usize,
    #[cfg_attr(all(), owned_by(alloc))]
    cap: usize,
    #[cfg_attr(any(), doc = "not about ownership")]
    pub rid: u64,
}

#[kvown::owner]
pub fn alloc(req: &mut Req) {
    req.set_len(owner, 1);
}

fn main() {}
