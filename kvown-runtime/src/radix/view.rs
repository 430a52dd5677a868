//! A read-only view of a tree's bookkeeping, for the checker in [`crate::check`]: what each node
//! holds and what the indexes beside the nodes say, without a way to change either.

use std::collections::HashSet;

use super::RadixCache;
use super::node::{Node, NodeId};
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
        (self.children.indexed(), self.order.candidates().len())
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

/// A view reads the node's own accessors ([`Node::parent`], [`Node::locks`], ...) directly; its
/// methods are those that need the tree around the node.
impl std::ops::Deref for NodeView<'_> {
    type Target = Node;

    #[inline(always)]
    fn deref(&self) -> &Node {
        self.node
    }
}

impl<'a> NodeView<'a> {
    /// The node's handle.
    pub(crate) fn id(self) -> NodeId {
        self.id
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

    /// Whether the child index finds it under its parent by its namespace and first page.
    pub(crate) fn is_indexed(self) -> bool {
        let (cache, node) = (self.cache, self.node);
        node.num_pages(cache.layout) > 0
            && cache.children.find(
                &cache.arena,
                cache.layout,
                node.parent(),
                node.namespace(),
                node.page_tokens(0, cache.layout),
            ) == Some(self.id)
    }

    /// Whether the eviction order lists it as a candidate (at the place it records).
    pub(crate) fn is_candidate(self) -> bool {
        self.cache.order.lists(self.id)
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
