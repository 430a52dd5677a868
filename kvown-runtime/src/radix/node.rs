//! Tree nodes, the arena that owns them, and the figures eviction reads of each: its own, and
//! the registrations of a leaf grown in place.
//!
//! A node's key and value live in one `Vec<u32>`, page by page: the page's `page_size` token ids
//! followed by its page id. A node therefore costs one vector header plus four bytes per page on
//! top of its key, and the page id sits next to the tokens a match has just compared.
//!
//! A running request's leaf grows in place: it keeps where each earlier registration ends and
//! the figures a node of its own would carry, so that it can be evicted registration by
//! registration, newest first, or turned into a chain of nodes when a match or insert ends
//! inside it (`docs/design.md`: a running request's leaf grows in place). An earlier
//! registration's access time is not kept: every access since reached the leaf's end.

use std::fmt;
use std::ops::{Index, IndexMut};

use super::layout::KeyLayout;
use super::policy::{EvictionPolicy, InsertParams, SLRU_PROTECTED_HITS};
use super::{Namespace, RadixSizes};
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
    /// No node: the root's parent, the end of a child-index chain.
    pub(super) const NONE: NodeId = NodeId {
        index: u32::MAX,
        generation: 0,
    };

    /// The arena entry of the handle: tables of per-node figures are indexed by it.
    #[inline(always)]
    pub(crate) fn index(self) -> usize {
        self.index as usize
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

/// One node: a run of whole pages on a path from the root.
#[derive(Debug)]
pub(crate) struct Node {
    /// Per page: `page_size` token ids, then the page id.
    pub(super) data: Vec<u32>,
    /// Logical time of the last match or insert that ended here, or of a removed child's.
    pub(super) last_access: u64,
    /// `NodeId::NONE` for the root and for free arena entries.
    parent: NodeId,
    /// Tokens on the path before this node's key (the key's start position).
    depth: u32,
    /// Locks held on this node or any descendant (the root holds one forever).
    lock_ref: u32,
    /// The locks of `lock_ref` taken on this node itself: only these can be released here.
    own_locks: u32,
    /// Live children.
    child_count: u32,
    /// The key space of the node's path ([`Namespace::DEFAULT`] for the root, which is shared):
    /// every node below a child of the root has that child's.
    namespace: Namespace,
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
        }
    }

    /// A fresh node holding `data`, starting at path position `start`, neither linked nor
    /// locked.
    fn new(
        data: Vec<u32>,
        parent: NodeId,
        namespace: Namespace,
        start: usize,
        last_access: u64,
    ) -> Node {
        Node {
            data,
            last_access,
            parent,
            namespace,
            depth: start as u32,
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
        self.num_pages(layout) * layout.geometry().page_size()
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

    /// The node's parent ([`NodeId::NONE`] for the root).
    #[inline(always)]
    pub(crate) fn parent(&self) -> NodeId {
        self.parent
    }

    /// The key space of the node's path.
    #[inline(always)]
    pub(crate) fn namespace(&self) -> Namespace {
        self.namespace
    }

    /// Locks held on the node or any descendant, and those taken on the node itself.
    #[inline(always)]
    pub(crate) fn locks(&self) -> (usize, usize) {
        (self.lock_ref as usize, self.own_locks as usize)
    }

    /// Live children.
    #[inline(always)]
    pub(crate) fn child_count(&self) -> usize {
        self.child_count as usize
    }

    /// Token ids of page `page` of the key.
    pub(super) fn page_tokens(&self, page: usize, layout: KeyLayout) -> &[u32] {
        let at = page * layout.words_per_page();
        &self.data[at..at + layout.geometry().page_size()]
    }

    /// Page id of page `page` of the key.
    pub(super) fn page_id(&self, page: usize, layout: KeyLayout) -> PageId {
        self.data[page * layout.words_per_page() + layout.geometry().page_size()]
    }

    /// Page ids of the whole key, in key order.
    pub(super) fn page_ids(&self, layout: KeyLayout) -> impl Iterator<Item = PageId> + '_ {
        let page_size = layout.geometry().page_size();
        self.data
            .chunks_exact(layout.words_per_page())
            .map(move |page| page[page_size])
    }
}

/// What the policies read of a node besides its access time (kept beside the node table, so
/// that the nodes stay 64 bytes).
///
/// An insert records them at the node where it ends, and a removed leaf passes its own on to
/// its parent ([`NodeStats::absorb`]), so that a leaf, the only node ever evicted, carries the
/// hits and the priority of every insert through it (`docs/design.md`: eviction figures per
/// node, not per path).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct NodeStats {
    /// Logical time at which the node was made: an insert's new leaf, or the upper part of a
    /// split, which is a new node (sglang `_split_node`).
    created: u64,
    /// What the inserts that ended at the node, and at its removed children, recorded.
    inserts: InsertFigures,
}

/// What the inserts that ended at a node (or at a grown leaf's earlier registration) recorded
/// there: kept only under a policy that reads them ([`EvictionPolicy::reads_insert_figures`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct InsertFigures {
    /// Inserts of finished requests.
    hits: u32,
    /// Highest priority of an insert.
    priority: i32,
}

impl InsertFigures {
    /// None recorded yet: no hits, and the lowest priority, so that the first insert's
    /// priority is taken, however low.
    const NONE: InsertFigures = InsertFigures {
        hits: 0,
        priority: i32::MIN,
    };

    /// Records an insert of `params`.
    #[inline]
    fn record(&mut self, params: InsertParams) {
        self.add(InsertFigures {
            hits: u32::from(!params.chunked),
            priority: params.priority,
        });
    }

    /// Adds `other`'s hits and keeps the higher priority.
    #[inline]
    fn add(&mut self, other: InsertFigures) {
        self.hits = self.hits.saturating_add(other.hits);
        self.priority = self.priority.max(other.priority);
    }
}

impl NodeStats {
    /// Figures of a node first cached at `created`, before the insert that made it is
    /// recorded: no hits, and the lowest priority, so that the node takes the insert's, however
    /// low.
    fn new(created: u64) -> NodeStats {
        NodeStats {
            created,
            inserts: InsertFigures::NONE,
        }
    }

    /// The upper part cut at `now` from a node with these figures (sglang `_split_node`): a
    /// new node, created `now`, at the node's priority, and with no hits of its own (the node
    /// keeps them and passes them on when it is removed; `docs/design.md` compares).
    fn split_upper(&self, now: u64) -> NodeStats {
        NodeStats {
            created: now,
            inserts: InsertFigures {
                hits: 0,
                priority: self.inserts.priority,
            },
        }
    }

    /// Takes on the figures of a removed child.
    pub(super) fn absorb(&mut self, child: &NodeStats) {
        self.inserts.add(child.inserts);
    }

    /// The sort key of a candidate with these figures and access time `last_access` under
    /// `policy`: candidates are evicted in increasing order.
    #[inline]
    pub(super) fn rank(&self, policy: EvictionPolicy, last_access: u64) -> (u64, u64) {
        match policy {
            EvictionPolicy::Lru => (0, last_access),
            EvictionPolicy::Lfu => (u64::from(self.inserts.hits), last_access),
            EvictionPolicy::Fifo => (0, self.created),
            EvictionPolicy::Mru => (0, !last_access),
            EvictionPolicy::Filo => (0, !self.created),
            // Flipping the sign bit maps i32's order onto u32's.
            EvictionPolicy::Priority => (
                u64::from(self.inserts.priority as u32 ^ 1 << 31),
                last_access,
            ),
            EvictionPolicy::Slru => (
                u64::from(self.inserts.hits >= SLRU_PROTECTED_HITS),
                last_access,
            ),
        }
    }
}

/// An earlier registration inside a grown leaf: where it ends, and its own node's figures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Registration {
    /// Pages of the leaf up to this registration's end.
    end_page: u32,
    /// Its creation time, in ticks after the leaf's first registration's.
    created_after_first: u32,
    /// What the inserts that ended at its end recorded, while it ended the leaf and since.
    inserts: InsertFigures,
}

/// The earlier registrations of one grown leaf, oldest first (the newest one is the leaf's own
/// figures).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Registrations {
    /// Creation time of the leaf's first registration.
    first_created: u64,
    list: Vec<Registration>,
}

impl Registrations {
    /// Whether a registration created at `created` can be kept beside these (creation times
    /// are kept as 32-bit offsets from the first).
    fn fits(&self, created: u64) -> bool {
        self.list.is_empty() || created - self.first_created <= u64::from(u32::MAX)
    }

    /// Keeps a registration ending at `end_page` with `stats`, whose creation time must
    /// [`Registrations::fits`] these.
    #[inline]
    fn push(&mut self, end_page: usize, stats: &NodeStats) {
        if self.list.is_empty() {
            self.first_created = stats.created;
        }
        self.list.push(Registration {
            end_page: end_page as u32,
            created_after_first: (stats.created - self.first_created) as u32,
            inserts: stats.inserts,
        });
    }

    /// Where the earlier registration `index` (oldest first) ends, and its figures.
    fn get(&self, index: usize) -> (usize, NodeStats) {
        let registration = &self.list[index];
        let stats = NodeStats {
            created: self.first_created + u64::from(registration.created_after_first),
            inserts: registration.inserts,
        };
        (registration.end_page as usize, stats)
    }

    /// Forgets the newest earlier registration; the memory of the last goes with it.
    fn pop(&mut self) {
        self.list.pop();
        if self.list.is_empty() {
            self.list = Vec::new();
        }
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
    /// Released entries, each with its next generation, reused last released first.
    free: Vec<NodeId>,
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
            free: Vec::new(),
        }
    }

    /// Stores `node` with its eviction figures in a free entry (or a new one) and returns its
    /// handle.
    fn alloc(&mut self, node: Node, stats: NodeStats) -> NodeId {
        let Some(id) = self.free.pop() else {
            let index = u32::try_from(self.nodes.len()).expect("radix arena exceeds u32 ids");
            self.nodes.push(node);
            self.figures.push(Figures::new(stats));
            self.generations.push(0);
            return NodeId {
                index,
                generation: 0,
            };
        };
        self.nodes[id.index()] = node;
        self.figures[id.index()] = Figures::new(stats);
        id
    }

    /// Stores a new leaf holding `data` under `parent` in `namespace`, starting at path
    /// position `start`, created `now`, unlocked and not yet in the child index; returns its
    /// handle. The parent counts it as a child.
    pub(super) fn add_node(
        &mut self,
        data: Vec<u32>,
        parent: NodeId,
        namespace: Namespace,
        start: usize,
        now: u64,
    ) -> NodeId {
        let node = Node::new(data, parent, namespace, start, now);
        let leaf = self.alloc(node, NodeStats::new(now));
        self[parent].child_count += 1;
        leaf
    }

    /// Splits `id` at path position `pos` (strictly inside its key, page-aligned) at time `now`.
    /// The new upper node takes the key before `pos` and is returned, created `now`
    /// ([`NodeStats::split_upper`]) with `id` as its one child; `id` keeps its handle,
    /// children, lock count, candidacy and figures with the key from `pos`. The caller
    /// relinks both in the child index.
    pub(super) fn split(&mut self, id: NodeId, pos: usize, layout: KeyLayout, now: u64) -> NodeId {
        let entry = &mut self[id];
        let cut = layout.key_words(pos - entry.start());
        let lower = entry.data.split_off(cut);
        let mut upper_data = std::mem::replace(&mut entry.data, lower);
        upper_data.shrink_to_fit();
        let mut upper = Node::new(
            upper_data,
            entry.parent,
            entry.namespace,
            entry.start(),
            entry.last_access,
        );
        upper.lock_ref = entry.lock_ref;
        upper.child_count = 1;
        let upper_stats = self.stats(id).split_upper(now);
        let upper = self.alloc(upper, upper_stats);
        let entry = &mut self[id];
        entry.parent = upper;
        entry.depth = pos as u32;
        upper
    }

    /// Deletes the unlocked leaf `leaf` (out of the child index and the eviction order) and
    /// returns its parent, which counts one child less, inherits the leaf's access time when
    /// newer and absorbs its figures ([`NodeStats::absorb`]).
    pub(super) fn remove_leaf(&mut self, leaf: NodeId) -> NodeId {
        let (parent, last_access) = (self[leaf].parent, self[leaf].last_access);
        let stats = *self.stats(leaf);
        self.release(leaf);
        let parent_entry = &mut self[parent];
        parent_entry.child_count -= 1;
        parent_entry.last_access = parent_entry.last_access.max(last_access);
        self.figures[parent.index()].stats.absorb(&stats);
        parent
    }

    /// Takes one lock on `node` itself, counting it on `node` and its ancestors below `stop`
    /// (`stop` is `node`'s ancestor, or the root); their tokens move from evictable to
    /// protected in `sizes` as their counts leave 0, and `changed` is told of each node whose
    /// count changed, in path order. Refuses with the node and its count, changing nothing,
    /// when one of them already counts `u32::MAX` locks (the counts are checked as the walk
    /// goes: the nodes it passed are unlocked again, which is rare, instead of every lock
    /// walking the path twice). Locking the root changes nothing.
    #[inline]
    pub(super) fn lock(
        &mut self,
        node: NodeId,
        stop: NodeId,
        layout: KeyLayout,
        sizes: &mut RadixSizes,
        mut changed: impl FnMut(&mut Arena, NodeId),
    ) -> Result<(), (NodeId, u32)> {
        let mut at = node;
        while at != stop && at != NodeId::ROOT {
            let entry = &mut self[at];
            if entry.lock_ref == u32::MAX {
                let locks = entry.lock_ref;
                self.unlock_path(node, at, layout, sizes, &mut changed);
                return Err((at, locks));
            }
            if entry.lock_ref == 0 {
                let tokens = entry.len(layout);
                sizes.evictable -= tokens;
                sizes.protected += tokens;
            }
            entry.lock_ref += 1;
            let parent = entry.parent;
            changed(self, at);
            at = parent;
        }
        if node != NodeId::ROOT {
            self[node].own_locks += 1;
        }
        Ok(())
    }

    /// Releases one lock taken on `node` itself (it holds one, or is the root, whose lock
    /// stays), uncounting it on `node` and its ancestors below `stop`, as [`Arena::lock`]
    /// counted it.
    #[inline]
    pub(super) fn unlock(
        &mut self,
        node: NodeId,
        stop: NodeId,
        layout: KeyLayout,
        sizes: &mut RadixSizes,
        mut changed: impl FnMut(&mut Arena, NodeId),
    ) {
        self.unlock_path(node, stop, layout, sizes, &mut changed);
        if node != NodeId::ROOT {
            self[node].own_locks -= 1;
        }
    }

    /// Decrements the lock count of `node` and its ancestors below `stop` (all at least 1, as
    /// `node`'s is): tokens of counts reaching 0 move to evictable, and their nodes give back
    /// the spare capacity of their keys (only a locked node is extended in place).
    fn unlock_path(
        &mut self,
        mut node: NodeId,
        stop: NodeId,
        layout: KeyLayout,
        sizes: &mut RadixSizes,
        changed: &mut impl FnMut(&mut Arena, NodeId),
    ) {
        while node != stop && node != NodeId::ROOT {
            let entry = &mut self[node];
            entry.lock_ref -= 1;
            let parent = entry.parent;
            if entry.lock_ref == 0 {
                let tokens = entry.len(layout);
                sizes.protected -= tokens;
                sizes.evictable += tokens;
                self.shrink_to_fit(node);
            }
            changed(self, node);
            node = parent;
        }
    }

    /// Frees the entry of `id` (its key memory too) for reuse.
    fn release(&mut self, id: NodeId) {
        self.nodes[id.index()] = Node::empty();
        self.figures[id.index()] = Figures::default();
        let generation = &mut self.generations[id.index()];
        *generation = generation.wrapping_add(1);
        self.free.push(NodeId {
            index: id.index,
            generation: *generation,
        });
    }

    /// The eviction figures of `id`.
    pub(super) fn stats(&self, id: NodeId) -> &NodeStats {
        &self.figures[id.index()].stats
    }

    /// Earlier registrations of `id`: 0 unless it is a leaf grown in place.
    #[inline(always)]
    pub(super) fn registration_count(&self, id: NodeId) -> usize {
        self.figures[id.index()].registrations.list.len()
    }

    /// Where earlier registration `index` of `id` ends (in pages of the leaf) and the figures
    /// its node would carry.
    pub(super) fn registration(&self, id: NodeId, index: usize) -> (usize, NodeStats) {
        self.figures[id.index()].registrations.get(index)
    }

    /// Where registration `index` of `id` ends, in pages, counting its earlier registrations
    /// oldest first from 0 and the newest (what the leaf's own figures describe) as the last,
    /// number [`Arena::registration_count`].
    pub(super) fn registration_end(&self, id: NodeId, index: usize, layout: KeyLayout) -> usize {
        let registrations = &self.figures[id.index()].registrations;
        match registrations.list.get(index) {
            Some(registration) => registration.end_page as usize,
            None => self[id].num_pages(layout),
        }
    }

    /// Starts a new registration at the end of the leaf `id`, about to grow in place at `now`:
    /// what it holds becomes an earlier registration with the leaf's figures, and the leaf's
    /// figures become the new registration's (created `now`, nothing recorded). `false`,
    /// changing nothing, when the earlier registrations cannot keep it (creation times past 32
    /// bits of the first's): turn them into nodes first.
    #[inline]
    pub(super) fn open_registration(&mut self, id: NodeId, layout: KeyLayout, now: u64) -> bool {
        let end_page = self.nodes[id.index()].num_pages(layout);
        let figures = &mut self.figures[id.index()];
        if !figures.registrations.fits(figures.stats.created) {
            return false;
        }
        figures.registrations.push(end_page, &figures.stats);
        figures.stats = NodeStats::new(now);
        true
    }

    /// Forgets all but the first `kept` earlier registrations of `id`: its figures absorb the
    /// removed ones' and become the figures of registration `kept`, as removing their nodes
    /// newest first would leave them. The caller removes the pages past where registration
    /// `kept` ends.
    pub(super) fn drop_registrations(&mut self, id: NodeId, kept: usize) {
        let figures = &mut self.figures[id.index()];
        while figures.registrations.list.len() > kept {
            let newest = figures.registrations.list.len() - 1;
            let (_, mut own) = figures.registrations.get(newest);
            own.absorb(&figures.stats);
            figures.stats = own;
            figures.registrations.pop();
        }
    }

    /// Turns the earlier registrations of `id` into nodes above it, newest first, each split
    /// off at the time it was created and with its figures ([`Arena::split`]); `id` keeps its
    /// handle, locks and children with its newest registration's pages. Returns how many nodes
    /// it made: `id`'s nearest ancestors, which the caller indexes, with `id` again.
    pub(super) fn materialize(&mut self, id: NodeId, layout: KeyLayout) -> usize {
        let registrations = std::mem::take(&mut self.figures[id.index()].registrations);
        let start = self[id].start();
        let page_size = layout.geometry().page_size();
        let mut lower = id;
        for index in (0..registrations.list.len()).rev() {
            let (end_page, stats) = registrations.get(index);
            lower = self.split(lower, start + end_page * page_size, layout, stats.created);
            self.figures[lower.index()].stats = stats;
        }
        registrations.list.len()
    }

    /// The first node but the root whose registrations (oldest first, its own last) do not
    /// each end after, and were not each created after, the one before, and which invariant
    /// it breaks; `None` when every node's are in order.
    pub(super) fn misordered_registrations(
        &self,
        layout: KeyLayout,
    ) -> Option<(NodeId, &'static str)> {
        for (id, _) in self.live().filter(|&(id, _)| id != NodeId::ROOT) {
            let (mut end, mut created) = (0, None);
            let count = self.registration_count(id);
            for index in 0..=count {
                let own = index == count;
                let registration_end = self.registration_end(id, index, layout);
                let registration_created = if own {
                    self.stats(id).created
                } else {
                    self.registration(id, index).1.created
                };
                let wrong = if registration_end <= end {
                    if own {
                        "registration ends past the leaf's newest"
                    } else {
                        "registration ends out of order"
                    }
                } else if created >= Some(registration_created) {
                    if own {
                        "registration created after the leaf's newest"
                    } else {
                        "registration created out of order"
                    }
                } else {
                    (end, created) = (registration_end, Some(registration_created));
                    continue;
                };
                return Some((id, wrong));
            }
        }
        None
    }

    /// Records an insert of `params` (nothing when `None`) as the node where it ended would:
    /// `id` itself when `end_page` is `None`, else the earlier registration of `id` that ends
    /// `end_page` pages into it. `false`, recording nothing, when no earlier registration ends
    /// there.
    pub(super) fn record_insert(
        &mut self,
        id: NodeId,
        end_page: Option<usize>,
        params: Option<InsertParams>,
    ) -> bool {
        let figures = &mut self.figures[id.index()];
        let inserts = match end_page {
            None => &mut figures.stats.inserts,
            Some(end_page) => {
                let list = &mut figures.registrations.list;
                let Ok(index) = list.binary_search_by_key(&end_page, |r| r.end_page as usize)
                else {
                    return false;
                };
                &mut list[index].inserts
            }
        };
        if let Some(params) = params {
            inserts.record(params);
        }
        true
    }

    /// Gives back the spare capacity of `id`'s key and registrations (it stopped growing).
    fn shrink_to_fit(&mut self, id: NodeId) {
        self.nodes[id.index()].data.shrink_to_fit();
        self.figures[id.index()].registrations.list.shrink_to_fit();
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

    /// Heap bytes of the arena's own tables, nodes, their figures and registrations,
    /// generations and released entries (keys excluded).
    pub(super) fn table_bytes(&self) -> usize {
        let registrations: usize = self
            .figures
            .iter()
            .map(|figures| figures.registrations.list.capacity() * size_of::<Registration>())
            .sum();
        self.nodes.capacity() * size_of::<Node>()
            + self.figures.capacity() * size_of::<Figures>()
            + self.generations.capacity() * size_of::<u32>()
            + self.free.capacity() * size_of::<NodeId>()
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

// The per-node budget the module docs promise: a cache line, with one generation-carrying link.
const _: () = assert!(size_of::<Node>() == 64);
// And the figures beside each node: its own, and a grown leaf's registrations' header.
const _: () = assert!(size_of::<Figures>() == 48);

#[cfg(test)]
mod tests {
    use super::super::{
        EvictionPolicy, Insert, InsertParams, RadixCache, RadixConfig, RadixError, TreePos,
    };
    use super::*;
    use crate::alloc::{PagedAllocator, SlotCalls};
    use crate::check::{check_radix, small_tree};

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
        assert_eq!(arena.nodes.len(), 4, "the root and three entries");
    }

    /// A cache of page size 1 under `policy` holding `[1]`, locked and grown in place by
    /// registrations of `[2]` and `[3]` (as a decoding request registers its pages), with slots
    /// equal to the tokens.
    fn grown(policy: EvictionPolicy) -> (RadixCache, TreePos) {
        let mut cache = RadixCache::new(RadixConfig::new(1).with_policy(policy)).unwrap();
        let first = cache.insert(Insert::new(&[1], &[1])).unwrap();
        cache.inc_lock_ref(first.last_node).unwrap();
        let mut at = TreePos {
            node: first.last_node,
            len: 1,
        };
        let registration = InsertParams {
            priority: 0,
            chunked: true,
        };
        for len in [2, 3] {
            let key: Vec<u32> = (1..=len).collect();
            let insert = Insert::new(&key, &key).from(at).params(registration);
            let outcome = cache.insert(insert).unwrap();
            assert_eq!(outcome.last_node, at.node, "grown in place");
            at.len = len as usize;
        }
        (cache, at)
    }

    fn allocator() -> PagedAllocator {
        let mut allocator = PagedAllocator::new(16, 1, false).unwrap();
        let mut slots = Vec::new();
        // Hand out slots 1..=12 (the tree's among them), as the cache's owner would have.
        allocator.alloc(12, &mut slots).unwrap();
        allocator
    }

    #[test]
    fn a_grown_leaf_is_evicted_newest_registration_first_and_no_more_than_asked() {
        let (mut cache, at) = grown(EvictionPolicy::Lru);
        cache.dec_lock_ref(at.node).unwrap();
        let mut allocator = allocator();
        assert_eq!(cache.evict(1, &mut allocator).unwrap(), 1);
        assert_eq!(cache.sizes().total(), 2);
        assert_eq!(cache.match_prefix(&[1, 2, 3]).len, 2, "[3] went first");
        check_radix(&cache).unwrap();
        assert_eq!(cache.evict(2, &mut allocator).unwrap(), 2);
        assert_eq!(cache.sizes().total(), 0);
        check_radix(&cache).unwrap();
    }

    /// The slots the cache holds, in no particular order.
    fn cached_slots(cache: &RadixCache) -> Vec<u32> {
        cache.cached_pages().map(|(_, page)| page).collect()
    }

    #[test]
    fn under_fifo_each_registration_competes_at_its_own_creation_time() {
        let (mut cache, at) = grown(EvictionPolicy::Fifo);
        // [9] is cached after the leaf's registrations. The leaf competes as its newest
        // registration, [3], created before [9]; then as [2], then as [1]; [9] goes last.
        cache.insert(Insert::new(&[9], &[9])).unwrap();
        cache.dec_lock_ref(at.node).unwrap();
        let mut allocator = allocator();
        let mut order = Vec::new();
        for _ in 0..4 {
            let before = cached_slots(&cache);
            assert_eq!(cache.evict(1, &mut allocator).unwrap(), 1);
            let after = cached_slots(&cache);
            order.extend(before.into_iter().filter(|slot| !after.contains(slot)));
            check_radix(&cache).unwrap();
        }
        assert_eq!(order, [3, 2, 1, 9]);
    }

    #[test]
    fn a_match_ending_inside_a_grown_leaf_sees_its_registrations_as_nodes() {
        let (mut cache, at) = grown(EvictionPolicy::Lru);
        let nodes_before = cache.arena.live().count();
        // Ends where the first registration ([1, 2]) ends: sglang's node boundary, no split.
        let hit = cache.match_prefix(&[1, 2, 7]);
        assert_eq!(hit.len, 2);
        assert_eq!(
            cache.arena.live().count(),
            nodes_before + 2,
            "[1], [2] above [3]"
        );
        assert_eq!(cache.arena.registration_count(at.node), 0);
        assert_eq!(
            cache.arena[at.node].start(),
            2,
            "the leaf keeps its newest pages"
        );
        check_radix(&cache).unwrap();
        // The locked leaf and its new ancestors are still protected, and nothing is evictable.
        assert_eq!(cache.sizes().protected, 3);
        assert_eq!(cache.sizes().evictable, 0);
    }

    #[test]
    fn the_check_finds_registrations_out_of_order_or_past_the_leaf() {
        let broken = |wreck: fn(&mut Vec<Registration>)| {
            let (mut cache, at) = grown(EvictionPolicy::Lru);
            check_radix(&cache).unwrap();
            wreck(&mut cache.arena.figures[at.node.index()].registrations.list);
            match check_radix(&cache) {
                Err(RadixError::Inconsistent { what, .. }) => what,
                other => panic!("the check passed a broken leaf: {other:?}"),
            }
        };
        assert_eq!(broken(|r| r.swap(0, 1)), "registration ends out of order");
        assert_eq!(
            broken(|r| r[1].created_after_first = 0),
            "registration created out of order"
        );
        assert_eq!(
            broken(|r| r[1].end_page = 3),
            "registration ends past the leaf's newest"
        );
        assert_eq!(
            broken(|r| r[1].created_after_first = 7),
            "registration created after the leaf's newest"
        );
    }

    #[test]
    fn a_refused_free_leaves_a_grown_leaf_as_it_was() {
        let (mut cache, at) = grown(EvictionPolicy::Lru);
        cache.dec_lock_ref(at.node).unwrap();
        let registrations =
            |cache: &RadixCache| cache.arena.figures[at.node.index()].registrations.clone();
        let before = (registrations(&cache), cache.sizes());
        // Slots 1..=3 were never handed out by this allocator: the free is refused.
        let mut fresh = PagedAllocator::new(16, 1, false).unwrap();
        assert!(cache.evict(2, &mut fresh).is_err());
        assert_eq!((registrations(&cache), cache.sizes()), before);
        check_radix(&cache).unwrap();
        // The leaf is still evicted newest registration first.
        let mut allocator = allocator();
        assert_eq!(cache.evict(1, &mut allocator).unwrap(), 1);
        assert_eq!(cache.match_prefix(&[1, 2, 3]).len, 2);
    }

    #[test]
    fn ranks_order_candidates_as_each_policy_says() {
        let at = |created, hits, priority| NodeStats {
            created,
            inserts: InsertFigures { hits, priority },
        };
        // (access time, stats): `old` was created and used first, `new` later; `new` has more
        // hits, `old` a higher priority.
        let old = (10, at(1, 1, 5));
        let new = (20, at(2, 3, -5));
        let first = |policy: EvictionPolicy| {
            if old.1.rank(policy, old.0) < new.1.rank(policy, new.0) {
                "old"
            } else {
                "new"
            }
        };
        let expected = [
            (EvictionPolicy::Lru, "old"),
            (EvictionPolicy::Lfu, "old"),
            (EvictionPolicy::Fifo, "old"),
            (EvictionPolicy::Mru, "new"),
            (EvictionPolicy::Filo, "new"),
            (EvictionPolicy::Priority, "new"),
            (EvictionPolicy::Slru, "old"),
        ];
        for (policy, goes_first) in expected {
            assert_eq!(first(policy), goes_first, "{policy}");
        }
        // SLRU: a newer node below the threshold still goes first; above it, hits no longer
        // count (where LFU keeps counting them).
        let probation = (30, at(3, SLRU_PROTECTED_HITS - 1, 0));
        let protected = (6, at(0, SLRU_PROTECTED_HITS, 0));
        let (slru, lfu) = (EvictionPolicy::Slru, EvictionPolicy::Lfu);
        assert!(probation.1.rank(slru, probation.0) < protected.1.rank(slru, protected.0));
        let hot = (5, at(0, SLRU_PROTECTED_HITS + 5, 0));
        assert!(hot.1.rank(slru, hot.0) < protected.1.rank(slru, protected.0));
        assert!(protected.1.rank(lfu, protected.0) < hot.1.rank(lfu, hot.0));
        // Priorities compare as signed numbers.
        let low = at(0, 0, i32::MIN);
        let high = at(0, 0, i32::MAX);
        let priority = EvictionPolicy::Priority;
        assert!(low.rank(priority, 9) < at(0, 0, -1).rank(priority, 1));
        assert!(at(0, 0, 0).rank(priority, 9) < high.rank(priority, 1));
    }

    #[test]
    fn inserts_count_hits_unless_chunked_and_keep_the_highest_priority() {
        let figures =
            |stats: &NodeStats| (stats.created, stats.inserts.hits, stats.inserts.priority);
        let mut stats = NodeStats::new(7);
        stats.inserts.record(InsertParams {
            priority: 3,
            chunked: true,
        });
        assert_eq!(figures(&stats), (7, 0, 3));
        stats.inserts.record(InsertParams {
            priority: -1,
            chunked: false,
        });
        assert_eq!(figures(&stats), (7, 1, 3));
        assert_eq!(figures(&stats.split_upper(9)), (9, 0, 3));
        let mut parent = NodeStats::new(1);
        parent.inserts.record(InsertParams::default());
        parent.absorb(&stats);
        let mut other_child = NodeStats::new(2);
        other_child.inserts.record(InsertParams {
            priority: 9,
            chunked: false,
        });
        parent.absorb(&other_child);
        assert_eq!(figures(&parent), (1, 3, 9));
        let mut saturated = NodeStats {
            inserts: InsertFigures {
                hits: u32::MAX,
                priority: 0,
            },
            ..NodeStats::default()
        };
        saturated.inserts.record(InsertParams::default());
        saturated.absorb(&parent);
        assert_eq!(saturated.inserts.hits, u32::MAX);
    }

    #[test]
    fn an_insert_ending_at_an_earlier_registration_records_there_as_at_a_node() {
        let (mut cache, at) = grown(EvictionPolicy::Lfu);
        let params = InsertParams {
            priority: 4,
            chunked: false,
        };
        let arena = &mut cache.arena;
        assert!(
            !arena.record_insert(at.node, Some(3), Some(params)),
            "no earlier one ends there"
        );
        assert!(
            arena.record_insert(at.node, Some(2), None),
            "found, nothing recorded"
        );
        assert!(arena.record_insert(at.node, Some(2), Some(params)));
        assert!(arena.record_insert(at.node, None, Some(params)));
        let (_, second) = arena.registration(at.node, 1);
        let (_, first) = arena.registration(at.node, 0);
        assert_eq!((second.inserts.hits, second.inserts.priority), (1, 4));
        assert_eq!(
            first.inserts.hits, 1,
            "the first insert, a finished request's"
        );
        assert_eq!(
            arena.stats(at.node).inserts,
            second.inserts,
            "the newest's own, alike"
        );
    }

    // The checker finds a broken node table, counter or index (read through the views of
    // `view.rs`).

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
        cache.children.unlink(&cache.arena, cache.layout, locked);
        cache.arena[locked].namespace = Namespace(1);
        cache.children.link(&cache.arena, cache.layout, locked);
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
