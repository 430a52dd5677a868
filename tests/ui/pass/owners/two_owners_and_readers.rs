//! Two owners write one field; non-owners read it freely and call the owners.

#[kvown::guarded]
#[derive(Debug, Default)]
pub struct ReqKvInfo {
    #[owned_by(alloc_for_extend, alloc_for_decode)]
    kv_committed_len: usize,
    #[owned_by(alloc_for_extend)]
    kv_allocated_len: usize,
}

#[kvown::owner]
pub fn alloc_for_extend(req: &mut ReqKvInfo, seq_len: usize) {
    req.set_kv_committed_len(owner, seq_len);
    req.set_kv_allocated_len(owner, seq_len.next_multiple_of(16));
}

#[kvown::owner]
pub fn alloc_for_decode(req: &mut ReqKvInfo) {
    *req.kv_committed_len_mut(owner) += 1;
}

/// Not an owner: reads, and writes only by calling the owners.
pub fn prepare_for_decode(reqs: &mut [ReqKvInfo]) -> usize {
    let before: usize = reqs.iter().map(|r| r.kv_committed_len()).sum();
    for req in reqs.iter_mut() {
        alloc_for_decode(req);
    }
    before
}

#[test]
fn compiles_and_runs() {
    let mut reqs = vec![ReqKvInfo::default(), ReqKvInfo::default()];
    alloc_for_extend(&mut reqs[0], 5);
    alloc_for_extend(&mut reqs[1], 20);
    assert_eq!(prepare_for_decode(&mut reqs), 25);
    assert_eq!(reqs[0].kv_committed_len(), 6);
    assert_eq!(reqs[1].kv_committed_len(), 21);
    assert_eq!(reqs[1].kv_allocated_len(), 32);
}
