//! Eviction: freeing unlocked leaves through the allocator in the order of the cache's
//! [`super::EvictionPolicy`].
//!
//! An eviction is planned before anything changes: the victims are chosen in the policy's
//! order (parents left childless by earlier victims of the same call compete at the rank of
//! what they inherit from them). Then each victim's pages are freed with one allocator call and
//! the node deleted, victim after victim (sglang `RadixCache.evict`). An allocator that refuses
//! a victim's pages leaves it and the later victims cached.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::hash::BuildHasherDefault;

use super::children::KeyHasher;
use super::node::NodeId;
use super::policy::NodeStats;
use super::{OrderEntry, RadixCache, RadixError};
use crate::alloc::{AllocError, KvAllocator, PageId};

/// A node a plan touches (a victim, or a parent of victims): what it will hold once this
/// call's victims are removed.
#[derive(Debug, Clone, Copy)]
struct PlannedNode {
    /// Children not yet chosen as victims.
    children_left: u32,
    /// Earlier registrations of a grown leaf not yet chosen as victims (its newest one left is
    /// number `registrations_left`, [`RadixCache::registration_end`]).
    registrations_left: u32,
    /// Its access time after inheriting its victims' ([`RadixCache::remove_leaf`]).
    last_access: u64,
    /// Its eviction figures after absorbing its victims'.
    stats: NodeStats,
    /// Whether the plan took the node's entry of the eviction order (its other entries there
    /// are outdated; what is left of it competes among the plan's orphans).
    taken: bool,
}

/// What an eviction frees, in eviction order.
#[derive(Debug, Clone, Copy)]
enum Victim {
    /// A node, whole: what is left of it once this plan's earlier victims are gone.
    Node(NodeId),
    /// Registrations `kept + 1..=had` of a grown leaf, newest first; it keeps the others.
    Registrations { node: NodeId, kept: u32, had: u32 },
}

/// Buffers of an eviction plan, kept between calls so that a warm cache plans without
/// allocating.
#[derive(Debug, Default)]
pub(super) struct EvictionScratch {
    /// What to evict, in eviction order.
    victims: Vec<Victim>,
    /// Current entries taken from the cache's eviction order, put back if the free is refused.
    taken: Vec<OrderEntry>,
    /// Parents the victims leave childless and unlocked, and grown leaves that lost their
    /// newest registrations: candidates of this call only.
    orphans: BinaryHeap<OrderEntry>,
    /// Per victim and parent of a victim: what it will hold after the victims' removal.
    nodes: HashMap<NodeId, PlannedNode, BuildHasherDefault<KeyHasher>>,
    /// The page ids of the node being freed.
    pages: Vec<PageId>,
}

impl EvictionScratch {
    /// Heap bytes of the boxed buffers, the box included.
    pub(super) fn heap_bytes(&self) -> usize {
        size_of::<EvictionScratch>()
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
    /// cache's [`super::EvictionPolicy`] (least recently used leaf first by default), and returns
    /// the tokens evicted.
    ///
    /// Whole nodes are evicted, so the result may exceed `num_tokens`; it is smaller only when
    /// everything evictable is gone. Locked nodes are never touched. A parent left without
    /// children and unlocked becomes a candidate in the same call, with the latest access time,
    /// the highest priority and the sum of the hits of it and its evicted children. A leaf that
    /// a running request grew in place is evicted as sglang's node per registration would be:
    /// its newest registration first, the rest competing again with the figures of the
    /// registration that now ends it.
    ///
    /// The victims are chosen first; then each one's pages are freed with one
    /// `alloc.free_page_ids(pages)` call, in key order, and the node deleted, victim after
    /// victim in eviction order (a grown leaf's registrations one call each), as sglang's
    /// `evict` frees node by node: a LIFO allocator then reuses the last victim's pages first.
    ///
    /// Cost: O(log leaves + node tokens) per evicted node, amortized: the eviction order is kept
    /// across calls (sglang rebuilds a heap of every leaf on each call).
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
        self.ensure_page_size(alloc)?;
        let mut plan = std::mem::take(&mut *self.eviction);
        let result = self.evict_planned(num_tokens, alloc, &mut plan);
        plan.clear();
        *self.eviction = plan;
        result
    }

    /// Evicts only what the allocator lacks for `num_tokens` more slots (sglang
    /// `evict_from_tree_cache`): nothing when `available_size() >= num_tokens`, otherwise
    /// `evict(num_tokens - available_size())`. Returns the tokens evicted.
    ///
    /// # Errors
    /// As [`RadixCache::evict`]: an allocator of another page size is refused even when it
    /// has room enough.
    pub fn evict_shortfall<A: KvAllocator + ?Sized>(
        &mut self,
        num_tokens: usize,
        alloc: &mut A,
    ) -> Result<usize, RadixError> {
        self.ensure_page_size(alloc)?;
        let available = alloc.available_size();
        if available >= num_tokens {
            return Ok(0);
        }
        self.evict(num_tokens - available, alloc)
    }

    /// [`RadixError::PageSizeMismatch`] unless `alloc` has this cache's page size.
    fn ensure_page_size<A: KvAllocator + ?Sized>(&self, alloc: &A) -> Result<(), RadixError> {
        if alloc.page_size() != self.layout.page_size() {
            return Err(RadixError::PageSizeMismatch {
                cache: self.layout.page_size(),
                allocator: alloc.page_size(),
            });
        }
        Ok(())
    }

    /// [`RadixCache::evict`] with `plan` (empty) as its buffers: plans, then frees and deletes
    /// victim by victim, one allocator call per node sglang would delete (a grown leaf's
    /// registration is one).
    fn evict_planned<A: KvAllocator + ?Sized>(
        &mut self,
        num_tokens: usize,
        alloc: &mut A,
        plan: &mut EvictionScratch,
    ) -> Result<usize, RadixError> {
        let tokens = self.plan_eviction(num_tokens, plan);
        let page_size = self.layout.page_size();
        let mut evicted = 0;
        for index in 0..plan.victims.len() {
            let result = match plan.victims[index] {
                Victim::Node(node) => {
                    let pages = 0..self.registration_end(node, 0);
                    let freed = self.free_pages(node, pages, alloc, &mut plan.pages);
                    if freed.is_ok() {
                        self.remove_leaf(node);
                    }
                    freed
                }
                Victim::Registrations { node, kept, had } => {
                    self.free_registrations(node, kept as usize, had as usize, alloc, plan)
                }
            };
            match result {
                Ok(freed) => evicted += freed * page_size,
                Err((freed, source)) => {
                    self.order.extend(plan.taken.drain(..));
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

    /// Frees pages `pages` of `node` in key order with one allocator call (sglang's `evict`
    /// frees each node's value with one `free_segment`); returns how many, or the refusal.
    fn free_pages<A: KvAllocator + ?Sized>(
        &self,
        node: NodeId,
        pages: std::ops::Range<usize>,
        alloc: &mut A,
        buffer: &mut Vec<PageId>,
    ) -> Result<usize, (usize, AllocError)> {
        let entry = &self.arena[node];
        buffer.clear();
        buffer.extend(pages.map(|page| entry.page_id(page, self.layout)));
        alloc
            .free_page_ids(buffer)
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
        plan: &mut EvictionScratch,
    ) -> Result<usize, (usize, AllocError)> {
        let mut freed = 0;
        for index in (kept + 1..=had).rev() {
            let pages = self.registration_end(node, index - 1)..self.registration_end(node, index);
            if let Err((_, source)) = self.free_pages(node, pages, alloc, &mut plan.pages) {
                if index < had {
                    self.remove_registrations(node, index);
                    self.push_order(node);
                }
                return Err((freed, source));
            }
            freed += plan.pages.len();
        }
        self.remove_registrations(node, kept);
        self.push_order(node);
        Ok(freed)
    }

    /// Chooses the victims of an eviction of `num_tokens` tokens into `plan` (in order) and
    /// returns their tokens. Changes nothing but the eviction order, from which it takes the
    /// victims' entries (and drops outdated ones) into `plan.taken`.
    ///
    /// A grown leaf gives up its newest registration, as sglang's leaf for it would go, and
    /// what is left of it competes again with the figures of the registration before: it gives
    /// up that one too in the same step while it still ranks first.
    fn plan_eviction(&mut self, num_tokens: usize, plan: &mut EvictionScratch) -> usize {
        let page_size = self.layout.page_size();
        let mut tokens = 0;
        while tokens < num_tokens {
            let Some(Reverse((_, victim))) = self.next_victim(plan) else {
                break;
            };
            let planned = plan
                .nodes
                .entry(victim)
                .or_insert_with(|| self.planned_node(victim));
            planned.taken = true;
            let PlannedNode {
                registrations_left,
                last_access,
                stats,
                ..
            } = *planned;
            if registrations_left > 0 {
                tokens += self.plan_registrations(victim, num_tokens - tokens, plan);
                continue;
            }
            plan.victims.push(Victim::Node(victim));
            tokens += self.registration_end(victim, 0) * page_size;
            let parent = self.arena[victim].parent;
            let planned = plan
                .nodes
                .entry(parent)
                .or_insert_with(|| self.planned_node(parent));
            // As `remove_leaf` will set them.
            planned.children_left -= 1;
            planned.last_access = planned.last_access.max(last_access);
            planned.stats.absorb(&stats);
            if planned.children_left == 0
                && parent != NodeId::ROOT
                && self.arena[parent].lock_ref == 0
            {
                let rank = self.policy.rank(planned.last_access, &planned.stats);
                plan.orphans.push(Reverse((rank, parent)));
            }
        }
        tokens
    }

    /// Plans the eviction of the newest registrations left of the grown leaf `victim`, taken
    /// by this plan: the newest, then the one before for as long as what is left would be
    /// chosen next and fewer than `wanted` tokens are planned. What is left competes again
    /// among the plan's orphans with the figures of the registration that now ends it. Returns
    /// the tokens planned.
    fn plan_registrations(
        &mut self,
        victim: NodeId,
        wanted: usize,
        plan: &mut EvictionScratch,
    ) -> usize {
        let rival = self.next_listed(plan).max(plan.orphans.peek().copied());
        let planned = plan.nodes.get_mut(&victim).expect("the victim is planned");
        let registrations = self
            .arena
            .registrations(victim)
            .expect("a planned registration is the node's");
        let had = planned.registrations_left as usize;
        let end = self.registration_end(victim, had);
        let mut left = had;
        loop {
            left -= 1;
            let (keep, mut figures) = registrations.get(left);
            figures.absorb(&planned.stats);
            planned.stats = figures;
            let tokens = (end - keep) * self.layout.page_size();
            let rank = self.policy.rank(planned.last_access, &planned.stats);
            if tokens >= wanted || left == 0 || Some(Reverse((rank, victim))) < rival {
                planned.registrations_left = left as u32;
                plan.orphans.push(Reverse((rank, victim)));
                plan.victims.push(Victim::Registrations {
                    node: victim,
                    kept: left as u32,
                    had: had as u32,
                });
                return tokens;
            }
        }
    }

    /// What `node` holds before a plan touches it.
    fn planned_node(&self, node: NodeId) -> PlannedNode {
        let entry = &self.arena[node];
        let registrations = self.arena.registrations(node).map_or(0, |r| r.len());
        PlannedNode {
            children_left: entry.child_count,
            registrations_left: registrations as u32,
            last_access: entry.last_access,
            stats: *self.arena.stats(node),
            taken: false,
        }
    }

    /// The eviction order's next entry that is current and whose node `plan` has not taken,
    /// after dropping the others from the top (a leaf listed twice at the same rank, unlisted
    /// and listed again without a new access, has two equal entries).
    fn next_listed(&mut self, plan: &EvictionScratch) -> Option<OrderEntry> {
        while let Some(&Reverse((rank, node))) = self.order.peek() {
            let taken = plan.nodes.get(&node).is_some_and(|planned| planned.taken);
            if self.is_current_entry(rank, node) && !taken {
                break;
            }
            self.order.pop();
        }
        self.order.peek().copied()
    }

    /// The first candidate in the policy's order not yet in `plan`: the lower ranked of the
    /// eviction order's next current entry and the plan's next orphan.
    fn next_victim(&mut self, plan: &mut EvictionScratch) -> Option<OrderEntry> {
        let listed = self.next_listed(plan);
        let orphan = plan.orphans.peek().copied();
        match (listed, orphan) {
            (Some(listed), Some(orphan)) if orphan > listed => plan.orphans.pop(),
            (Some(_), _) => {
                let entry = self.order.pop();
                plan.taken.extend(entry);
                entry
            }
            (None, _) => plan.orphans.pop(),
        }
    }

    /// Deletes the evictable leaf `leaf`; its parent becomes a candidate when it is left an
    /// unlocked leaf. The parent inherits the leaf's access time when newer (sglang stamps whole
    /// paths) and absorbs its hits and priority ([`NodeStats::absorb`]).
    fn remove_leaf(&mut self, leaf: NodeId) {
        self.record_removed(leaf, 0);
        self.list_evictable(leaf, false);
        self.children.unlink(&mut self.arena, self.layout, leaf);
        let entry = &self.arena[leaf];
        for page in entry.page_ids(self.layout) {
            self.pages.remove(page);
        }
        let (tokens, parent, last_access) =
            (entry.len(self.layout), entry.parent, entry.last_access);
        let stats = *self.arena.stats(leaf);
        self.evictable_size -= tokens;
        self.total_size -= tokens;
        self.arena.release(leaf);
        let parent_entry = &mut self.arena[parent];
        parent_entry.child_count -= 1;
        parent_entry.last_access = parent_entry.last_access.max(last_access);
        self.arena.stats_mut(parent).absorb(&stats);
        self.refresh_leaf_status(parent);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heap_bytes_counts_the_box_and_every_buffer_by_its_capacity() {
        let mut scratch = EvictionScratch::default();
        let mut expected = size_of::<EvictionScratch>();
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
}
