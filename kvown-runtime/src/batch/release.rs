//! Release: the single exit point of a request's KV (finish, abort and retract).

use kvown_macros::owner;

use crate::alloc::KvAllocator;
use crate::batch::Req;
use crate::batch::cache_finished_req;
use crate::cache::{KvCache, TableMirror, TreeCache};
use crate::error::KvError;
use crate::radix::TreePos;

/// Releases a request's KV (sglang `release_kv_cache`): the prefix cache takes or frees
/// `[protected, committed)` (inserting when `is_insert`) and the lock is dropped; the
/// over-allocation `[ceil_align(committed), allocated)` is freed; the row is freed; the record
/// is reset to zero with no row. Owns that reset.
///
/// A request that matched a prefix but was never allocated only drops its lock. A request
/// holding neither fails with [`KvError::NotHeld`] (double release), and one holding KV in
/// another cache with [`KvError::OtherCache`], changing nothing.
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
/// let mut reqs = batch.into_reqs();
/// release_kv_cache(&mut reqs[0], &mut cache, true)?; // the whole page stays cached
/// assert!(!reqs[0].kv().holds_kv());
/// assert_eq!((cache.tree().evictable_size(), cache.available_size()), (4, 60));
/// assert!(release_kv_cache(&mut reqs[0], &mut cache, true).is_err(), "a double release");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[owner]
pub fn release_kv_cache<A: KvAllocator, M: TableMirror>(
    req: &mut Req,
    cache: &mut KvCache<A, M>,
    is_insert: bool,
) -> Result<(), KvError> {
    cache.ensure_own(req)?;
    let Some(row) = req.kv().req_pool_idx() else {
        if req.last_node == TreePos::ROOT {
            return Err(KvError::NotHeld { rid: req.rid() });
        }
        if let TreeCache::Radix(tree) = &mut cache.tree {
            tree.dec_lock_ref(req.last_node.node)?;
        }
        req.last_node = TreePos::ROOT;
        req.prefix_indices.clear();
        let kv = req.kv_mut();
        kv.set_cache_protected_len(owner, 0);
        kv.set_kv_cache(owner, None);
        return Ok(());
    };
    cache_finished_req(req, cache, is_insert)?;
    cache.req_to_token.free(row)?;
    req.last_node = TreePos::ROOT;
    req.prefix_indices.clear();
    req.prompt_split_made = false;
    req.extend_end = req.fill_ids().len();
    let kv = req.kv_mut();
    kv.set_req_pool_idx(owner, None);
    kv.set_cache_protected_len(owner, 0);
    kv.set_kv_committed_len(owner, 0);
    kv.set_kv_allocated_len(owner, 0);
    kv.set_kv_cache(owner, None);
    Ok(())
}

/// After a retraction's release (sglang `reset_for_retract`): clocks and protected length back
/// to zero, the retraction counted, the request marked retracted for re-admission.
///
/// Fails with [`KvError::AlreadyHeld`] if the request still holds KV or a prefix lock (release
/// it first: a reset that kept the lock would leave the matched prefix unprotected).
///
/// # Examples
///
/// ```
/// # use kvown_runtime::batch::*;
/// # use kvown_runtime::{alloc::PagedAllocator, cache::{KvCache, TreeCache}};
/// # use kvown_runtime::slots::ReqToTokenPool;
/// # let allocator = PagedAllocator::new(64, 4, false)?;
/// # let mut cache = KvCache::new(allocator, ReqToTokenPool::new(4, 32)?, TreeCache::Disabled)?;
/// # let prepared = prepare_for_extend(ScheduleBatch::new(vec![Req::new(1, vec![7; 6])]));
/// # let mut batch = alloc_for_extend(prepared, &mut cache).map_err(|failure| failure.error)?;
/// let mut reqs = batch.into_reqs();
/// assert!(reset_for_retract(&mut reqs[0]).is_err(), "release it first");
/// release_kv_cache(&mut reqs[0], &mut cache, false)?;
/// reset_for_retract(&mut reqs[0])?;
/// assert!(reqs[0].is_retracted && reqs[0].retraction_count == 1);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[owner]
pub fn reset_for_retract(req: &mut Req) -> Result<(), KvError> {
    if req.kv().holds_kv() || req.last_node != TreePos::ROOT {
        return Err(KvError::AlreadyHeld { rid: req.rid() });
    }
    req.retraction_count += 1;
    req.is_retracted = true;
    let kv = req.kv_mut();
    kv.set_cache_protected_len(owner, 0);
    kv.set_extend_batch_idx(owner, 0);
    kv.set_decode_batch_idx(owner, 0);
    Ok(())
}
