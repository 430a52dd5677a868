//! Eviction: freeing least-recently-used unlocked leaves through the allocator.

use std::cmp::Reverse;

use super::node::NodeId;
use super::{RadixCache, RadixError};
use crate::alloc::KvAllocator;

impl RadixCache {
    /// Evicts at least `num_tokens` tokens if that many are evictable, least recently used leaf
    /// first, and returns the tokens evicted.
    ///
    /// Whole nodes are evicted, so the result may exceed `num_tokens`; it is smaller only when
    /// everything evictable is gone. Locked nodes are never touched. Each evicted node's pages
    /// are freed with `alloc.free_page_ids(pages)`, in key order, and the node is deleted; a parent
    /// left without children and unlocked becomes a candidate in the same call.
    ///
    /// Cost: O(log leaves + node tokens) per evicted node, amortized: the LRU order is kept
    /// across calls (sglang rebuilds a heap of every leaf on each call).
    ///
    /// # Errors
    /// [`RadixError::PageSizeMismatch`] before anything is evicted; [`RadixError::Free`] when
    /// the allocator refuses a node's pages (that node stays cached, earlier ones are gone).
    pub fn evict<A: KvAllocator + ?Sized>(
        &mut self,
        num_tokens: usize,
        alloc: &mut A,
    ) -> Result<usize, RadixError> {
        if alloc.page_size() != self.page_size {
            return Err(RadixError::PageSizeMismatch {
                cache: self.page_size,
                allocator: alloc.page_size(),
            });
        }
        if num_tokens == 0 {
            return Ok(0);
        }
        let mut evicted = 0;
        while evicted < num_tokens {
            let Some(Reverse((stamp, leaf))) = self.lru.pop() else {
                break;
            };
            if !self.is_current_lru_entry(stamp, leaf) {
                continue;
            }
            let mut pages = std::mem::take(&mut self.free_buffer);
            pages.clear();
            pages.extend(self.arena[leaf].page_ids(self.page_size));
            let freed = alloc.free_page_ids(&pages);
            self.free_buffer = pages;
            if let Err(source) = freed {
                self.lru.push(Reverse((stamp, leaf)));
                return Err(RadixError::Free {
                    node: leaf,
                    evicted,
                    source,
                });
            }
            evicted += self.arena[leaf].len(self.page_size);
            self.remove_leaf(leaf);
        }
        Ok(evicted)
    }

    /// Evicts only what the allocator lacks for `num_tokens` more slots (sglang
    /// `evict_from_tree_cache`): nothing when `available_size() >= num_tokens`, otherwise
    /// `evict(num_tokens - available_size())`. Returns the tokens evicted.
    ///
    /// # Errors
    /// As [`RadixCache::evict`].
    pub fn evict_shortfall<A: KvAllocator + ?Sized>(
        &mut self,
        num_tokens: usize,
        alloc: &mut A,
    ) -> Result<usize, RadixError> {
        let available = alloc.available_size();
        if available >= num_tokens {
            return Ok(0);
        }
        self.evict(num_tokens - available, alloc)
    }

    /// Deletes the evictable leaf `leaf`; its parent becomes a candidate when it is left an
    /// unlocked leaf. The parent inherits the leaf's access time when newer (sglang stamps whole
    /// paths).
    fn remove_leaf(&mut self, leaf: NodeId) {
        self.list_evictable(leaf, false);
        self.children.unlink(&mut self.arena, self.page_size, leaf);
        let entry = &self.arena[leaf];
        let (tokens, parent, last_access) =
            (entry.len(self.page_size), entry.parent, entry.last_access);
        self.evictable_size -= tokens;
        self.total_size -= tokens;
        self.arena.release(leaf);
        let parent_entry = &mut self.arena[parent];
        parent_entry.child_count -= 1;
        parent_entry.last_access = parent_entry.last_access.max(last_access);
        self.refresh_leaf_status(parent);
    }
}
