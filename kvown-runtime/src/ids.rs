//! Ids that every layer of the runtime names, in a module that imports nothing of the crate.

use std::fmt;
use std::num::NonZeroU64;
use std::sync::atomic::{AtomicU64, Ordering};

/// Names one [`KvCache`](crate::cache::KvCache): no other cache of the process has its name. A
/// request records the cache it matched or got its row in
/// ([`ReqKvInfo::kv_cache`](crate::batch::ReqKvInfo::kv_cache)), and every batch-flow call
/// refuses a request recorded for another cache: its row, slots and prefix lock mean something
/// only there. [`reclaim_leaks`](crate::check::reclaim_leaks) gives the cache a new name
/// (and the live requests with it), so a request it took for leaked is refused too.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CacheId(NonZeroU64);

impl CacheId {
    /// A name no other cache of this process has.
    pub(crate) fn next() -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let id = NEXT.fetch_add(1, Ordering::Relaxed);
        CacheId(NonZeroU64::new(id).expect("2^64 caches are never created"))
    }
}

impl fmt::Display for CacheId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{}", self.0)
    }
}

/// Index of one KV slot (a row of the per-layer K/V buffers). Slot 0 is padding.
pub type KvSlot = u32;

/// Index of one page of `page_size` consecutive slots. Page 0 is padding.
pub type PageId = u32;

/// Index of a row of the request-to-token table (sglang `req_pool_idx`). A plain index so it can
/// go into batch index tensors as is; the pool validates every row it is given. Row 0 is padding.
pub type ReqRow = usize;
