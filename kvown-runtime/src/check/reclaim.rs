//! Reclaiming what requests dropped before their release leaked: their rows, pages and prefix
//! locks, found by the invariant checker's census of the requests still alive.

use std::fmt;

use kvown_macros::owner;

use crate::alloc::{AllocError, AsPageAllocator, FreeOrder, KvAllocator, PageId};
use crate::batch::Req;
use crate::cache::KvCache;
use crate::check::Violation;
use crate::ids::CacheId;
use crate::radix::NodeId;
use crate::slots::ReqRow;

/// What [`reclaim_leaks`] gave back.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reclaimed {
    /// The rows freed, each with the request the batch flow had assigned it to (`None` for a
    /// row taken from the pool directly).
    pub rows: Vec<(ReqRow, Option<u64>)>,
    /// The pages freed: held by the allocator, but neither by a live request nor by the prefix
    /// cache.
    pub pages: Vec<PageId>,
    /// Prefix locks released, one per dropped holder: `(node, locks taken on it)`, deepest
    /// nodes first. Their prefixes become evictable once no live request locks them.
    pub locks: Vec<(NodeId, usize)>,
}

impl Reclaimed {
    /// Whether nothing had leaked.
    ///
    /// # Examples
    ///
    /// ```
    /// # use kvown_runtime::{alloc::PagedAllocator, cache::{KvCache, TreeCache}, check::reclaim_leaks};
    /// # use kvown_runtime::slots::ReqToTokenPool;
    /// let allocator = PagedAllocator::new(64, 4, false)?;
    /// let mut cache = KvCache::new(allocator, ReqToTokenPool::new(4, 32)?, TreeCache::Disabled)?;
    /// assert!(reclaim_leaks(&mut cache, [])?.is_empty(), "no request ever held anything");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty() && self.pages.is_empty() && self.locks.is_empty()
    }
}

/// One line for a log: `reclaimed 1 row (request 7), 2 pages, 0 prefix locks`.
impl fmt::Display for Reclaimed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let requests: Vec<String> = self
            .rows
            .iter()
            .filter_map(|(_, rid)| rid.map(|rid| rid.to_string()))
            .collect();
        write!(f, "reclaimed {}", counted(self.rows.len(), "row"))?;
        if !requests.is_empty() {
            let noun = if requests.len() == 1 {
                "request"
            } else {
                "requests"
            };
            write!(f, " ({noun} {})", requests.join(", "))?;
        }
        let locks = self.locks.iter().map(|&(_, count)| count).sum();
        write!(
            f,
            ", {}, {}",
            counted(self.pages.len(), "page"),
            counted(locks, "prefix lock")
        )
    }
}

/// `count` followed by `noun`, plural unless `count` is 1.
fn counted(count: usize, noun: &str) -> String {
    if count == 1 {
        format!("1 {noun}")
    } else {
        format!("{count} {noun}s")
    }
}

/// Why [`reclaim_leaks`] reclaimed nothing. The cache is as it was.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReclaimError {
    /// An invariant other than a leak is broken (or the live requests contradict the pool: a
    /// request's row not held, two requests on one row, a lock the tree never gave); reclaiming
    /// then could free what a live request still uses.
    #[error("nothing reclaimed: {0}")]
    Violation(#[from] Violation),
    /// The allocator refused to free the leaked pages.
    #[error("nothing reclaimed: the allocator refused to free {pages} leaked pages: {source}")]
    Free {
        /// Pages that were to be freed.
        pages: usize,
        /// The allocator's error.
        source: AllocError,
    },
}

/// Gives back what requests dropped (or lost) before
/// [`release_kv_cache`](crate::batch::release_kv_cache) still hold in `cache`: every row that
/// no request in `live` holds, every page that neither a request in `live` nor the prefix cache
/// holds, and every prefix lock that no request in `live` accounts for. `live` is every request
/// that may still hold KV or a prefix lock in this cache (the running batch, chunked prefills,
/// waiting requests), as for [`KvCache::check`].
///
/// A request left out of `live` is taken for leaked. So that it cannot touch rows and pages
/// that may go to other requests, a reclaim that gives anything back renames the cache (a new
/// [`KvCache::id`]) and records the new name in every request of `live` that holds KV here:
/// a left-out request is then refused by every batch-flow call that takes the cache, with
/// [`KvError::Reclaimed`](crate::error::KvError::Reclaimed). A batch prepared before the
/// reclaim is refused by its `alloc_for_*` the same way
/// ([`KvError::PreparedForOtherCache`](crate::error::KvError::PreparedForOtherCache)):
/// reclaim between steps.
///
/// All or nothing: the live requests are checked as [`KvCache::check`] checks them, the leaks
/// are found, and only then are the pages freed (in one call), the rows freed, the locks
/// released and the cache renamed; afterwards [`KvCache::check`] passes for `live`. Pages the
/// leaked requests had computed are freed, not inserted into the prefix cache: without the
/// request there is no key. Costs O(pool pages + held positions + tree nodes), as the check.
///
/// ```
/// use kvown_runtime::alloc::{KvAllocator, PagedAllocator};
/// use kvown_runtime::batch::{ScheduleBatch, alloc_for_extend, prepare_for_extend};
/// use kvown_runtime::cache::{KvCache, TreeCache};
/// use kvown_runtime::check::reclaim_leaks;
/// use kvown_runtime::batch::Req;
/// use kvown_runtime::slots::ReqToTokenPool;
///
/// let allocator = PagedAllocator::new(64, 4, false)?;
/// let mut cache = KvCache::new(allocator, ReqToTokenPool::new(4, 32)?, TreeCache::Disabled)?;
/// let prepared = prepare_for_extend(ScheduleBatch::new(vec![Req::new(7, vec![1; 6])]));
/// let batch = alloc_for_extend(prepared, &mut cache).map_err(|failure| failure.error)?;
/// let row = batch.reqs()[0].kv().req_pool_idx();
/// drop(batch); // request 7 is never released
///
/// let reclaimed = reclaim_leaks(&mut cache, [])?;
/// assert_eq!(reclaimed.rows, vec![(row.unwrap(), Some(7))]);
/// assert_eq!(reclaimed.pages.len(), 2); // its 6 tokens took 2 pages of 4
/// assert_eq!(reclaimed.to_string(), "reclaimed 1 row (request 7), 2 pages, 0 prefix locks");
/// assert_eq!(cache.available_size(), cache.allocator().capacity());
/// cache.check([])?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Errors
/// [`ReclaimError::Violation`] with what [`KvCache::check`] reports, other than the leaks;
/// [`ReclaimError::Free`] when the allocator refuses the pages. Either way nothing changes.
#[owner]
pub fn reclaim_leaks<'a, A: AsPageAllocator + KvAllocator, M>(
    cache: &mut KvCache<A, M>,
    live: impl IntoIterator<Item = &'a mut Req>,
) -> Result<Reclaimed, ReclaimError> {
    let mut live: Vec<&mut Req> = live.into_iter().collect();
    let census = cache.census(live.iter().map(|req| &**req))?;
    let allocator = cache.allocator.page_allocator();
    let rows = census.unclaimed_rows(&cache.req_to_token);
    let pages = census.unclaimed_pages(allocator);
    census.check_accounting(allocator, pages.len() * allocator.page_size())?;
    let locks = match cache.tree.radix() {
        Some(tree) => super::radix::leaked_locks(tree, census.lock_holders.iter().copied())
            .map_err(Violation::from)?,
        None => Vec::new(),
    };

    // The one step that can fail goes first.
    if !pages.is_empty() {
        cache
            .allocator
            .free_page_ids(&pages, FreeOrder::Given)
            .map_err(|source| ReclaimError::Free {
                pages: pages.len(),
                source,
            })?;
    }
    let rows = rows
        .into_iter()
        .map(|row| {
            let assigned_to = cache.req_to_token.assigned_to(row);
            cache
                .req_to_token
                .free(row)
                .expect("an unclaimed row is held");
            (row, assigned_to)
        })
        .collect();
    if let Some(tree) = cache.tree.radix_mut() {
        tree.release_leaked_locks(&locks);
    }
    let reclaimed = Reclaimed { rows, pages, locks };
    if !reclaimed.is_empty() {
        // Every request that held something here and was left out named the old name.
        let old = std::mem::replace(&mut cache.id, CacheId::next());
        cache.retired_ids.push(old);
        for req in &mut live {
            if req.kv().kv_cache() == Some(old) {
                req.kv_mut().set_kv_cache(owner, Some(cache.id));
            }
        }
    }
    Ok(reclaimed)
}
