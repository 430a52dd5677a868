//! Eviction: freeing the victims the eviction order chose through the allocator.
//!
//! The order ([`super::order`]) plans an eviction before anything changes. Then each victim's
//! pages are freed with one allocator call and the node deleted, victim after victim (sglang
//! `RadixCache.evict`). An allocator that refuses a victim's pages leaves it and the later
//! victims cached.

use std::ops::Range;

use super::node::NodeId;
use super::order::{EvictionPlan, Victim};
use super::{RadixCache, RadixError};
use crate::alloc::{AllocError, FreeOrder, KvAllocator, PageId};
use crate::shared_error::PageSizeMismatch;

impl RadixCache {
    /// Evicts at least `num_tokens` tokens if that many are evictable, in the order of the
    /// cache's [`super::EvictionPolicy`] (least recently used leaf first by default), and returns
    /// the tokens evicted. To evict only what the allocator lacks for `n` more slots (sglang
    /// `evict_from_tree_cache`), ask for `n.saturating_sub(alloc.available_size())`.
    ///
    /// Whole nodes are evicted, so the result may exceed `num_tokens`; it is smaller only when
    /// everything evictable is gone. Locked nodes are never touched. A parent left without
    /// children and unlocked becomes a candidate in the same call, with the latest access time,
    /// the highest priority and the sum of the hits of it and its evicted children. A leaf that
    /// a running request grew in place is evicted registration by registration, newest first,
    /// the rest competing again with the figures of the registration that now ends it.
    ///
    /// The victims are chosen first; then each one's pages are freed with one
    /// `alloc.free_page_ids(pages)` call, in key order, and the node deleted, victim after
    /// victim in eviction order (a grown leaf's registrations one call each), so a LIFO
    /// allocator reuses the last victim's pages first. sglang `RadixCache.evict`.
    ///
    /// ```
    /// use kvown_runtime::alloc::{KvAllocator, PagedAllocator, SlotCalls};
    /// use kvown_runtime::radix::{Insert, RadixCache, RadixConfig};
    ///
    /// let mut allocator = PagedAllocator::new(16, 4, false)?;
    /// let mut tree = RadixCache::new(RadixConfig::new(4))?;
    /// let mut slots = Vec::new();
    /// allocator.alloc(12, &mut slots)?; // 3 of the 4 pages
    /// tree.insert(Insert::new(&[1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3], &slots))?;
    /// // 8 more slots: the allocator has 4, so evict the 4 it lacks (a whole page).
    /// let wanted = 8usize.saturating_sub(allocator.available_size());
    /// assert_eq!(tree.evict(wanted, &mut allocator)?, 12, "the whole leaf goes");
    /// assert_eq!(allocator.available_size(), 16);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// Cost: O(log leaves + node tokens) per evicted node, amortized: the eviction order is kept
    /// across calls.
    ///
    /// # Errors
    /// [`RadixError::PageSizeMismatch`], evicting nothing; [`RadixError::Free`] when the
    /// allocator refuses a victim's pages: the victims freed before it stay evicted (the error
    /// counts their tokens), that one and the rest stay cached, and the tree and the allocator
    /// agree.
    pub fn evict<A: KvAllocator + ?Sized>(
        &mut self,
        num_tokens: usize,
        alloc: &mut A,
    ) -> Result<usize, RadixError> {
        let page_size = self.layout.page_size();
        if alloc.page_size() != page_size {
            return Err(RadixError::PageSizeMismatch(PageSizeMismatch {
                cache: page_size,
                allocator: alloc.page_size(),
            }));
        }
        if num_tokens == 0 {
            return Ok(0);
        }
        let mut plan = self.order.plan(&self.arena, self.layout, num_tokens);
        let result = self.free_victims(&mut plan, alloc);
        self.order.finish(plan, result.is_err());
        result
    }

    /// Frees and deletes the victims of `plan` in order, one allocator call per node sglang
    /// would delete (a grown leaf's registration is one); returns the tokens of the plan.
    fn free_victims<A: KvAllocator + ?Sized>(
        &mut self,
        plan: &mut EvictionPlan,
        alloc: &mut A,
    ) -> Result<usize, RadixError> {
        let tokens = plan.tokens();
        let page_size = self.layout.page_size();
        let (victims, pages) = plan.victims();
        let mut evicted = 0;
        for &victim in victims {
            let result = match victim {
                Victim::Node(node) => {
                    let range = 0..self.arena.registration_end(node, 0, self.layout);
                    let freed = self.free_pages(node, range, alloc, pages);
                    if freed.is_ok() {
                        self.remove_leaf(node);
                    }
                    freed
                }
                Victim::Registrations { node, kept, had } => {
                    self.free_registrations(node, kept as usize, had as usize, alloc, pages)
                }
            };
            match result {
                Ok(freed) => evicted += freed * page_size,
                Err((freed, source)) => {
                    return Err(RadixError::Free {
                        tokens,
                        evicted: evicted + freed * page_size,
                        source,
                    });
                }
            }
        }
        Ok(tokens)
    }

    /// Frees pages `range` of `node` in key order with one allocator call (sglang's `evict`
    /// frees each node's value with one `free_segment`); returns how many, or the refusal.
    fn free_pages<A: KvAllocator + ?Sized>(
        &self,
        node: NodeId,
        range: Range<usize>,
        alloc: &mut A,
        buffer: &mut Vec<PageId>,
    ) -> Result<usize, (usize, AllocError)> {
        let entry = &self.arena[node];
        buffer.clear();
        buffer.extend(range.map(|page| entry.page_id(page, self.layout)));
        alloc
            .free_page_ids(buffer, FreeOrder::Given)
            .map(|()| buffer.len())
            .map_err(|source| (0, source))
    }

    /// Frees registrations `kept + 1..=had` of the grown leaf `node`, newest first, one
    /// allocator call each, and forgets them; returns the pages freed. When the allocator
    /// refuses one, the newer ones stay freed and forgotten, and the refusal comes back with
    /// their pages.
    fn free_registrations<A: KvAllocator + ?Sized>(
        &mut self,
        node: NodeId,
        kept: usize,
        had: usize,
        alloc: &mut A,
        buffer: &mut Vec<PageId>,
    ) -> Result<usize, (usize, AllocError)> {
        let mut freed = 0;
        for index in (kept + 1..=had).rev() {
            let end = |index| self.arena.registration_end(node, index, self.layout);
            let range = end(index - 1)..end(index);
            if let Err((_, source)) = self.free_pages(node, range, alloc, buffer) {
                if index < had {
                    self.remove_registrations(node, index);
                }
                return Err((freed, source));
            }
            freed += buffer.len();
        }
        self.remove_registrations(node, kept);
        Ok(freed)
    }

    /// Forgets all but the first `kept` earlier registrations of the evictable grown leaf
    /// `node`, whose pages the caller has freed: the leaf keeps the pages up to where
    /// registration `kept` ends, with its figures having absorbed the removed ones', and
    /// competes again at its new rank.
    fn remove_registrations(&mut self, node: NodeId, kept: usize) {
        let layout = self.layout;
        let keep = self.arena.registration_end(node, kept, layout);
        self.arena.drop_registrations(node, kept);
        self.record_removed(node, keep);
        let entry = &mut self.arena[node];
        for page in keep..entry.num_pages(layout) {
            self.pages.remove(entry.page_id(page, layout));
        }
        let tokens = entry.len(layout) - keep * layout.page_size();
        entry
            .data
            .truncate(layout.key_words(keep * layout.page_size()));
        // Halving keeps the copies amortized O(1) per page, as the growth's doubling does.
        if entry.data.capacity() > 2 * entry.data.len() {
            entry.data.shrink_to_fit();
        }
        self.sizes.evictable -= tokens;
        self.order.rank_again(&self.arena, node);
    }

    /// Deletes the evictable leaf `leaf`; its parent becomes a candidate when it is left an
    /// unlocked leaf. The parent inherits the leaf's access time when newer and absorbs its hits
    /// and priority ([`super::policy::NodeStats::absorb`]).
    fn remove_leaf(&mut self, leaf: NodeId) {
        self.record_removed(leaf, 0);
        self.order.set_candidate(&mut self.arena, leaf, false);
        self.children.unlink(&mut self.arena, self.layout, leaf);
        let entry = &self.arena[leaf];
        for page in entry.page_ids(self.layout) {
            self.pages.remove(page);
        }
        let (tokens, parent, last_access) =
            (entry.len(self.layout), entry.parent, entry.last_access);
        let stats = *self.arena.stats(leaf);
        self.sizes.evictable -= tokens;
        self.arena.release(leaf);
        let parent_entry = &mut self.arena[parent];
        parent_entry.child_count -= 1;
        parent_entry.last_access = parent_entry.last_access.max(last_access);
        self.arena.stats_mut(parent).absorb(&stats);
        self.refresh_candidate(parent);
    }
}
