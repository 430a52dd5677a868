//! Owned field names whose generated names would be ambiguous or clash: `set_size` and
//! `size_mut` (is `set_size_mut` the setter of one or the `_mut` accessor of the other?),
//! `fields` and `into_init` (generated methods), and pairs whose owner traits share a name.

#[kvown::guarded]
pub struct Req {
    #[owned_by(alloc)]
    set_size: usize,
    #[owned_by(alloc)]
    size_mut: usize,
    #[owned_by(alloc)]
    fields: usize,
    #[owned_by(alloc)]
    into_init: usize,
    #[owned_by(alloc)]
    len: usize,
    #[owned_by(alloc)]
    _len: usize,
    #[owned_by(alloc)]
    a_b: usize,
    #[owned_by(alloc)]
    a__b: usize,
}

#[kvown::owner]
pub fn alloc() {}

fn main() {}
