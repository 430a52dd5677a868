//! Admission's prefix-cache step (sglang `init_next_round_input`): match the request's
//! prompt in the prefix cache, lock what matched, and fix how far its next extend goes. Owns
//! `cache_protected_len` and `kv_cache` for that.

use kvown_macros::owner;

use crate::alloc::KvAllocator;
use crate::batch::Req;
use crate::cache::{KvCache, TableMirror, TreeCache};
use crate::error::KvError;
use crate::radix::TreePos;

/// The match step: before a request's next extend, find its cached prefix, lock it, and set
/// how far the extend goes (`max_extend` caps the chunk; pass `usize::MAX` for no chunking; a
/// cap of 0 counts as 1, as every extend computes at least one token).
///
/// Fails with [`KvError::OtherCache`] (or [`KvError::Reclaimed`]) for a request recorded for
/// another cache, changing nothing.
///
/// A fresh or retracted request matches the prefix cache on all but its last token (which must
/// be computed), locks the matched path and sets `cache_protected_len` to the matched length.
/// A request that holds KV (a chunked prefill continuing) keeps its prefix.
///
/// # Examples
///
/// ```
/// # use kvown_runtime::batch::*;
/// # use kvown_runtime::{alloc::PagedAllocator, cache::{KvCache, TreeCache}};
/// # use kvown_runtime::slots::ReqToTokenPool;
/// # use kvown_runtime::radix::{RadixCache, RadixConfig};
/// # let tree = TreeCache::Radix(RadixCache::new(RadixConfig::new(4))?);
/// # let allocator = PagedAllocator::new(64, 4, false)?;
/// # let mut cache = KvCache::new(allocator, ReqToTokenPool::new(4, 32)?, tree)?;
/// # let prepared = prepare_for_extend(ScheduleBatch::new(vec![Req::new(1, vec![7; 6])]));
/// # let mut batch = alloc_for_extend(prepared, &mut cache).map_err(|failure| failure.error)?;
/// release_kv_cache(&mut batch.into_reqs()[0], &mut cache, true)?; // caches [7; 4]
/// let mut again = Req::new(2, vec![7; 6]);
/// init_next_round_input(&mut again, &mut cache, usize::MAX)?;
/// assert_eq!((again.prefix_len(), again.extend_end()), (4, 6), "4 tokens reused");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[owner]
pub fn init_next_round_input<A: KvAllocator, M: TableMirror>(
    req: &mut Req,
    cache: &mut KvCache<A, M>,
    max_extend: usize,
) -> Result<(), KvError> {
    cache.ensure_own(req)?;
    if !req.kv().holds_kv() {
        let max_prefix = req.fill_ids().len() - 1;
        let matched = match &mut cache.tree {
            TreeCache::Radix(tree) => {
                let pos = tree.match_prefix(req.namespace().key(&req.fill_ids()[..max_prefix]));
                // First, as it alone can fail (changing nothing) on a lock that is not the
                // request's own; a split made by the match changes no prefix.
                tree.move_lock(req.last_node.node, pos.node)?;
                req.prefix_indices.clear();
                req.prefix_indices.resize(pos.len, 0);
                tree.path_slots_into(pos, 0, &mut req.prefix_indices)?;
                pos
            }
            TreeCache::Disabled => {
                req.prefix_indices.clear();
                TreePos::ROOT
            }
        };
        req.last_node = matched;
        let kv = req.kv_mut();
        kv.set_cache_protected_len(owner, matched.len);
        // Bound to this cache while it holds the lock of a matched prefix.
        kv.set_kv_cache(owner, (matched.len > 0).then(|| cache.id()));
    }
    let fill_len = req.fill_ids().len();
    req.extend_end = fill_len.min(req.prefix_len().saturating_add(max_extend.max(1)));
    Ok(())
}
