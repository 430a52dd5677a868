//! Owning a field of one struct gives nothing on a same-named field of another struct.

#[kvown::guarded]
pub struct Req {
    #[owned_by(alloc)]
    len: usize,
}

#[kvown::guarded]
pub struct Slot {
    #[owned_by(free)]
    len: usize,
}

#[kvown::owner]
pub fn alloc(req: &mut Req, slot: &mut Slot) {
    req.set_len(owner, 1);
    slot.set_len(owner, 1);
}

#[kvown::owner]
pub fn free(slot: &mut Slot) {
    slot.set_len(owner, 0);
}

fn main() {}
