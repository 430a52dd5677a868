//! The invariant check: every counter and index recomputed from the nodes.

use std::collections::HashSet;

use super::node::{NOT_EVICTABLE, NodeId};
use super::{RadixCache, RadixError, TreePos};
use crate::ids::KvSlot;

/// Which part of a request's protected prefix differs from the path its lock holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrefixPart {
    /// The request's token.
    Token,
    /// The request's slot: in its row, or among the matched slots it has yet to write there.
    Slot,
}

impl std::fmt::Display for PrefixPart {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            PrefixPart::Token => "token",
            PrefixPart::Slot => "slot",
        })
    }
}

/// Returns an [`RadixError::Inconsistent`] at `node` unless `expected == found`.
fn expect_eq(
    node: NodeId,
    what: &'static str,
    expected: usize,
    found: usize,
) -> Result<(), RadixError> {
    if expected == found {
        Ok(())
    } else {
        Err(RadixError::Inconsistent {
            node,
            what,
            expected,
            found,
        })
    }
}

impl RadixCache {
    /// Recomputes the bookkeeping from the nodes and compares: evictable, protected and total
    /// token counters; child counts and the child index (each child found under its parent by
    /// its namespace and first page, nothing else indexed; a node's namespace its parent's below
    /// the root); positions (each key starts where its parent's
    /// ends, whole pages only); lock counts (root 1, every other its own locks plus the sum of
    /// its children's); the evictable-leaf set and its eviction order (an entry at each candidate's
    /// rank); a grown leaf's registrations in order inside it; no page cached twice, and the
    /// page index holding exactly the cached pages; with events on, each cached page's recorded
    /// hash that of its path.
    ///
    /// Cost: O(cached pages + nodes); meant for tests and debug builds.
    pub fn check(&self) -> Result<(), RadixError> {
        let layout = self.layout;
        let page_size = layout.page_size();
        let stride = page_size + 1;
        let root = &self.arena[NodeId::ROOT];
        expect_eq(NodeId::ROOT, "root lock count", 1, root.lock_ref as usize)?;
        expect_eq(NodeId::ROOT, "root key length", 0, root.data.len())?;
        let mut child_counts = vec![0usize; self.arena.entries()];
        let mut child_locks = vec![0usize; self.arena.entries()];
        let mut pages = HashSet::new();
        let order_entries: HashSet<_> = self.order.iter().map(|entry| entry.0).collect();
        let (mut evictable, mut protected, mut live, mut evictable_leaves) = (0, 0, 0, 0);
        for (id, node) in self.arena.live().filter(|&(id, _)| id != NodeId::ROOT) {
            live += 1;
            let parent = &self.arena[node.parent];
            expect_eq(
                id,
                "parent is live",
                1,
                usize::from(self.arena.is_live(node.parent)),
            )?;
            expect_eq(
                id,
                "key is non-empty",
                1,
                usize::from(!node.data.is_empty()),
            )?;
            expect_eq(id, "key is whole pages", 0, node.data.len() % stride)?;
            expect_eq(id, "key start", parent.end(layout), node.start())?;
            if node.parent != NodeId::ROOT {
                expect_eq(
                    id,
                    "namespace is the parent's",
                    1,
                    usize::from(node.namespace == parent.namespace),
                )?;
            }
            let found = self.children.find(
                &self.arena,
                layout,
                node.parent,
                node.namespace,
                node.page_tokens(0, layout),
            );
            expect_eq(
                id,
                "child index entry",
                id.index(),
                found.map_or(usize::MAX, NodeId::index),
            )?;
            if let Some(wrong) = self.registration_inconsistency(id) {
                expect_eq(id, wrong, 1, 0)?;
            }
            child_counts[node.parent.index()] += 1;
            child_locks[node.parent.index()] += node.lock_ref as usize;
            if node.lock_ref == 0 {
                evictable += node.len(layout);
            } else {
                protected += node.len(layout);
            }
            for page in node.page_ids(layout) {
                expect_eq(id, "page cached once", 1, usize::from(pages.insert(page)))?;
                expect_eq(
                    id,
                    "page indexed",
                    1,
                    usize::from(self.pages.contains(page)),
                )?;
            }
        }
        for (id, node) in self.arena.live() {
            expect_eq(
                id,
                "child count",
                child_counts[id.index()],
                node.child_count as usize,
            )?;
            if id != NodeId::ROOT {
                expect_eq(
                    id,
                    "lock count is own locks plus children's",
                    node.own_locks as usize + child_locks[id.index()],
                    node.lock_ref as usize,
                )?;
            }
            let evictable_leaf = id != NodeId::ROOT && node.lock_ref == 0 && node.child_count == 0;
            let listed = node.leaf_pos != NOT_EVICTABLE
                && self.evictable_leaves.get(node.leaf_pos as usize) == Some(&id);
            evictable_leaves += usize::from(evictable_leaf);
            if evictable_leaf {
                expect_eq(
                    id,
                    "eviction-order entry at the leaf's rank",
                    1,
                    usize::from(order_entries.contains(&(self.rank(id), id))),
                )?;
            }
            expect_eq(
                id,
                "evictable-leaf set membership",
                usize::from(evictable_leaf),
                usize::from(listed),
            )?;
        }
        let root = NodeId::ROOT;
        expect_eq(
            root,
            "indexed children",
            live,
            self.children.indexed(&self.arena),
        )?;
        expect_eq(
            root,
            "evictable-leaf set size",
            evictable_leaves,
            self.evictable_leaves.len(),
        )?;
        expect_eq(root, "indexed pages", pages.len(), self.pages.len())?;
        self.check_event_hashes()?;
        expect_eq(root, "evictable tokens", evictable, self.evictable_size)?;
        expect_eq(root, "protected tokens", protected, self.protected_size)?;
        expect_eq(root, "total tokens", evictable + protected, self.total_size)
    }
}

impl RadixCache {
    /// The first position of the path `[0, at.len)` at which `tokens` or `slots` differ from
    /// the tree's (the token where both do; a side that ends early differs where it ends), or
    /// `None` when both agree with it. Fails when `at` is not a live position.
    ///
    /// Cost: O(at.len + nodes on the path); for the cache-level checker.
    pub(crate) fn path_difference(
        &self,
        at: TreePos,
        tokens: &[u32],
        slots: &[KvSlot],
    ) -> Result<Option<(usize, PrefixPart)>, RadixError> {
        let layout = self.layout;
        let page_size = layout.page_size();
        // The path's nodes with the part of each key on it, root side first.
        let mut path = Vec::new();
        let (mut node, mut end) = (self.node_at(at, at.len)?, at.len);
        while end > 0 {
            let entry = &self.arena[node];
            path.push((node, entry.start(), end));
            end = entry.start();
            node = entry.parent;
        }
        for &(node, start, end) in path.iter().rev() {
            let entry = &self.arena[node];
            for page in 0..(end - start) / page_size {
                let first_slot = entry.page_id(page, layout) as usize * page_size;
                let first = start + page * page_size;
                for (offset, &token) in entry.page_tokens(page, layout).iter().enumerate() {
                    let position = first + offset;
                    if tokens.get(position) != Some(&token) {
                        return Ok(Some((position, PrefixPart::Token)));
                    }
                    if slots.get(position).map(|&slot| slot as usize) != Some(first_slot + offset) {
                        return Ok(Some((position, PrefixPart::Slot)));
                    }
                }
            }
        }
        Ok(None)
    }
}

/// A node whose lock count differs from the locks the given holders account for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LockMismatch {
    /// The deepest such node.
    pub(crate) node: NodeId,
    /// Its lock count.
    pub(crate) locks: usize,
    /// The holders' locks on it and below it.
    pub(crate) held: usize,
}

impl RadixCache {
    /// Checks that the lock counts are exactly the locks of `holders` (one lock each, on the
    /// node given, the root ignored): every non-root node's count equals the holders at it or
    /// below it. Returns the deepest node where they differ.
    ///
    /// Cost: O(nodes + holders × depth); for the cache-level checker.
    pub(crate) fn check_lock_holders(
        &self,
        holders: impl IntoIterator<Item = NodeId>,
    ) -> Result<(), LockMismatch> {
        let held = self.held_locks(holders);
        let mismatch = self
            .arena
            .live()
            .filter(|&(id, node)| id != NodeId::ROOT && node.lock_ref as usize != held[id.index()])
            .max_by_key(|&(_, node)| node.start());
        match mismatch {
            None => Ok(()),
            Some((node, entry)) => Err(LockMismatch {
                node,
                locks: entry.lock_ref as usize,
                held: held[node.index()],
            }),
        }
    }

    /// The locks `holders` (one each, on the node given) account for on every node, indexed by
    /// arena entry: the holders at the node or below it. Unknown holders count nowhere.
    pub(super) fn held_locks(&self, holders: impl IntoIterator<Item = NodeId>) -> Vec<usize> {
        let mut held = vec![0usize; self.arena.entries()];
        for holder in holders {
            let mut node = holder;
            while node != NodeId::ROOT && self.arena.is_live(node) {
                held[node.index()] += 1;
                node = self.arena[node].parent;
            }
        }
        held
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::radix::Namespace;

    /// Page size 2: `[0, 1 | 2, 3]` on pages 1 and 2, then `[0, 1 | 9, 9]` on page 3 splits it
    /// into a shared node (page 1) with two leaves, the first locked.
    fn small_tree() -> (RadixCache, NodeId) {
        let mut cache = RadixCache::new(2);
        let locked = cache
            .insert(&[0, 1, 2, 3], &[2, 3, 4, 5])
            .unwrap()
            .last_node;
        cache.insert(&[0, 1, 9, 9], &[2, 3, 6, 7]).unwrap();
        cache.inc_lock_ref(locked).unwrap();
        cache.check().unwrap();
        (cache, locked)
    }

    /// The `what` of the check's [`RadixError::Inconsistent`].
    fn broken(cache: &RadixCache) -> &'static str {
        match cache.check() {
            Err(RadixError::Inconsistent { what, .. }) => what,
            other => panic!("expected an inconsistency, got {other:?}"),
        }
    }

    #[test]
    fn the_check_finds_a_counter_off() {
        let (mut cache, _) = small_tree();
        cache.evictable_size += 2;
        assert_eq!(broken(&cache), "evictable tokens");
        let (mut cache, _) = small_tree();
        cache.protected_size -= 2;
        assert_eq!(broken(&cache), "protected tokens");
    }

    #[test]
    fn the_check_finds_a_lock_count_below_its_childrens() {
        let (mut cache, locked) = small_tree();
        let shared = cache.arena[locked].parent;
        cache.arena[shared].lock_ref = 0;
        // Its page moves from protected to evictable, as an unlock would count it.
        cache.protected_size -= 2;
        cache.evictable_size += 2;
        assert_eq!(broken(&cache), "lock count is own locks plus children's");
    }

    #[test]
    fn the_check_finds_a_child_count_off_and_a_page_cached_twice() {
        let (mut cache, locked) = small_tree();
        let shared = cache.arena[locked].parent;
        cache.arena[shared].child_count += 1;
        assert_eq!(broken(&cache), "child count");
        let (mut cache, locked) = small_tree();
        // The locked leaf claims the shared node's page id.
        let page_id = cache.arena[locked].data.len() - 1;
        cache.arena[locked].data[page_id] = 1;
        assert_eq!(broken(&cache), "page cached once");
    }

    #[test]
    fn the_check_finds_a_node_in_another_namespace_than_its_parent_or_its_index_entry() {
        let (mut cache, locked) = small_tree();
        // Unlinked and linked again in its new namespace, so that the index agrees with it.
        cache
            .children
            .unlink(&mut cache.arena, cache.layout, locked);
        cache.arena[locked].namespace = Namespace(1);
        cache.children.link(&mut cache.arena, cache.layout, locked);
        assert_eq!(broken(&cache), "namespace is the parent's");
        // A child of the root in another namespace than the one it is indexed under.
        let mut cache = RadixCache::new(2);
        let leaf = cache.insert(&[0, 1], &[2, 3]).unwrap().last_node;
        cache.arena[leaf].namespace = Namespace(1);
        assert_eq!(broken(&cache), "child index entry");
    }

    #[test]
    fn the_check_finds_a_page_index_that_differs_from_the_nodes() {
        let (mut cache, _) = small_tree();
        cache.pages.remove(3);
        assert_eq!(broken(&cache), "page indexed");
        let (mut cache, _) = small_tree();
        cache.pages.insert(40);
        assert_eq!(broken(&cache), "indexed pages");
    }

    #[test]
    fn the_check_finds_a_leaf_pointing_at_another_leafs_place_in_the_evictable_set() {
        let (mut cache, locked) = small_tree();
        let shared = cache.arena[locked].parent;
        let evictable = cache.evictable_leaves[0];
        assert_ne!(evictable, locked);
        cache.dec_lock_ref(locked).unwrap();
        // Both leaves are evictable now; the second claims the first's slot in the set.
        let second = cache.arena[locked].leaf_pos;
        cache.arena[locked].leaf_pos = cache.arena[evictable].leaf_pos;
        cache.evictable_leaves[second as usize] = shared;
        assert_eq!(broken(&cache), "evictable-leaf set membership");
    }

    #[test]
    fn leaked_locks_are_found_where_they_were_taken_and_released_exactly() {
        // Besides the holder's lock on the leaf: a second lock on the leaf and two on the
        // shared node above it, none of them accounted for.
        let (mut cache, locked) = small_tree();
        let shared = cache.arena[locked].parent;
        cache.inc_lock_ref(locked).unwrap();
        cache.inc_lock_ref(shared).unwrap();
        cache.inc_lock_ref(shared).unwrap();
        let leaked = cache.leaked_locks([locked]).unwrap();
        assert_eq!(leaked, vec![(locked, 1), (shared, 2)], "deepest first");

        cache.release_leaked_locks(&leaked);
        cache.check().unwrap();
        cache.check_lock_holders([locked]).unwrap();
        assert_eq!(cache.leaked_locks([locked]).unwrap(), vec![]);
        assert_eq!(cache.protected_size, 4, "the holder's path stays locked");

        // Holders claiming more locks than the tree gave: the deepest short node is named.
        assert_eq!(
            cache.leaked_locks([locked, locked]),
            Err(LockMismatch {
                node: locked,
                locks: 1,
                held: 2,
            })
        );
        // Without holders every lock is leaked, and releasing them all unlocks the tree.
        let all = cache.leaked_locks([]).unwrap();
        assert_eq!(all, vec![(locked, 1)]);
        cache.release_leaked_locks(&all);
        cache.check().unwrap();
        assert_eq!(cache.protected_size, 0);
    }
}
