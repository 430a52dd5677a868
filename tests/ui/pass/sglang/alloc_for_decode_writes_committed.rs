//! sglang #37085: the same write compiles inside `alloc_for_decode`, and reads stay free.

#[kvown::guarded]
#[derive(Default)]
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
    alloc_for_decode(req);
}

#[test]
fn compiles_and_runs() {
    let mut req = ReqKvInfo::default();
    alloc_for_extend(&mut req, 7);
    prepare_for_decode(&mut req);
    assert_eq!(req.kv_committed_len(), 8);
    assert_eq!(req.decode_batch_idx(), 1);
}
