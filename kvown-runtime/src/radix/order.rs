//! Eviction: the eviction order, which unlocked leaves an eviction may take (the candidates) in
//! the order of the cache's [`EvictionPolicy`], and the eviction that frees them.
//!
//! The order is kept across calls: every candidate has an entry in a heap at its current rank;
//! an entry made outdated by a later access is skipped when it comes up, and the heap is rebuilt
//! from the candidates once outdated entries make up most of it (sglang `RadixCache.evict`
//! builds a heap of every leaf per call). Planning an eviction takes the victims from the heap
//! in order and changes nothing else. Then each victim's pages are freed with one allocator
//! call and the node deleted, victim after victim ([`RadixCache::evict`]). An allocator that
//! refuses a victim's pages leaves it and the later victims cached.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet};
use std::hash::BuildHasherDefault;
use std::ops::Range;

use super::children::KeyHasher;
use super::layout::KeyLayout;
use super::node::{Arena, Node, NodeId, NodeStats};
use super::policy::EvictionPolicy;
use super::{RadixCache, RadixError};
use crate::alloc::{AllocError, FreeOrder, KvAllocator, PageId};
use crate::shared_error::PageSizeMismatch;

/// The position recorded for a node that is not a candidate.
const NOT_LISTED: u32 = u32::MAX;

/// Outdated entries of the heap tolerated beyond twice the candidates before a rebuild.
const ORDER_SLACK: usize = 64;

/// Sort key of an eviction candidate ([`NodeStats::rank`]).
type Rank = (u64, u64);

/// An entry of the heap: a candidate's rank when it was listed, and the candidate.
type OrderEntry = Reverse<(Rank, NodeId)>;

/// The candidates of eviction in the policy's order, the logical clock their access times are
/// read on, and the reusable buffers of eviction plans.
#[derive(Debug)]
pub(super) struct EvictionOrder {
    policy: EvictionPolicy,
    /// Logical clock for access times; ticks once per match or insert.
    clock: u64,
    /// Unlocked non-root nodes without children.
    candidates: Vec<NodeId>,
    /// Per arena entry ([`NodeId::index`]): the node's position in `candidates`, or
    /// [`NOT_LISTED`] (as are the entries past the end).
    positions: Vec<u32>,
    /// Every candidate at its current rank, and outdated entries.
    heap: BinaryHeap<OrderEntry>,
    /// Buffers of eviction plans (boxed, so that the cache itself stays small, and a plan
    /// moves a pointer); `None` only while a plan holds them.
    scratch: Option<Box<Scratch>>,
}

impl EvictionOrder {
    /// No candidates, at time 0, ranking by `policy`.
    pub(super) fn new(policy: EvictionPolicy) -> EvictionOrder {
        EvictionOrder {
            policy,
            clock: 0,
            candidates: Vec::new(),
            positions: Vec::new(),
            heap: BinaryHeap::new(),
            scratch: Some(Box::default()),
        }
    }

    /// The policy the order ranks by.
    #[inline(always)]
    pub(super) fn policy(&self) -> EvictionPolicy {
        self.policy
    }

    /// Advances the logical clock and returns the new time.
    #[inline(always)]
    pub(super) fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    /// Makes `node` a candidate or not, to match its state in `arena` (an unlocked non-root
    /// node without children), in O(1) (amortized O(log n) to list it).
    pub(super) fn refresh(&mut self, arena: &Arena, node: NodeId) {
        self.set_candidate(arena, node, is_candidate(node, &arena[node]));
    }

    /// Makes `node` a candidate or not, to match `candidate`.
    fn set_candidate(&mut self, arena: &Arena, node: NodeId, candidate: bool) {
        let pos = self.position(node);
        if candidate && pos == NOT_LISTED {
            if node.index() >= self.positions.len() {
                self.positions.resize(node.index() + 1, NOT_LISTED);
            }
            self.positions[node.index()] = self.candidates.len() as u32;
            self.candidates.push(node);
            self.rank_again(arena, node);
        } else if !candidate && pos != NOT_LISTED {
            let pos = pos as usize;
            self.candidates.swap_remove(pos);
            if let Some(&moved) = self.candidates.get(pos) {
                self.positions[moved.index()] = pos as u32;
            }
            self.positions[node.index()] = NOT_LISTED;
        }
    }

    /// The position of `node` in the candidates, or [`NOT_LISTED`].
    #[inline(always)]
    fn position(&self, node: NodeId) -> u32 {
        self.positions
            .get(node.index())
            .copied()
            .unwrap_or(NOT_LISTED)
    }

    /// Whether `node` is a candidate, at the position recorded for it.
    fn lists(&self, node: NodeId) -> bool {
        self.candidates.get(self.position(node) as usize) == Some(&node)
    }

    /// Sets `node`'s access time to `now`, keeping its place current when it is a candidate.
    #[inline]
    pub(super) fn stamp(&mut self, arena: &mut Arena, node: NodeId, now: u64) {
        arena[node].last_access = now;
        if self.position(node) != NOT_LISTED {
            self.rank_again(arena, node);
        }
    }

    /// Records candidate `node` at its current rank (after its figures changed); rebuilds the
    /// heap from the candidates when outdated entries make up most of it.
    fn rank_again(&mut self, arena: &Arena, node: NodeId) {
        self.heap.push(Reverse((self.rank(arena, node), node)));
        if self.heap.len() > 2 * self.candidates.len() + ORDER_SLACK {
            let mut entries = std::mem::take(&mut self.heap).into_vec();
            entries.clear();
            entries.extend(
                self.candidates
                    .iter()
                    .map(|&leaf| Reverse((self.rank(arena, leaf), leaf))),
            );
            self.heap = BinaryHeap::from(entries);
        }
    }

    /// The rank of `node` as it stands: candidates are evicted in increasing rank.
    fn rank(&self, arena: &Arena, node: NodeId) -> Rank {
        arena.stats(node).rank(self.policy, arena[node].last_access)
    }

    /// Whether an entry of the heap at `rank` still describes candidate `node`.
    fn is_current(&self, arena: &Arena, rank: Rank, node: NodeId) -> bool {
        arena.is_live(node) && self.position(node) != NOT_LISTED && self.rank(arena, node) == rank
    }

    /// Checks the order against the tree in `arena`: exactly its unlocked leaves but the root
    /// are candidates, each at the position recorded for it and with an entry of the heap at
    /// its current rank.
    ///
    /// # Errors
    /// [`RadixError::Inconsistent`] at the first node found otherwise: "eviction-order entry at
    /// the leaf's rank", "evictable-leaf set membership" or (at the root) "evictable-leaf set
    /// size".
    pub(super) fn check(&self, arena: &Arena) -> Result<(), RadixError> {
        let ranked: HashSet<NodeId> = self
            .heap
            .iter()
            .filter(|&&Reverse((rank, node))| arena.is_live(node) && self.rank(arena, node) == rank)
            .map(|&Reverse((_, node))| node)
            .collect();
        let mut candidates = 0;
        for (id, node) in arena.live() {
            let candidate = is_candidate(id, node);
            candidates += usize::from(candidate);
            if candidate {
                let entry = usize::from(ranked.contains(&id));
                RadixError::expect_eq(id, "eviction-order entry at the leaf's rank", 1, entry)?;
            }
            RadixError::expect_eq(
                id,
                "evictable-leaf set membership",
                usize::from(candidate),
                usize::from(self.lists(id)),
            )?;
        }
        RadixError::expect_eq(
            NodeId::ROOT,
            "evictable-leaf set size",
            candidates,
            self.candidates.len(),
        )
    }

    /// Heap bytes of the candidates, their positions, the heap and the boxed plan buffers.
    pub(super) fn heap_bytes(&self) -> usize {
        self.candidates.capacity() * size_of::<NodeId>()
            + self.positions.capacity() * size_of::<u32>()
            + self.heap.capacity() * size_of::<OrderEntry>()
            + self
                .scratch
                .as_ref()
                .map_or(0, |scratch| scratch.heap_bytes())
    }

    /// Chooses the victims of an eviction of `num_tokens` tokens from the tree in `arena`, in
    /// order, and returns them as a plan. Changes nothing but the heap, from which it takes the
    /// victims' entries (and drops outdated ones); [`EvictionOrder::finish`] takes the plan
    /// back.
    ///
    /// Parents left childless and unlocked by earlier victims compete at the rank of what they
    /// inherit from them. A grown leaf gives up its newest registration, and what is left of it
    /// competes again with the figures of the registration before: it gives up that one too in
    /// the same step while it still ranks first.
    fn plan(&mut self, arena: &Arena, layout: KeyLayout, num_tokens: usize) -> EvictionPlan {
        let mut scratch = self.scratch.take().unwrap_or_default();
        let page_size = layout.geometry().page_size();
        let mut tokens = 0;
        while tokens < num_tokens {
            let Some(Reverse((_, victim))) = self.next_victim(arena, &mut scratch) else {
                break;
            };
            let planned = scratch
                .nodes
                .entry(victim)
                .or_insert_with(|| PlannedNode::of(arena, victim));
            planned.taken = true;
            let PlannedNode {
                registrations_left,
                last_access,
                stats,
                ..
            } = *planned;
            if registrations_left > 0 {
                let wanted = num_tokens - tokens;
                tokens += self.plan_registrations(arena, layout, victim, wanted, &mut scratch);
                continue;
            }
            scratch.victims.push(Victim::Node(victim));
            tokens += arena.registration_end(victim, 0, layout) * page_size;
            let parent = arena[victim].parent();
            let planned = scratch
                .nodes
                .entry(parent)
                .or_insert_with(|| PlannedNode::of(arena, parent));
            // As the removal of the victim will set them.
            planned.children_left -= 1;
            planned.last_access = planned.last_access.max(last_access);
            planned.stats.absorb(&stats);
            if planned.children_left == 0 && parent != NodeId::ROOT && arena[parent].locks().0 == 0
            {
                let rank = planned.stats.rank(self.policy, planned.last_access);
                scratch.orphans.push(Reverse((rank, parent)));
            }
        }
        EvictionPlan { scratch, tokens }
    }

    /// Takes back the buffers of `plan`; when the eviction was `refused` partway, first puts
    /// back the heap entries the plan took (the victims not freed stay candidates).
    fn finish(&mut self, plan: EvictionPlan, refused: bool) {
        let mut scratch = plan.scratch;
        if refused {
            self.heap.extend(scratch.taken.drain(..));
        }
        scratch.clear();
        self.scratch = Some(scratch);
    }

    /// Plans the eviction of the newest registrations left of the grown leaf `victim`, taken
    /// by this plan: the newest, then the one before for as long as what is left would be
    /// chosen next and fewer than `wanted` tokens are planned. What is left competes again
    /// among the plan's orphans with the figures of the registration that now ends it. Returns
    /// the tokens planned.
    fn plan_registrations(
        &mut self,
        arena: &Arena,
        layout: KeyLayout,
        victim: NodeId,
        wanted: usize,
        scratch: &mut Scratch,
    ) -> usize {
        let rival = self
            .next_listed(arena, scratch)
            .max(scratch.orphans.peek().copied());
        let planned = scratch
            .nodes
            .get_mut(&victim)
            .expect("the victim is planned");
        let had = planned.registrations_left as usize;
        let end = arena.registration_end(victim, had, layout);
        let mut left = had;
        loop {
            left -= 1;
            let (keep, mut figures) = arena.registration(victim, left);
            figures.absorb(&planned.stats);
            planned.stats = figures;
            let tokens = (end - keep) * layout.geometry().page_size();
            let rank = planned.stats.rank(self.policy, planned.last_access);
            if tokens >= wanted || left == 0 || Some(Reverse((rank, victim))) < rival {
                planned.registrations_left = left as u32;
                scratch.orphans.push(Reverse((rank, victim)));
                scratch.victims.push(Victim::Registrations {
                    node: victim,
                    kept: left as u32,
                    had: had as u32,
                });
                return tokens;
            }
        }
    }

    /// The heap's next entry that is current and whose node `scratch` has not taken, after
    /// dropping the others from the top (a leaf listed twice at the same rank, unlisted and
    /// listed again without a new access, has two equal entries).
    fn next_listed(&mut self, arena: &Arena, scratch: &Scratch) -> Option<OrderEntry> {
        while let Some(&Reverse((rank, node))) = self.heap.peek() {
            let taken = scratch
                .nodes
                .get(&node)
                .is_some_and(|planned| planned.taken);
            if self.is_current(arena, rank, node) && !taken {
                break;
            }
            self.heap.pop();
        }
        self.heap.peek().copied()
    }

    /// The first candidate in the policy's order not yet in the plan: the lower ranked of the
    /// heap's next current entry and the plan's next orphan.
    fn next_victim(&mut self, arena: &Arena, scratch: &mut Scratch) -> Option<OrderEntry> {
        let listed = self.next_listed(arena, scratch);
        let orphan = scratch.orphans.peek().copied();
        match (listed, orphan) {
            (Some(listed), Some(orphan)) if orphan > listed => scratch.orphans.pop(),
            (Some(_), _) => {
                let entry = self.heap.pop();
                scratch.taken.extend(entry);
                entry
            }
            (None, _) => scratch.orphans.pop(),
        }
    }

    /// Moves the clock `ticks` ahead, as that many matches would.
    #[cfg(test)]
    fn advance(&mut self, ticks: u64) {
        self.clock += ticks;
    }
}

/// Whether `entry`, the node `id` names, is a candidate of eviction: an unlocked non-root node
/// without children.
fn is_candidate(id: NodeId, entry: &Node) -> bool {
    id != NodeId::ROOT && entry.locks().0 == 0 && entry.child_count() == 0
}

/// What an eviction frees, in eviction order.
#[derive(Debug, Clone, Copy)]
enum Victim {
    /// A node, whole: what is left of it once this plan's earlier victims are gone.
    Node(NodeId),
    /// Registrations `kept + 1..=had` of a grown leaf, newest first; it keeps the others.
    Registrations {
        /// The grown leaf.
        node: NodeId,
        /// Earlier registrations it keeps.
        kept: u32,
        /// Earlier registrations it had before this victim.
        had: u32,
    },
}

/// The victims of one eviction, in order, with the buffer their pages are freed from.
#[derive(Debug)]
struct EvictionPlan {
    scratch: Box<Scratch>,
    /// Tokens the victims hold.
    tokens: usize,
}

impl EvictionPlan {
    /// Tokens the victims hold.
    fn tokens(&self) -> usize {
        self.tokens
    }

    /// The victims, in eviction order, and a buffer for the page ids of the one being freed.
    fn victims(&mut self) -> (&[Victim], &mut Vec<PageId>) {
        (&self.scratch.victims, &mut self.scratch.pages)
    }
}

/// A node a plan touches (a victim, or a parent of victims): what it will hold once this
/// call's victims are removed.
#[derive(Debug, Clone, Copy)]
struct PlannedNode {
    /// Children not yet chosen as victims.
    children_left: u32,
    /// Earlier registrations of a grown leaf not yet chosen as victims (its newest one left is
    /// number `registrations_left`, [`Arena::registration_end`]).
    registrations_left: u32,
    /// Its access time after inheriting its victims'.
    last_access: u64,
    /// Its eviction figures after absorbing its victims'.
    stats: NodeStats,
    /// Whether the plan took the node's entry of the heap (its other entries there are
    /// outdated; what is left of it competes among the plan's orphans).
    taken: bool,
}

impl PlannedNode {
    /// What `node` holds before a plan touches it.
    fn of(arena: &Arena, node: NodeId) -> PlannedNode {
        let entry = &arena[node];
        PlannedNode {
            children_left: entry.child_count() as u32,
            registrations_left: arena.registration_count(node) as u32,
            last_access: entry.last_access,
            stats: *arena.stats(node),
            taken: false,
        }
    }
}

/// Buffers of an eviction plan, kept between calls so that a warm cache plans without
/// allocating.
#[derive(Debug, Default)]
struct Scratch {
    /// What to evict, in eviction order.
    victims: Vec<Victim>,
    /// Current entries taken from the heap, put back if the free is refused.
    taken: Vec<OrderEntry>,
    /// Parents the victims leave childless and unlocked, and grown leaves that lost their
    /// newest registrations: candidates of this call only.
    orphans: BinaryHeap<OrderEntry>,
    /// Per victim and parent of a victim: what it will hold after the victims' removal.
    nodes: HashMap<NodeId, PlannedNode, BuildHasherDefault<KeyHasher>>,
    /// The page ids of the node being freed.
    pages: Vec<PageId>,
}

impl Scratch {
    /// Heap bytes of the boxed buffers, the box included.
    fn heap_bytes(&self) -> usize {
        size_of::<Scratch>()
            + self.victims.capacity() * size_of::<Victim>()
            + (self.taken.capacity() + self.orphans.capacity()) * size_of::<OrderEntry>()
            + self.nodes.capacity() * size_of::<(NodeId, PlannedNode)>()
            + self.pages.capacity() * size_of::<PageId>()
    }

    fn clear(&mut self) {
        self.victims.clear();
        self.taken.clear();
        self.orphans.clear();
        self.nodes.clear();
        self.pages.clear();
    }
}

impl RadixCache {
    /// Evicts at least `num_tokens` tokens if that many are evictable, in the order of the
    /// cache's [`EvictionPolicy`] (least recently used leaf first by default), and returns
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
        let page_size = self.layout.geometry().page_size();
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
        let page_size = self.layout.geometry().page_size();
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
        let tokens = entry.len(layout) - keep * layout.geometry().page_size();
        entry
            .data
            .truncate(layout.key_words(keep * layout.geometry().page_size()));
        // Halving keeps the copies amortized O(1) per page, as the growth's doubling does.
        if entry.data.capacity() > 2 * entry.data.len() {
            entry.data.shrink_to_fit();
        }
        self.sizes.evictable -= tokens;
        self.order.rank_again(&self.arena, node);
    }

    /// Deletes the evictable leaf `leaf`; its parent becomes a candidate when it is left an
    /// unlocked leaf. The parent inherits the leaf's access time when newer and absorbs its hits
    /// and priority ([`NodeStats::absorb`]).
    fn remove_leaf(&mut self, leaf: NodeId) {
        self.record_removed(leaf, 0);
        self.order.set_candidate(&self.arena, leaf, false);
        self.children.unlink(&self.arena, self.layout, leaf);
        let entry = &self.arena[leaf];
        for page in entry.page_ids(self.layout) {
            self.pages.remove(page);
        }
        self.sizes.evictable -= entry.len(self.layout);
        let parent = self.arena.remove_leaf(leaf);
        self.order.refresh(&self.arena, parent);
    }
}

#[cfg(test)]
mod tests {
    use super::super::{EvictionPolicy, Insert, RadixCache, RadixConfig, TreePos};
    use super::*;
    use crate::alloc::{PagedAllocator, SlotCalls};
    use crate::check::{check_radix, small_tree};

    #[test]
    fn the_check_finds_a_leaf_pointing_at_another_leafs_place_in_the_evictable_set() {
        let (mut cache, locked) = small_tree();
        let shared = cache.arena[locked].parent();
        let evictable = cache.order.candidates[0];
        assert_ne!(evictable, locked);
        cache.dec_lock_ref(locked).unwrap();
        // Both leaves are evictable now; the second claims the first's place in the set.
        let order = &mut cache.order;
        order.positions[locked.index()] = order.positions[evictable.index()];
        order.set_candidate(&cache.arena, shared, true);
        assert!(matches!(
            check_radix(&cache),
            Err(RadixError::Inconsistent {
                what: "evictable-leaf set membership",
                ..
            })
        ));
    }

    #[test]
    fn heap_bytes_counts_the_box_and_every_buffer_by_its_capacity() {
        let mut scratch = Scratch::default();
        let mut expected = size_of::<Scratch>();
        assert_eq!(scratch.heap_bytes(), expected);
        scratch.victims.reserve_exact(3);
        expected += scratch.victims.capacity() * size_of::<Victim>();
        assert_eq!(scratch.heap_bytes(), expected);
        scratch.taken.reserve_exact(5);
        expected += scratch.taken.capacity() * size_of::<OrderEntry>();
        assert_eq!(scratch.heap_bytes(), expected);
        scratch.orphans.reserve_exact(7);
        expected += scratch.orphans.capacity() * size_of::<OrderEntry>();
        assert_eq!(scratch.heap_bytes(), expected);
        scratch.nodes.reserve(2);
        expected += scratch.nodes.capacity() * size_of::<(NodeId, PlannedNode)>();
        assert_eq!(scratch.heap_bytes(), expected);
        scratch.pages.reserve_exact(11);
        expected += scratch.pages.capacity() * size_of::<PageId>();
        assert_eq!(scratch.heap_bytes(), expected);
    }

    #[test]
    fn creation_offsets_past_32_bits_turn_the_registrations_into_nodes() {
        // `[1]` locked and grown in place by `[2]` and `[3]`, then `[4]` 2^32 ticks after `[1]`:
        // kept beside it while it is the newest, it cannot be kept as an earlier registration,
        // so `[5]` turns `[1]`, `[2]` and `[3]` into nodes first.
        let config = RadixConfig::new(1).with_policy(EvictionPolicy::Fifo);
        let mut cache = RadixCache::new(config).unwrap();
        let first = cache.insert(Insert::new(&[1], &[1])).unwrap();
        cache.inc_lock_ref(first.last_node).unwrap();
        let mut at = TreePos {
            node: first.last_node,
            len: 1,
        };
        for len in 2..=5 {
            if len == 4 {
                cache.order.advance(u64::from(u32::MAX));
            }
            let key: Vec<u32> = (1..=len).collect();
            let outcome = cache.insert(Insert::new(&key, &key).from(at)).unwrap();
            assert_eq!(outcome.last_node, at.node, "grown in place");
            at.len = len as usize;
        }
        assert_eq!(cache.arena.registration_count(at.node), 1);
        assert_eq!(cache.arena[at.node].start(), 3, "the leaf holds [4, 5]");
        check_radix(&cache).unwrap();
        cache.dec_lock_ref(at.node).unwrap();
        let mut allocator = PagedAllocator::new(16, 1, false).unwrap();
        allocator.alloc(12, &mut Vec::new()).unwrap();
        let mut left = Vec::new();
        for _ in 0..5 {
            assert_eq!(cache.evict(1, &mut allocator).unwrap(), 1);
            left.push(cache.match_prefix(&[1, 2, 3, 4, 5]).len);
            check_radix(&cache).unwrap();
        }
        assert_eq!(left, [4, 3, 2, 1, 0], "newest first");
    }
}
