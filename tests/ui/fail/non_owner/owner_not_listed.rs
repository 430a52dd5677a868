//! An `#[owner]` function that is not in the field's `#[owned_by(..)]` list cannot write it.

#[kvown::guarded]
pub struct Req {
    #[owned_by(alloc_for_extend, alloc_for_decode)]
    kv_committed_len: usize,
}

#[kvown::owner]
pub fn alloc_for_extend(req: &mut Req) {
    req.set_kv_committed_len(owner, 1);
}

#[kvown::owner]
pub fn alloc_for_decode(req: &mut Req) {
    *req.kv_committed_len_mut(owner) += 1;
}

#[kvown::owner]
pub fn release(req: &mut Req) {
    req.set_kv_committed_len(owner, 0);
}

fn main() {}
