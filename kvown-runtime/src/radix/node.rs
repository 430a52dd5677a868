//! Tree nodes and the arena that owns them.
//!
//! A node's key and value live in one `Vec<u32>`, page by page: the page's `page_size` token ids
//! followed by its page id. A node therefore costs one vector header plus four bytes per page on
//! top of its key, and the page id sits next to the tokens a match has just compared.

use std::fmt;
use std::ops::{Index, IndexMut};

use super::Namespace;
use super::layout::KeyLayout;
use super::policy::NodeStats;
use super::registrations::Registrations;
use crate::ids::PageId;

/// Handle of one tree node. Stays valid until that node is evicted; a locked node is never
/// evicted, and a split keeps the handle on the lower part, so a handle the caller holds a lock
/// on always names the node where its locked prefix ends.
///
/// A handle carries the generation of its arena entry, which an eviction bumps: a handle kept
/// past its node's eviction is refused with [`RadixError::UnknownNode`](super::RadixError)
/// even after the entry holds another node, instead of naming that node (generations wrap
/// after 2^32 reuses of one entry).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct NodeId {
    index: u32,
    generation: u32,
}

/// One 64-bit word per handle (the derived hash fed the hasher two words: more instructions
/// per eviction, whose plan keys a map by node).
impl std::hash::Hash for NodeId {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        state.write_u64(u64::from(self.index) << 32 | u64::from(self.generation));
    }
}

impl NodeId {
    /// The root: empty key, locked forever, never evicted.
    pub const ROOT: NodeId = NodeId {
        index: 0,
        generation: 0,
    };
    /// No node: the root's parent, the end of a chain, a free-list end.
    pub(super) const NONE: NodeId = NodeId {
        index: u32::MAX,
        generation: 0,
    };

    #[inline(always)]
    pub(super) fn index(self) -> usize {
        self.index as usize
    }

    /// The entry index as stored in the child index's keys.
    #[inline(always)]
    pub(super) fn raw_index(self) -> u32 {
        self.index
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.generation {
            0 => write!(f, "#{}", self.index),
            generation => write!(f, "#{} (generation {generation})", self.index),
        }
    }
}

/// `leaf_pos` of a node that is not in the evictable-leaf set.
pub(super) const NOT_EVICTABLE: u32 = u32::MAX;

/// One node: a run of whole pages on a path from the root.
#[derive(Debug)]
pub(super) struct Node {
    /// Per page: `page_size` token ids, then the page id.
    pub(super) data: Vec<u32>,
    /// Logical time of the last match or insert that ended here, or of a removed child's.
    pub(super) last_access: u64,
    /// `NodeId::NONE` for the root and for free arena entries.
    pub(super) parent: NodeId,
    /// Tokens on the path before this node's key (the key's start position).
    pub(super) depth: u32,
    /// Locks held on this node or any descendant (the root holds one forever).
    pub(super) lock_ref: u32,
    /// The locks of `lock_ref` taken on this node itself: only these can be released here.
    pub(super) own_locks: u32,
    /// Live children.
    pub(super) child_count: u32,
    /// The key space of the node's path ([`Namespace::DEFAULT`] for the root, which is shared):
    /// every node below a child of the root has that child's.
    pub(super) namespace: Namespace,
    /// Next node in the same child-index chain; next free entry while the entry is free.
    pub(super) hash_next: NodeId,
    /// Position in the evictable-leaf set, or [`NOT_EVICTABLE`].
    pub(super) leaf_pos: u32,
}

impl Node {
    fn empty() -> Node {
        Node {
            data: Vec::new(),
            last_access: 0,
            parent: NodeId::NONE,
            depth: 0,
            lock_ref: 0,
            own_locks: 0,
            child_count: 0,
            namespace: Namespace::DEFAULT,
            hash_next: NodeId::NONE,
            leaf_pos: NOT_EVICTABLE,
        }
    }

    /// A fresh node holding `data`, neither linked nor locked.
    pub(super) fn new(
        data: Vec<u32>,
        parent: NodeId,
        namespace: Namespace,
        depth: usize,
        last_access: u64,
    ) -> Node {
        Node {
            data,
            last_access,
            parent,
            namespace,
            depth: depth as u32,
            ..Node::empty()
        }
    }

    /// Pages in the key.
    #[inline(always)]
    pub(super) fn num_pages(&self, layout: KeyLayout) -> usize {
        layout.pages_in_words(self.data.len())
    }

    /// Tokens in the key.
    #[inline(always)]
    pub(super) fn len(&self, layout: KeyLayout) -> usize {
        self.num_pages(layout) * layout.page_size()
    }

    /// Start position of the key on its path.
    #[inline(always)]
    pub(super) fn start(&self) -> usize {
        self.depth as usize
    }

    /// Position just past the key on its path.
    #[inline(always)]
    pub(super) fn end(&self, layout: KeyLayout) -> usize {
        self.start() + self.len(layout)
    }

    /// Token ids of page `page` of the key.
    pub(super) fn page_tokens(&self, page: usize, layout: KeyLayout) -> &[u32] {
        let at = page * layout.words_per_page();
        &self.data[at..at + layout.page_size()]
    }

    /// Page id of page `page` of the key.
    pub(super) fn page_id(&self, page: usize, layout: KeyLayout) -> PageId {
        self.data[page * layout.words_per_page() + layout.page_size()]
    }

    /// Page ids of the whole key, in key order.
    pub(super) fn page_ids(&self, layout: KeyLayout) -> impl Iterator<Item = PageId> + '_ {
        let page_size = layout.page_size();
        self.data
            .chunks_exact(layout.words_per_page())
            .map(move |page| page[page_size])
    }
}

/// What eviction reads of one node besides its access time.
#[derive(Debug, Default)]
struct Figures {
    stats: NodeStats,
    registrations: Registrations,
}

impl Figures {
    fn new(stats: NodeStats) -> Figures {
        Figures {
            stats,
            registrations: Registrations::default(),
        }
    }
}

/// Every node, indexed by [`NodeId`], with its eviction figures beside it; removed entries are
/// reused through a free list.
#[derive(Debug)]
pub(super) struct Arena {
    nodes: Vec<Node>,
    /// Per entry of `nodes`: what eviction policies read besides the access time, and the
    /// earlier registrations of a leaf grown in place (together: a growing leaf's touch one
    /// entry).
    figures: Vec<Figures>,
    /// Per entry of `nodes`: its generation, bumped when the entry is released, so that a
    /// handle to an evicted node never names the entry's next node.
    generations: Vec<u32>,
    free_head: NodeId,
}

impl Arena {
    /// An arena holding only the root (locked once, forever).
    pub(super) fn new() -> Arena {
        let root = Node {
            lock_ref: 1,
            own_locks: 1,
            ..Node::empty()
        };
        Arena {
            nodes: vec![root],
            figures: vec![Figures::default()],
            generations: vec![0],
            free_head: NodeId::NONE,
        }
    }

    /// Stores `node` with its eviction figures in a free entry (or a new one) and returns its
    /// handle.
    pub(super) fn alloc(&mut self, node: Node, stats: NodeStats) -> NodeId {
        if self.free_head == NodeId::NONE {
            let index = u32::try_from(self.nodes.len()).expect("radix arena exceeds u32 ids");
            self.nodes.push(node);
            self.figures.push(Figures::new(stats));
            self.generations.push(0);
            return NodeId {
                index,
                generation: 0,
            };
        }
        let id = self.free_head;
        self.free_head = self.nodes[id.index()].hash_next;
        self.nodes[id.index()] = node;
        self.figures[id.index()] = Figures::new(stats);
        id
    }

    /// Frees the entry of `id` (its key memory too) for reuse.
    pub(super) fn release(&mut self, id: NodeId) {
        self.nodes[id.index()] = Node {
            hash_next: self.free_head,
            ..Node::empty()
        };
        self.figures[id.index()] = Figures::default();
        let generation = &mut self.generations[id.index()];
        *generation = generation.wrapping_add(1);
        self.free_head = NodeId {
            index: id.index,
            generation: *generation,
        };
    }

    /// The eviction figures of `id`.
    pub(super) fn stats(&self, id: NodeId) -> &NodeStats {
        &self.figures[id.index()].stats
    }

    /// The eviction figures of `id`, to change.
    pub(super) fn stats_mut(&mut self, id: NodeId) -> &mut NodeStats {
        &mut self.figures[id.index()].stats
    }

    /// The eviction figures of `id` and its earlier registrations, to change together.
    #[inline(always)]
    pub(super) fn figures_mut(&mut self, id: NodeId) -> (&mut NodeStats, &mut Registrations) {
        let figures = &mut self.figures[id.index()];
        (&mut figures.stats, &mut figures.registrations)
    }

    /// The earlier registrations of `id`, when it is a leaf grown in place.
    #[inline(always)]
    pub(super) fn registrations(&self, id: NodeId) -> Option<&Registrations> {
        let registrations = &self.figures[id.index()].registrations;
        (!registrations.is_empty()).then_some(registrations)
    }

    /// The earlier registrations of `id` (none unless it is a leaf grown in place), to change.
    #[inline(always)]
    pub(super) fn registrations_mut(&mut self, id: NodeId) -> &mut Registrations {
        &mut self.figures[id.index()].registrations
    }

    /// Whether `id` names a node in the tree (the root included): its entry holds a node, of
    /// the handle's generation.
    pub(super) fn is_live(&self, id: NodeId) -> bool {
        id == NodeId::ROOT
            || self.nodes.get(id.index()).is_some_and(|node| {
                node.parent != NodeId::NONE && self.generations[id.index()] == id.generation
            })
    }

    /// Every node in the tree (the root included) with its handle.
    pub(super) fn live(&self) -> impl Iterator<Item = (NodeId, &Node)> + '_ {
        self.nodes
            .iter()
            .enumerate()
            .map(|(index, node)| {
                let id = NodeId {
                    index: index as u32,
                    generation: self.generations[index],
                };
                (id, node)
            })
            .filter(|&(id, node)| id == NodeId::ROOT || node.parent != NodeId::NONE)
    }

    /// Arena entries, live or free.
    pub(super) fn entries(&self) -> usize {
        self.nodes.len()
    }

    /// Heap bytes of the arena's own tables, nodes, their figures and registrations, and
    /// generations (keys excluded).
    pub(super) fn table_bytes(&self) -> usize {
        let registrations: usize = self
            .figures
            .iter()
            .map(|figures| figures.registrations.heap_bytes())
            .sum();
        self.nodes.capacity() * size_of::<Node>()
            + self.figures.capacity() * size_of::<Figures>()
            + self.generations.capacity() * size_of::<u32>()
            + registrations
    }
}

impl Index<NodeId> for Arena {
    type Output = Node;

    fn index(&self, id: NodeId) -> &Node {
        &self.nodes[id.index()]
    }
}

impl IndexMut<NodeId> for Arena {
    fn index_mut(&mut self, id: NodeId) -> &mut Node {
        &mut self.nodes[id.index()]
    }
}

// The per-node budget the module docs promise: two generation-carrying links.
const _: () = assert!(size_of::<Node>() == 72);
// And the figures beside each node: its own, and a grown leaf's registrations' header.
const _: () = assert!(size_of::<Figures>() == 48);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn released_entries_are_all_reused_before_the_arena_grows() {
        let mut arena = Arena::new();
        let leaf = || Node::new(vec![1, 2], NodeId::ROOT, Namespace::DEFAULT, 0, 0);
        let stats = |created| NodeStats {
            created,
            ..NodeStats::default()
        };
        let ids: Vec<NodeId> = (0..3).map(|i| arena.alloc(leaf(), stats(i + 1))).collect();
        for &id in &ids {
            arena.release(id);
            assert!(!arena.is_live(id));
            assert_eq!(*arena.stats(id), NodeStats::default(), "figures reset");
        }
        let mut reused: Vec<NodeId> = (0..3).map(|i| arena.alloc(leaf(), stats(i + 9))).collect();
        for &id in &reused {
            assert!(
                arena.stats(id).created >= 9,
                "a reused entry has its new figures"
            );
        }
        reused.sort_by_key(|id| id.index());
        let indices = |ids: &[NodeId]| ids.iter().map(|id| id.index()).collect::<Vec<_>>();
        assert_eq!(
            indices(&reused),
            indices(&ids),
            "every released entry is handed out again"
        );
        for (&old, &new) in ids.iter().zip(&reused) {
            assert!(arena.is_live(new));
            assert!(
                !arena.is_live(old),
                "a handle to the evicted node stays stale"
            );
        }
        assert_eq!(arena.entries(), 4, "the root and three entries");
    }
}
