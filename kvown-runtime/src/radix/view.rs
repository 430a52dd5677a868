//! A read-only view of a tree's bookkeeping, for the checker in [`crate::check`]: what each node
//! holds and what the indexes beside the nodes say, without a way to change either.

use std::collections::HashSet;

use super::node::{Node, NodeId};
use super::{Namespace, RadixCache};
use crate::ids::PageId;

/// One live node of a [`RadixCache`], read-only.
#[derive(Clone, Copy)]
pub(crate) struct NodeView<'a> {
    id: NodeId,
    node: &'a Node,
    cache: &'a RadixCache,
}

/// The read-only view of the tree's bookkeeping: its nodes and what the indexes beside them
/// hold.
impl RadixCache {
    /// Every live node, the root first.
    pub(crate) fn node_views(&self) -> impl Iterator<Item = NodeView<'_>> {
        self.arena.live().map(move |(id, node)| NodeView {
            id,
            node,
            cache: self,
        })
    }

    /// The node `id` names, if it is live.
    pub(crate) fn node_view(&self, id: NodeId) -> Option<NodeView<'_>> {
        self.arena.is_live(id).then(|| NodeView {
            id,
            node: &self.arena[id],
            cache: self,
        })
    }

    /// Nodes reachable through the child index, and nodes the eviction order lists as
    /// candidates.
    pub(crate) fn index_sizes(&self) -> (usize, usize) {
        (
            self.children.indexed(&self.arena),
            self.order.candidates().len(),
        )
    }

    /// Live nodes the eviction order holds an entry for at their current rank.
    pub(crate) fn ranked(&self) -> HashSet<NodeId> {
        self.order.ranked(&self.arena)
    }

    /// The pages the page index holds, in increasing order.
    pub(crate) fn indexed_pages(&self) -> impl Iterator<Item = PageId> + '_ {
        self.pages.iter()
    }
}

impl<'a> NodeView<'a> {
    /// The node's handle.
    pub(crate) fn id(self) -> NodeId {
        self.id
    }

    /// Its parent's handle ([`NodeId::ROOT`]'s is no live node).
    pub(crate) fn parent(self) -> NodeId {
        self.node.parent
    }

    /// The key space of its path.
    pub(crate) fn namespace(self) -> Namespace {
        self.node.namespace
    }

    /// Path positions its key spans.
    pub(crate) fn span(self) -> std::ops::Range<usize> {
        self.node.start()..self.node.end(self.cache.layout)
    }

    /// Words its key and page ids take: `page_size + 1` per whole page.
    pub(crate) fn words(self) -> usize {
        self.node.data.len()
    }

    /// Its pages in key order: each page's tokens and page id.
    pub(crate) fn pages(self) -> impl Iterator<Item = (&'a [u32], PageId)> {
        let (node, layout) = (self.node, self.cache.layout);
        (0..node.num_pages(layout))
            .map(move |page| (node.page_tokens(page, layout), node.page_id(page, layout)))
    }

    /// Locks held on it or below it, and those taken on it itself.
    pub(crate) fn locks(self) -> (usize, usize) {
        (self.node.lock_ref as usize, self.node.own_locks as usize)
    }

    /// Its live children, as it counts them.
    pub(crate) fn child_count(self) -> usize {
        self.node.child_count as usize
    }

    /// Whether the child index finds it under its parent by its namespace and first page.
    pub(crate) fn is_indexed(self) -> bool {
        let (cache, node) = (self.cache, self.node);
        node.num_pages(cache.layout) > 0
            && cache.children.find(
                &cache.arena,
                cache.layout,
                node.parent,
                node.namespace,
                node.page_tokens(0, cache.layout),
            ) == Some(self.id)
    }

    /// Whether the eviction order lists it as a candidate (at the place it records).
    pub(crate) fn is_candidate(self) -> bool {
        let candidates = self.cache.order.candidates();
        candidates.get(self.node.leaf_pos as usize) == Some(&self.id)
    }

    /// Its registrations, oldest first: where each ends (in pages of the node) and when it was
    /// created; the last is the node's own (it ends where the node ends). One for a node that
    /// did not grow in place.
    pub(crate) fn registrations(self) -> impl Iterator<Item = (usize, u64)> {
        let (arena, id, layout) = (&self.cache.arena, self.id, self.cache.layout);
        let earlier = (0..arena.registration_count(id)).map(move |index| {
            let (end_page, stats) = arena.registration(id, index);
            (end_page, stats.created)
        });
        earlier.chain(std::iter::once((
            self.node.num_pages(layout),
            arena.stats(id).created,
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Insert, Namespace, RadixCache, RadixConfig, RadixError};
    use super::*;
    use crate::check::check_radix;

    /// Page size 2: `[0, 1 | 2, 3]` on pages 1 and 2, then `[0, 1 | 9, 9]` on page 3 splits it
    /// into a shared node (page 1) with two leaves, the first locked.
    fn small_tree() -> (RadixCache, NodeId) {
        let mut cache = RadixCache::new(RadixConfig::new(2)).unwrap();
        let locked = cache
            .insert(Insert::new(&[0, 1, 2, 3], &[2, 3, 4, 5]))
            .unwrap()
            .last_node;
        cache
            .insert(Insert::new(&[0, 1, 9, 9], &[2, 3, 6, 7]))
            .unwrap();
        cache.inc_lock_ref(locked).unwrap();
        check_radix(&cache).unwrap();
        (cache, locked)
    }

    /// The `what` of the check's [`RadixError::Inconsistent`].
    fn broken(cache: &RadixCache) -> &'static str {
        match check_radix(cache) {
            Err(RadixError::Inconsistent { what, .. }) => what,
            other => panic!("expected an inconsistency, got {other:?}"),
        }
    }

    #[test]
    fn the_check_finds_a_counter_off() {
        let (mut cache, _) = small_tree();
        cache.sizes.evictable += 2;
        assert_eq!(broken(&cache), "evictable tokens");
        let (mut cache, _) = small_tree();
        cache.sizes.protected -= 2;
        assert_eq!(broken(&cache), "protected tokens");
    }

    #[test]
    fn the_check_finds_a_lock_count_below_its_childrens() {
        let (mut cache, locked) = small_tree();
        let shared = cache.arena[locked].parent;
        cache.arena[shared].lock_ref = 0;
        // Its page moves from protected to evictable, as an unlock would count it.
        cache.sizes.protected -= 2;
        cache.sizes.evictable += 2;
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
        let mut cache = RadixCache::new(RadixConfig::new(2)).unwrap();
        let leaf = cache
            .insert(Insert::new(&[0, 1], &[2, 3]))
            .unwrap()
            .last_node;
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
        let evictable = cache.order.candidates()[0];
        assert_ne!(evictable, locked);
        cache.dec_lock_ref(locked).unwrap();
        // Both leaves are evictable now; the second claims the first's place in the set.
        cache.arena[locked].leaf_pos = cache.arena[evictable].leaf_pos;
        cache.order.set_candidate(&mut cache.arena, shared, true);
        assert_eq!(broken(&cache), "evictable-leaf set membership");
    }
}
