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
        self.lock(node, NodeId::ROOT)
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
        self.unlock(node, NodeId::ROOT);
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
        self.lock(to, common)?;
        self.unlock(from, common);
        Ok(())
    }

    /// Refuses a `node` that is unknown or holds no lock of its own: the checks of
    /// [`RadixCache::dec_lock_ref`], changing nothing.
    #[inline]
    pub(crate) fn ensure_unlockable(&self, node: NodeId) -> Result<(), RadixError> {
        self.ensure_live(node)?;
        if self.arena[node].locks().1 == 0 {
            return Err(RadixError::LockUnderflow { node });
        }
        Ok(())
    }

    /// Releases leaked locks, as the checker found them ([`crate::check::reclaim_leaks`]):
    /// `count` locks taken on each `node` itself, with their paths.
    pub(crate) fn release_leaked_locks(&mut self, leaked: &[(NodeId, usize)]) {
        for &(node, count) in leaked {
            for _ in 0..count {
                self.unlock(node, NodeId::ROOT);
            }
        }
    }

    /// Takes one lock on `node` itself, counted on the path below `stop` ([`Arena::lock`](super::node::Arena::lock)),
    /// keeping the eviction candidates current; [`RadixError::LockLimit`], changing nothing,
    /// when a node of the path already counts `u32::MAX` locks.
    fn lock(&mut self, node: NodeId, stop: NodeId) -> Result<(), RadixError> {
        let RadixCache {
            layout,
            arena,
            order,
            sizes,
            ..
        } = self;
        arena
            .lock(node, stop, *layout, sizes, |arena, id| {
                order.refresh(arena, id)
            })
            .map_err(|(node, locks)| RadixError::LockLimit { node, locks })
    }

    /// Releases one lock taken on `node` itself, uncounted on the path below `stop`
    /// ([`Arena::unlock`](super::node::Arena::unlock)), keeping the eviction candidates current.
    fn unlock(&mut self, node: NodeId, stop: NodeId) {
        let RadixCache {
            layout,
            arena,
            order,
            sizes,
            ..
        } = self;
        arena.unlock(node, stop, *layout, sizes, |arena, id| {
            order.refresh(arena, id)
        });
    }

    /// Deepest node on both root paths. Walks up from whichever side ends deeper; a node ends
    /// strictly deeper than its parent, so the walks meet at the common ancestor.
    fn common_ancestor(&self, mut a: NodeId, mut b: NodeId) -> NodeId {
        while a != b {
            let end_a = self.arena[a].end(self.layout);
            let end_b = self.arena[b].end(self.layout);
            if end_a >= end_b {
                a = self.arena[a].parent();
            }
            if end_b >= end_a {
                b = self.arena[b].parent();
            }
        }
        a
    }
}
