//! `#[owner]` inside `#[cfg_attr]` on a method of an `#[owners]` block: the macro runs before
//! rustc expands `cfg_attr`, so it says so instead of leaving rustc's "module is not supported
//! in `trait`s or `impl`s". A cfg named `owner` in the predicate is not an attribute.

#![allow(unexpected_cfgs)]

#[kvown::guarded]
pub struct Req {
    #[owned_by(Batch::stay)]
    len: u32,
}

pub struct Batch;

#[kvown::owners]
impl Batch {
    #[owner]
    pub fn stay(r: &mut Req) {
        r.set_len(owner, 1);
    }

    #[cfg_attr(all(), kvown::owner)]
    pub fn go(r: &mut Req) {
        let _ = r;
    }

    #[cfg_attr(owner, inline)]
    pub fn plain(&self) {}
}

fn main() {}
