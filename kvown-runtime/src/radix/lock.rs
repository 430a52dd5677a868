//! Locks: pinning a node and its path against eviction.
//!
//! A node's `lock_ref` counts the locks held on it or on any descendant, so it never exceeds its
//! parent's; `own_locks` counts those taken on the node itself, the only ones an unlock of it
//! may release. Its tokens count as protected while `lock_ref > 0` and as evictable otherwise;
//! they move only when `lock_ref` crosses between 0 and 1. The root holds one lock forever.

use super::node::NodeId;
use super::{RadixCache, RadixError};

impl RadixCache {
    /// Locks `node` and every ancestor: none of them can be evicted until the matching
    /// [`RadixCache::dec_lock_ref`]. Locking the root does nothing.
    ///
    /// Cost: O(nodes on the path).
    ///
    /// # Errors
    /// [`RadixError::UnknownNode`] for a handle that names no node (evicted, or of another
    /// cache), and [`RadixError::LockLimit`] when a node of the path already counts `u32::MAX`
    /// locks; nothing changes.
    pub fn inc_lock_ref(&mut self, node: NodeId) -> Result<(), RadixError> {
        self.ensure_live(node)?;
        self.lock_path(node, NodeId::ROOT)?;
        self.count_own_lock(node, true);
        Ok(())
    }

    /// Releases one lock taken by [`RadixCache::inc_lock_ref`] on `node`.
    ///
    /// Cost: O(nodes on the path).
    ///
    /// # Errors
    /// [`RadixError::LockUnderflow`] (changing nothing) when no lock was taken on `node` itself
    /// (one held on a descendant is that node's to release).
    pub fn dec_lock_ref(&mut self, node: NodeId) -> Result<(), RadixError> {
        self.ensure_unlockable(node)?;
        self.unlock_path(node, NodeId::ROOT);
        self.count_own_lock(node, false);
        Ok(())
    }

    /// Moves one lock from `from` to `to`: the same as `inc_lock_ref(to)` then
    /// `dec_lock_ref(from)`, but touching only the nodes below their deepest common ancestor.
    ///
    /// Cost: O(nodes between the two and their common ancestor); O(1) when `to` is `from` (as
    /// after registering one more page in the caller's own leaf) or its child.
    ///
    /// # Errors
    /// As [`RadixCache::dec_lock_ref`] on `from`, or as [`RadixCache::inc_lock_ref`] on `to`;
    /// nothing changes.
    pub fn move_lock(&mut self, from: NodeId, to: NodeId) -> Result<(), RadixError> {
        self.ensure_unlockable(from)?;
        if from == to {
            // Registering a page in the caller's own leaf: the lock stays where it is.
            return Ok(());
        }
        self.ensure_live(to)?;
        let common = self.common_ancestor(from, to);
        self.lock_path(to, common)?;
        self.unlock_path(from, common);
        self.count_own_lock(to, true);
        self.count_own_lock(from, false);
        Ok(())
    }

    /// Refuses a `node` that is unknown or holds no lock of its own: the checks of
    /// [`RadixCache::dec_lock_ref`], changing nothing.
    #[inline]
    pub(crate) fn ensure_unlockable(&self, node: NodeId) -> Result<(), RadixError> {
        self.ensure_live(node)?;
        if self.arena[node].own_locks == 0 {
            return Err(RadixError::LockUnderflow { node });
        }
        Ok(())
    }

    /// Releases leaked locks, as the checker found them ([`crate::check::reclaim_leaks`]):
    /// `count` locks taken on each `node` itself, with their paths.
    pub(crate) fn release_leaked_locks(&mut self, leaked: &[(NodeId, usize)]) {
        for &(node, count) in leaked {
            for _ in 0..count {
                self.unlock_path(node, NodeId::ROOT);
            }
            self.arena[node].own_locks -= count as u32;
        }
    }

    /// Counts a lock `taken` on (or released from) `node` itself; the root's one lock stays.
    fn count_own_lock(&mut self, node: NodeId, taken: bool) {
        if node != NodeId::ROOT {
            let own = &mut self.arena[node].own_locks;
            if taken {
                *own += 1;
            } else {
                *own -= 1;
            }
        }
    }

    /// Increments the lock count of `node` and its ancestors below `stop`, or refuses with
    /// [`RadixError::LockLimit`], changing nothing, when one of them already counts `u32::MAX`
    /// locks (the counts are checked as the walk goes: the nodes it passed are unlocked again,
    /// which is rare, instead of every lock walking the path twice).
    fn lock_path(&mut self, mut node: NodeId, stop: NodeId) -> Result<(), RadixError> {
        let start = node;
        while node != stop && node != NodeId::ROOT {
            let entry = &mut self.arena[node];
            if entry.lock_ref == u32::MAX {
                let locks = entry.lock_ref;
                self.unlock_path(start, node);
                return Err(RadixError::LockLimit { node, locks });
            }
            if entry.lock_ref == 0 {
                let tokens = entry.len(self.layout);
                self.sizes.evictable -= tokens;
                self.sizes.protected += tokens;
            }
            entry.lock_ref += 1;
            let parent = entry.parent;
            self.refresh_candidate(node);
            node = parent;
        }
        Ok(())
    }

    /// Decrements the lock count of `node` and its ancestors below `stop` (all at least 1, as
    /// `node`'s is).
    fn unlock_path(&mut self, mut node: NodeId, stop: NodeId) {
        while node != stop && node != NodeId::ROOT {
            let entry = &mut self.arena[node];
            entry.lock_ref -= 1;
            let parent = entry.parent;
            if entry.lock_ref == 0 {
                let tokens = entry.len(self.layout);
                self.sizes.protected -= tokens;
                self.sizes.evictable += tokens;
                // Only a locked node is extended in place: its spare capacity goes back.
                self.arena.shrink_to_fit(node);
            }
            self.refresh_candidate(node);
            node = parent;
        }
    }

    /// Deepest node on both root paths. Walks up from whichever side ends deeper; a node ends
    /// strictly deeper than its parent, so the walks meet at the common ancestor.
    fn common_ancestor(&self, mut a: NodeId, mut b: NodeId) -> NodeId {
        while a != b {
            let end_a = self.arena[a].end(self.layout);
            let end_b = self.arena[b].end(self.layout);
            if end_a >= end_b {
                a = self.arena[a].parent;
            }
            if end_b >= end_a {
                b = self.arena[b].parent;
            }
        }
        a
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Insert, RadixCache, RadixConfig, RadixError};
    use crate::alloc::{PagedAllocator, SlotCalls};

    /// A node whose count reached `u32::MAX` (2^32 - 1 `inc_lock_ref` calls, set directly here)
    /// refuses one more lock, on it or below it, changing nothing; the counts never wrap.
    #[test]
    fn a_lock_at_the_counters_limit_is_refused_and_changes_nothing() {
        let mut allocator = PagedAllocator::new(64, 4, false).unwrap();
        let mut cache = RadixCache::new(RadixConfig::new(4)).unwrap();
        let mut slots = Vec::new();
        allocator.alloc(8, &mut slots).unwrap();
        let top = cache
            .insert(Insert::new(&[1, 2, 3, 4], &slots[..4]))
            .unwrap()
            .last_node;
        let below = cache
            .insert(Insert::new(&[1, 2, 3, 4, 5, 6, 7, 8], &slots))
            .unwrap()
            .last_node;
        cache.inc_lock_ref(top).unwrap();
        cache.arena[top].lock_ref = u32::MAX;
        cache.arena[top].own_locks = u32::MAX;
        let sizes = cache.sizes();
        for node in [top, below] {
            assert_eq!(
                cache.inc_lock_ref(node),
                Err(RadixError::LockLimit {
                    node: top,
                    locks: u32::MAX
                })
            );
        }
        let message = cache.inc_lock_ref(top).unwrap_err().to_string();
        assert!(message.contains("dec_lock_ref"), "{message}");
        assert_eq!(cache.sizes(), sizes);
        // Moving a lock onto the path is refused the same way, the lock staying where it was.
        let mut other_slots = Vec::new();
        allocator.alloc(4, &mut other_slots).unwrap();
        let other = cache
            .insert(Insert::new(&[9, 9, 9, 9], &other_slots))
            .unwrap()
            .last_node;
        cache.inc_lock_ref(other).unwrap();
        let sizes = cache.sizes();
        assert!(matches!(
            cache.move_lock(other, below),
            Err(RadixError::LockLimit { node, .. }) if node == top
        ));
        assert_eq!(cache.arena[other].own_locks, 1);
        assert_eq!(cache.arena[top].lock_ref, u32::MAX);
        assert_eq!(cache.arena[below].lock_ref, 0);
        assert_eq!(cache.sizes(), sizes);
        // Releasing one makes room for one.
        cache.dec_lock_ref(top).unwrap();
        cache.inc_lock_ref(below).unwrap();
        assert_eq!(cache.arena[top].lock_ref, u32::MAX);
    }
}
