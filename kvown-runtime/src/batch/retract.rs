//! Memory checks before a decode step, and retraction when the step does not fit.

use super::spec::reservation_target;
use super::{Ready, ScheduleBatch, release_kv_cache, reset_for_retract};
use crate::alloc::{KvAllocator, ceil_align};
use crate::batch::Req;
use crate::cache::{KvCache, TableMirror};
use crate::error::KvError;

/// Slots the next decode step needs in new pages (sglang `new_tokens_required_next_decode`).
///
/// Without speculation (`spec_reserve = None`) only requests whose next token opens a page
/// need one. With speculation, each request tops its allocation up to
/// `ceil_align(committed + reserve, page_size)`. A reservation past `usize::MAX` counts as
/// `usize::MAX` slots less what the request holds (more than any pool), not an overflow; so
/// does a total past `usize::MAX`.
///
/// # Panics
/// If `page_size` is 0 (pass the cache's, [`KvCache::page_size`]), whatever the batch, an
/// empty one too.
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
/// // 6 tokens stored in pages of 4: the next token (position 6) fits the second page.
/// assert_eq!(new_tokens_required_next_decode(batch.reqs(), 4, None), 0);
/// // A reservation of 4 more tokens tops the allocation up to 12: a page more.
/// assert_eq!(new_tokens_required_next_decode(batch.reqs(), 4, Some(4)), 4);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn new_tokens_required_next_decode<'a>(
    reqs: impl IntoIterator<Item = &'a Req>,
    page_size: usize,
    spec_reserve: Option<usize>,
) -> usize {
    assert!(
        page_size > 0,
        "new_tokens_required_next_decode: page_size must be at least 1 (pass the cache's)"
    );
    match spec_reserve {
        None => reqs
            .into_iter()
            .filter(|req| req.kv().kv_allocated_len() % page_size == 0)
            .count()
            .saturating_mul(page_size),
        Some(reserve) => reqs
            .into_iter()
            .map(|req| {
                let kv = req.kv();
                let backed = ceil_align(kv.kv_allocated_len(), page_size);
                let target = reservation_target(backed, kv.kv_committed_len(), reserve, page_size);
                target - backed
            })
            .fold(0, usize::saturating_add),
    }
}

/// Whether the next decode step of `reqs` fits, evicting only the prefix-cache shortfall
/// (sglang `check_decode_mem`).
///
/// # Errors
/// As [`KvCache::evict_shortfall`]: an eviction refused inside a free group evicts nothing; one
/// refused by the allocator keeps what it evicted before the refusal.
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
/// assert!(check_decode_mem(batch.reqs(), &mut cache, None)?);
/// assert!(!check_decode_mem(batch.reqs(), &mut cache, Some(1000))?, "more than the pool");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn check_decode_mem<'a, A: KvAllocator, M: TableMirror>(
    reqs: impl IntoIterator<Item = &'a Req>,
    cache: &mut KvCache<A, M>,
    spec_reserve: Option<usize>,
) -> Result<bool, KvError> {
    let needed = new_tokens_required_next_decode(reqs, cache.page_size(), spec_reserve);
    cache.evict_shortfall(needed)?;
    Ok(cache.available_size() >= needed)
}

/// Requests removed from a running batch by [`retract_decode`].
#[derive(Debug, Default)]
pub struct RetractOutcome {
    /// Released and reset; re-queue them (they recompute their KV on re-admission).
    pub retracted: Vec<Req>,
    /// Released because even alone they do not fit: finish them with an error.
    pub aborted: Vec<Req>,
}

/// Retracts requests until the next decode step fits (sglang `retract_decode`): the request
/// with the fewest outputs goes first, the longest prompt first among equals; at least one is
/// retracted (when the batch has two or more) and at least one kept, unless the last one alone
/// does not fit, when it is aborted. A batch of one is never retracted: it is kept or aborted.
/// Retracted KV is released without inserting it into the prefix cache, and after each release
/// the prefix cache gives up what the free slots lack of
/// [`EvictionRules::retract_decode_steps`](crate::cache::EvictionRules) tokens per request
/// still in the batch (sglang `release_req`). The requests kept stay in retraction order, most
/// outputs first (sglang `filter_batch(keep_indices=sorted_indices)`).
///
/// Every request must hold KV in this cache: one that holds none fails the call with
/// [`KvError::NotHeld`], one of another cache with [`KvError::OtherCache`], before anything is
/// released; so does an open free group, with [`KvError::FreeGroupOpen`] (the releases would
/// stay deferred and make no room). An error after that is a broken invariant (a bug, such as
/// an allocator refusing a free); the call then drops no request: the batch gets back those it
/// had not taken out, in retraction order, followed by those it had, in the order it took them
/// (released and reset, except the one whose release failed, which keeps its KV as a failed
/// release leaves it).
///
/// # Examples
///
/// ```
/// # use kvown_runtime::batch::*;
/// # use kvown_runtime::{alloc::PagedAllocator, cache::{KvCache, TreeCache}};
/// # use kvown_runtime::slots::ReqToTokenPool;
/// // Two requests fill all 4 pages; their next tokens each need a page more.
/// let allocator = PagedAllocator::new(16, 4, false)?;
/// let mut cache = KvCache::new(allocator, ReqToTokenPool::new(4, 32)?, TreeCache::Disabled)?;
/// let reqs = vec![Req::new(1, vec![7; 8]), Req::new(2, vec![8; 8])];
/// let prepared = prepare_for_extend(ScheduleBatch::new(reqs));
/// let mut batch = alloc_for_extend(prepared, &mut cache).map_err(|failure| failure.error)?;
/// let outcome = retract_decode(&mut batch, &mut cache, None)?;
/// assert_eq!((outcome.retracted.len(), outcome.aborted.len(), batch.len()), (1, 0, 1));
/// assert!(outcome.retracted[0].is_retracted, "re-queue it");
/// assert!(check_decode_mem(batch.reqs(), &mut cache, None)?);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn retract_decode<A: KvAllocator, M: TableMirror>(
    batch: &mut ScheduleBatch<Ready>,
    cache: &mut KvCache<A, M>,
    spec_reserve: Option<usize>,
) -> Result<RetractOutcome, KvError> {
    // Before anything is released: a request that holds no KV here fails the call, and so
    // does an open free group.
    for req in &batch.reqs {
        cache.held_row(req)?;
    }
    if cache.in_free_group() {
        let needed = new_tokens_required_next_decode(&batch.reqs, cache.page_size(), spec_reserve);
        return Err(cache.free_group_refusal(needed));
    }
    let mut order: Vec<usize> = (0..batch.reqs.len()).collect();
    order.sort_by_key(|&i| {
        let req = &batch.reqs[i];
        (
            std::cmp::Reverse(req.output_ids().len()),
            req.origin_input_ids().len(),
        )
    });
    let mut pool: Vec<Option<Req>> = batch.reqs.drain(..).map(Some).collect();
    let mut outcome = RetractOutcome::default();
    let result = retract_in_order(&mut pool, &mut order, &mut outcome, cache, spec_reserve);
    batch.reqs = order.iter().filter_map(|&i| pool[i].take()).collect();
    if !(outcome.retracted.is_empty() && outcome.aborted.is_empty()) {
        // The batch changed: its `out_cache_loc` no longer describes it.
        batch.forget_out_cache_loc();
    }
    if let Err(error) = result {
        batch.reqs.append(&mut outcome.retracted);
        batch.reqs.append(&mut outcome.aborted);
        return Err(error);
    }
    Ok(outcome)
}

/// The releases of [`retract_decode`]: takes requests out of `pool` (indexed as the batch was)
/// in retraction order, the last of `order` first, into `outcome`; `order` keeps the indices
/// of those left.
fn retract_in_order<A: KvAllocator, M: TableMirror>(
    pool: &mut [Option<Req>],
    order: &mut Vec<usize>,
    outcome: &mut RetractOutcome,
    cache: &mut KvCache<A, M>,
    spec_reserve: Option<usize>,
) -> Result<(), KvError> {
    let steps = cache.eviction_rules().retract_decode_steps;
    // Always keep one: a lone request is never retracted, only aborted below if it does not fit.
    while order.len() > 1 {
        let index = order.pop().expect("more than one index is left");
        let mut req = pool[index].take().expect("each index is popped once");
        let released =
            release_kv_cache(&mut req, cache, false).and_then(|()| reset_for_retract(&mut req));
        outcome.retracted.push(req);
        released?;
        // sglang `release_req`: room for the remaining requests' next decode steps.
        cache.evict_shortfall(order.len().saturating_mul(steps))?;
        let left = order.iter().filter_map(|&i| pool[i].as_ref());
        if check_decode_mem(left, cache, spec_reserve)? {
            return Ok(());
        }
    }
    if let [index] = order[..] {
        let last = pool[index]
            .as_ref()
            .expect("the kept request is in the pool");
        if !check_decode_mem([last], cache, spec_reserve)? {
            let mut req = pool[index].take().expect("the kept request is in the pool");
            let released = release_kv_cache(&mut req, cache, false);
            outcome.aborted.push(req);
            released?;
        }
    }
    Ok(())
}
