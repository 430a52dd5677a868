//! Reclaiming what requests dropped before their release leaked: their rows, pages and prefix
//! locks, found by the invariant checker's census of the requests still alive.

use std::fmt;

use crate::alloc::{AllocError, AsPageAllocator, KvAllocator, PageId};
use crate::cache::KvCache;
use crate::check::Violation;
use crate::radix::NodeId;
use crate::request::Req;
use crate::slots::ReqRow;

/// What [`KvCache::reclaim_leaks`] gave back.
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

/// Why [`KvCache::reclaim_leaks`] reclaimed nothing. The cache is as it was.
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

impl<A: AsPageAllocator + KvAllocator> KvCache<A> {
    /// Gives back what requests dropped (or lost) before
    /// [`release_kv_cache`](crate::batch::release_kv_cache) still hold: every row that no
    /// request in `live` holds, every page that neither a request in `live` nor the prefix cache
    /// holds, and every prefix lock that no request in `live` accounts for. `live` must be every
    /// request that still holds KV or a prefix lock in this cache, as for
    /// [`KvCache::check`]: a request left out is taken for leaked. Its row, pages and lock are
    /// given back and may go to other requests while its record still names them, so it must
    /// not be passed to the batch flow again (nothing can tell it from the new holder's row).
    ///
    /// All or nothing: the live requests are checked as [`KvCache::check`] checks them, the
    /// leaks are found, and only then are the pages freed (in one call), the rows freed and the
    /// locks released; afterwards [`KvCache::check`] passes for `live`. Pages the leaked
    /// requests had computed are freed, not inserted into the prefix cache: without the request
    /// there is no key. Costs O(pool pages + held positions + tree nodes), as the check.
    ///
    /// ```
    /// use kvown_runtime::alloc::{KvAllocator, PagedAllocator};
    /// use kvown_runtime::batch::{ScheduleBatch, alloc_for_extend, prepare_for_extend};
    /// use kvown_runtime::cache::{KvCache, TreeCache};
    /// use kvown_runtime::request::Req;
    /// use kvown_runtime::slots::ReqToTokenPool;
    ///
    /// let allocator = PagedAllocator::new(64, 4, false)?;
    /// let mut cache = KvCache::new(allocator, ReqToTokenPool::new(4, 32)?, TreeCache::Disabled)?;
    /// let prepared = prepare_for_extend(ScheduleBatch::new(vec![Req::new(7, vec![1; 6])]));
    /// let batch = alloc_for_extend(prepared, &mut cache).map_err(|failure| failure.error)?;
    /// let row = batch.reqs()[0].kv().req_pool_idx();
    /// drop(batch); // request 7 is never released
    ///
    /// let reclaimed = cache.reclaim_leaks([])?;
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
    pub fn reclaim_leaks<'a>(
        &mut self,
        live: impl IntoIterator<Item = &'a Req>,
    ) -> Result<Reclaimed, ReclaimError> {
        let census = self.census(live)?;
        let allocator = self.allocator.page_allocator();
        let rows = census.unclaimed_rows(&self.req_to_token);
        let held_rows = self.req_to_token.size() - self.req_to_token.available_size();
        if held_rows != census.holding + rows.len() {
            // A live request's row is not held, or two live requests name one row.
            return Err(Violation::RowCount {
                held_rows,
                holding: census.holding,
            }
            .into());
        }
        let pages = census.unclaimed_pages(allocator);
        census.check_accounting(allocator, pages.len() * allocator.page_size())?;
        let locks = match self.tree.radix() {
            Some(tree) => tree
                .leaked_locks(census.lock_holders.iter().copied())
                .map_err(Violation::from)?,
            None => Vec::new(),
        };

        // The one step that can fail goes first.
        if !pages.is_empty() {
            self.allocator
                .free_page_ids(&pages)
                .map_err(|source| ReclaimError::Free {
                    pages: pages.len(),
                    source,
                })?;
        }
        let rows = rows
            .into_iter()
            .map(|row| {
                let assigned_to = self.req_to_token.assigned_to(row);
                self.req_to_token
                    .free(row)
                    .expect("an unclaimed row is held");
                (row, assigned_to)
            })
            .collect();
        if let Some(tree) = self.tree.radix_mut() {
            tree.release_leaked_locks(&locks);
        }
        Ok(Reclaimed { rows, pages, locks })
    }
}
