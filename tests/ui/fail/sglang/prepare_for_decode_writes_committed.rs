//! sglang #37085: `kv_committed_len` is owned by the alloc functions; the write that used to
//! live in `prepare_for_decode` no longer compiles there.

#[kvown::guarded]
pub struct ReqKvInfo {
    #[owned_by(alloc_for_extend, alloc_for_decode)]
    kv_committed_len: usize,
    #[owned_by(prepare_for_decode)]
    decode_batch_idx: u64,
}

#[kvown::owner]
pub fn alloc_for_extend(req: &mut ReqKvInfo, seq_len: usize) {
    req.set_kv_committed_len(owner, seq_len);
}

#[kvown::owner]
pub fn alloc_for_decode(req: &mut ReqKvInfo) {
    *req.kv_committed_len_mut(owner) += 1;
}

#[kvown::owner]
pub fn prepare_for_decode(req: &mut ReqKvInfo) {
    *req.decode_batch_idx_mut(owner) += 1;
    *req.kv_committed_len_mut(owner) += 1;
}

fn main() {}
