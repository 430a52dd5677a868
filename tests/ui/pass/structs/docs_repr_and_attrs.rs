//! Doc comments, `#[repr(C)]` (same layout as the plain struct), `#[must_use]`, `cfg_attr` and
//! the exported owner trait keep working on a sealed struct.

#![deny(missing_docs)]

/// A request's KV bookkeeping.
#[kvown::guarded]
#[repr(C)]
#[derive(Default)]
#[must_use]
pub struct ReqKvInfo {
    /// Tokens whose KV entries are committed.
    #[owned_by(alloc_for_decode)]
    #[cfg_attr(any(), allow(dead_code))]
    kv_committed_len: u64,
    /// Request id.
    pub rid: u32,
}

/// The plain twin, for the layout check.
#[repr(C)]
pub struct Plain {
    /// Same field.
    pub kv_committed_len: u64,
    /// Same field.
    pub rid: u32,
}

/// Commits one decode token.
#[kvown::owner]
pub fn alloc_for_decode(req: &mut ReqKvInfo) {
    *req.kv_committed_len_mut(owner) += 1;
}

/// A helper bounded by the exported owner trait.
pub fn commit_twice(req: &mut ReqKvInfo, owner: &impl ReqKvInfoKvCommittedLenOwner) {
    *req.kv_committed_len_mut(owner) += 2;
}

#[test]
fn compiles_and_runs() {
    assert_eq!(
        std::mem::size_of::<ReqKvInfo>(),
        std::mem::size_of::<Plain>()
    );
    assert_eq!(
        std::mem::align_of::<ReqKvInfo>(),
        std::mem::align_of::<Plain>()
    );
    assert_eq!(
        std::mem::offset_of!(ReqKvInfo, rid),
        std::mem::offset_of!(Plain, rid)
    );
    let mut req = ReqKvInfo::default();
    alloc_for_decode(&mut req);
    req.rid = 7;
    assert_eq!((req.kv_committed_len(), req.rid), (1, 7));
}
