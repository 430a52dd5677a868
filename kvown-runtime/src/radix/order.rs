//! The eviction order: which unlocked leaves an eviction may take (the candidates), in the
//! order of the cache's [`EvictionPolicy`], and the plan of one eviction.
//!
//! The order is kept across calls: every candidate has an entry in a heap at its current rank;
//! an entry made outdated by a later access is skipped when it comes up, and the heap is rebuilt
//! from the candidates once outdated entries make up most of it (sglang `RadixCache.evict`
//! builds a heap of every leaf per call). Planning an eviction takes the victims from the heap
//! in order and changes nothing else: the cache frees them afterwards ([`super::evict`]).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet};
use std::hash::BuildHasherDefault;

use super::children::KeyHasher;
use super::layout::KeyLayout;
use super::node::{Arena, NOT_EVICTABLE, NodeId};
use super::policy::{EvictionPolicy, NodeStats, Rank};
use crate::ids::PageId;

/// Outdated entries of the heap tolerated beyond twice the candidates before a rebuild.
const ORDER_SLACK: usize = 64;

/// An entry of the heap: a candidate's rank when it was listed, and the candidate.
type OrderEntry = Reverse<(Rank, NodeId)>;

/// The candidates of eviction in the policy's order, the logical clock their access times are
/// read on, and the reusable buffers of eviction plans.
#[derive(Debug)]
pub(super) struct EvictionOrder {
    policy: EvictionPolicy,
    /// Logical clock for access times; ticks once per match or insert.
    clock: u64,
    /// Unlocked non-root nodes without children; each knows its position here
    /// ([`super::node::Node::leaf_pos`]).
    candidates: Vec<NodeId>,
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

    /// Makes `node` a candidate or not, to match `candidate`, in O(1) (amortized O(log n) to
    /// list it).
    pub(super) fn set_candidate(&mut self, arena: &mut Arena, node: NodeId, candidate: bool) {
        let pos = arena[node].leaf_pos;
        if candidate && pos == NOT_EVICTABLE {
            arena[node].leaf_pos = self.candidates.len() as u32;
            self.candidates.push(node);
            self.rank_again(arena, node);
        } else if !candidate && pos != NOT_EVICTABLE {
            let pos = pos as usize;
            self.candidates.swap_remove(pos);
            if let Some(&moved) = self.candidates.get(pos) {
                arena[moved].leaf_pos = pos as u32;
            }
            arena[node].leaf_pos = NOT_EVICTABLE;
        }
    }

    /// Sets `node`'s access time to `now`, keeping its place current when it is a candidate.
    #[inline]
    pub(super) fn stamp(&mut self, arena: &mut Arena, node: NodeId, now: u64) {
        arena[node].last_access = now;
        if arena[node].leaf_pos != NOT_EVICTABLE {
            self.rank_again(arena, node);
        }
    }

    /// Records candidate `node` at its current rank (after its figures changed); rebuilds the
    /// heap from the candidates when outdated entries make up most of it.
    pub(super) fn rank_again(&mut self, arena: &Arena, node: NodeId) {
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
        self.policy.rank(arena[node].last_access, arena.stats(node))
    }

    /// Whether an entry of the heap at `rank` still describes candidate `node`.
    fn is_current(&self, arena: &Arena, rank: Rank, node: NodeId) -> bool {
        arena.is_live(node)
            && arena[node].leaf_pos != NOT_EVICTABLE
            && self.rank(arena, node) == rank
    }

    /// The candidates, in no particular order.
    pub(super) fn candidates(&self) -> &[NodeId] {
        &self.candidates
    }

    /// The live nodes the heap holds an entry for at their current rank.
    pub(super) fn ranked(&self, arena: &Arena) -> HashSet<NodeId> {
        self.heap
            .iter()
            .filter(|&&Reverse((rank, node))| arena.is_live(node) && self.rank(arena, node) == rank)
            .map(|&Reverse((_, node))| node)
            .collect()
    }

    /// Heap bytes of the candidates, the heap and the boxed plan buffers.
    pub(super) fn heap_bytes(&self) -> usize {
        self.candidates.capacity() * size_of::<NodeId>()
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
    pub(super) fn plan(
        &mut self,
        arena: &Arena,
        layout: KeyLayout,
        num_tokens: usize,
    ) -> EvictionPlan {
        let mut scratch = self.scratch.take().unwrap_or_default();
        let page_size = layout.page_size();
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
            let parent = arena[victim].parent;
            let planned = scratch
                .nodes
                .entry(parent)
                .or_insert_with(|| PlannedNode::of(arena, parent));
            // As the removal of the victim will set them.
            planned.children_left -= 1;
            planned.last_access = planned.last_access.max(last_access);
            planned.stats.absorb(&stats);
            if planned.children_left == 0 && parent != NodeId::ROOT && arena[parent].lock_ref == 0 {
                let rank = self.policy.rank(planned.last_access, &planned.stats);
                scratch.orphans.push(Reverse((rank, parent)));
            }
        }
        EvictionPlan { scratch, tokens }
    }

    /// Takes back the buffers of `plan`; when the eviction was `refused` partway, first puts
    /// back the heap entries the plan took (the victims not freed stay candidates).
    pub(super) fn finish(&mut self, plan: EvictionPlan, refused: bool) {
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
            let tokens = (end - keep) * layout.page_size();
            let rank = self.policy.rank(planned.last_access, &planned.stats);
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

/// What an eviction frees, in eviction order.
#[derive(Debug, Clone, Copy)]
pub(super) enum Victim {
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
pub(super) struct EvictionPlan {
    scratch: Box<Scratch>,
    /// Tokens the victims hold.
    tokens: usize,
}

impl EvictionPlan {
    /// Tokens the victims hold.
    pub(super) fn tokens(&self) -> usize {
        self.tokens
    }

    /// The victims, in eviction order, and a buffer for the page ids of the one being freed.
    pub(super) fn victims(&mut self) -> (&[Victim], &mut Vec<PageId>) {
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
            children_left: entry.child_count,
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

#[cfg(test)]
mod tests {
    use super::super::{EvictionPolicy, Insert, RadixCache, RadixConfig, TreePos};
    use super::*;
    use crate::alloc::{PagedAllocator, SlotCalls};
    use crate::check::check_radix;

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
