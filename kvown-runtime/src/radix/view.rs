//! A read-only view of a tree, for the checker in [`crate::check`]: what each node holds,
//! without a way to change it, and a check of the bookkeeping beside the nodes (registrations,
//! indexes, eviction order) by the owner of each part, each of which knows its own invariant.

use super::node::{Node, NodeId};
use super::{RadixCache, RadixError};
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

    /// Checks the bookkeeping beside the nodes against them, each part by its owner: grown
    /// leaves' registrations ([`Arena::misordered_registrations`](super::node::Arena::misordered_registrations)),
    /// the child index ([`ChildIndex::check`](super::children::ChildIndex::check)), the eviction
    /// order ([`EvictionOrder::check`](super::order::EvictionOrder::check)), the event log's
    /// page hashes ([`RadixCache::check_event_hashes`]), and the page index, which must hold
    /// exactly the cached pages.
    ///
    /// # Errors
    /// [`RadixError::Inconsistent`] naming the first node and invariant found broken ("page
    /// indexed" at a node whose page it lacks, "indexed pages" at the root when it holds
    /// more).
    pub(crate) fn check_bookkeeping(&self) -> Result<(), RadixError> {
        if let Some((node, wrong)) = self.arena.misordered_registrations(self.layout) {
            RadixError::expect_eq(node, wrong, 1, 0)?;
        }
        self.children.check(&self.arena, self.layout)?;
        self.order.check(&self.arena)?;
        self.check_event_hashes()?;
        let mut cached = 0;
        for (id, node) in self.arena.live() {
            for page in node.page_ids(self.layout) {
                cached += 1;
                let indexed = usize::from(self.pages.contains(page));
                RadixError::expect_eq(id, "page indexed", 1, indexed)?;
            }
        }
        RadixError::expect_eq(
            NodeId::ROOT,
            "indexed pages",
            cached,
            self.pages.iter().count(),
        )
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
}
