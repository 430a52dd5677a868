//! The registrations inside a leaf grown in place.
//!
//! sglang gives every registration of a running request a node of its own: each
//! `cache_unfinished_req` inserts the key so far, and `_insert_helper`
//! (`mem_cache/radix_cache.py`) hangs the new pages under the request's last node as a new
//! leaf. kvown appends them to the request's own leaf instead (no walk, no child-index entry,
//! no node), and keeps here where each earlier registration ends and the figures its node
//! would carry. So the leaf still behaves as sglang's chain of nodes:
//!
//! * an eviction takes it one registration at a time, newest first, and the part left competes
//!   with the figures of the registration that now ends it ([`RadixCache::evict`]);
//! * a match or insert that ends inside it first turns its registrations into nodes
//!   ([`RadixCache::cut`]), which is what sglang's tree holds there.
//!
//! An earlier registration's access time is not kept: every access since it was made reached
//! the leaf's end, so the leaf's own access time is never older than its.

use super::RadixCache;
use super::node::NodeId;
use super::policy::{InsertParams, NodeStats};

/// An earlier registration inside a grown leaf: where it ends, and its own node's figures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Registration {
    /// Pages of the leaf up to this registration's end.
    end_page: u32,
    /// Its creation time, in ticks after the leaf's first registration's.
    created_after_first: u32,
    /// Hits recorded at its end while it ended the leaf ([`NodeStats::hits`]).
    hits: u32,
    /// Highest priority recorded at its end ([`NodeStats::priority`]).
    priority: i32,
}

/// The earlier registrations of one grown leaf, oldest first (the newest one is the leaf's own
/// figures).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Registrations {
    /// Creation time of the leaf's first registration.
    first_created: u64,
    list: Vec<Registration>,
}

impl Registrations {
    /// Earlier registrations kept.
    pub(super) fn len(&self) -> usize {
        self.list.len()
    }

    /// Whether the leaf has not grown in place (or its registrations became nodes).
    pub(super) fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// Whether a registration created at `created` can be kept beside these (creation times
    /// are kept as 32-bit offsets from the first).
    fn fits(&self, created: u64) -> bool {
        self.list.is_empty() || created - self.first_created <= u64::from(u32::MAX)
    }

    /// Keeps a registration ending at `end_page` with `stats`, whose creation time must
    /// [`Registrations::fits`] these.
    fn push(&mut self, end_page: usize, stats: &NodeStats) {
        if self.list.is_empty() {
            self.first_created = stats.created;
        }
        self.list.push(Registration {
            end_page: end_page as u32,
            created_after_first: (stats.created - self.first_created) as u32,
            hits: stats.hits,
            priority: stats.priority,
        });
    }

    /// Where the earlier registration `index` (oldest first) ends, and its figures.
    pub(super) fn get(&self, index: usize) -> (usize, NodeStats) {
        let registration = &self.list[index];
        let stats = NodeStats {
            created: self.first_created + u64::from(registration.created_after_first),
            hits: registration.hits,
            priority: registration.priority,
        };
        (registration.end_page as usize, stats)
    }

    /// The earlier registration that ends `end_page` pages into the leaf, if one does.
    pub(super) fn ending_at(&self, end_page: usize) -> Option<usize> {
        self.list
            .binary_search_by_key(&end_page, |registration| registration.end_page as usize)
            .ok()
    }

    /// Records an insert of `params` that ended where earlier registration `index` ends, as its
    /// node would ([`NodeStats::record`]).
    pub(super) fn record(&mut self, index: usize, params: InsertParams) {
        let registration = &mut self.list[index];
        registration.hits = registration.hits.saturating_add(u32::from(!params.chunked));
        registration.priority = registration.priority.max(params.priority);
    }

    /// Forgets the newest earlier registration; the memory of the last goes with it.
    fn pop(&mut self) {
        self.list.pop();
        if self.list.is_empty() {
            self.list = Vec::new();
        }
    }

    /// Gives back spare capacity (the leaf stopped growing).
    pub(super) fn shrink_to_fit(&mut self) {
        self.list.shrink_to_fit();
    }

    /// Heap bytes.
    pub(super) fn heap_bytes(&self) -> usize {
        self.list.capacity() * size_of::<Registration>()
    }

    /// Checks that the registrations end strictly inside a leaf of `pages` pages, in order, and
    /// were created in order, before `created` (the leaf's own); names what is wrong.
    pub(super) fn inconsistency(&self, pages: usize, created: u64) -> Option<&'static str> {
        let mut end = 0;
        let mut after_first = None;
        for registration in &self.list {
            if registration.end_page as usize <= end {
                return Some("registration ends out of order");
            }
            if after_first >= Some(registration.created_after_first) {
                return Some("registration created out of order");
            }
            end = registration.end_page as usize;
            after_first = Some(registration.created_after_first);
        }
        let newest_created = after_first.map(|offset| self.first_created + u64::from(offset));
        if end >= pages {
            Some("registration ends past the leaf's newest")
        } else if newest_created.is_some_and(|newest| newest >= created) {
            Some("registration created after the leaf's newest")
        } else {
            None
        }
    }
}

/// Where [`RadixCache::cut`] made a node end.
#[derive(Debug, Clone, Copy)]
pub(super) struct Cut {
    /// The node that now ends at the position.
    pub(super) upper: NodeId,
    /// The node that starts there, on the path of the node that was cut.
    pub(super) lower: NodeId,
    /// Whether the position was inside a node (sglang's split) rather than where one of the
    /// leaf's registrations ended (where sglang had a node boundary already).
    pub(super) split: bool,
}

impl RadixCache {
    /// Starts a new registration at the end of the leaf `node`, which is about to grow in
    /// place at `now`: what it holds becomes an earlier registration with the leaf's figures,
    /// and the leaf's figures become the new registration's (created `now`, nothing recorded).
    #[inline]
    pub(super) fn open_registration(&mut self, node: NodeId, now: u64) {
        let end_page = self.arena[node].num_pages(self.layout);
        let (stats, registrations) = self.arena.figures_mut(node);
        if registrations.fits(stats.created) {
            registrations.push(end_page, stats);
            *stats = NodeStats::new(now);
        } else {
            self.materialize(node);
            self.open_registration(node, now);
        }
    }

    /// Where registration `index` of `node` ends, in pages, counting its earlier registrations
    /// oldest first from 0 and the newest (what the leaf's own figures describe) as the last,
    /// number [`Registrations::len`].
    pub(super) fn registration_end(&self, node: NodeId, index: usize) -> usize {
        match self.arena.registrations(node) {
            Some(registrations) if index < registrations.len() => registrations.get(index).0,
            _ => self.arena[node].num_pages(self.layout),
        }
    }

    /// Forgets all but the first `kept` earlier registrations of the evictable grown leaf
    /// `node`, whose pages the caller has freed: the leaf keeps the pages up to where
    /// registration `kept` ends, with its figures having absorbed the removed ones' (sglang
    /// deletes the leaves of the newest registrations one by one, each parent becoming a
    /// candidate). The caller lists the leaf again at its new rank (`push_order`).
    pub(super) fn remove_registrations(&mut self, node: NodeId, kept: usize) {
        let layout = self.layout;
        let keep = self.registration_end(node, kept);
        let (stats, registrations) = self.arena.figures_mut(node);
        while registrations.len() > kept {
            let (_, mut own) = registrations.get(registrations.len() - 1);
            own.absorb(stats);
            *stats = own;
            registrations.pop();
        }
        self.record_removed(node, keep);
        let entry = &mut self.arena[node];
        for page in keep..entry.num_pages(layout) {
            self.pages.remove(entry.page_id(page, layout));
        }
        let tokens = entry.len(layout) - keep * layout.page_size();
        entry
            .data
            .truncate(layout.key_words(keep * layout.page_size()));
        // Halving keeps the copies amortized O(1) per page, as the growth's doubling does.
        if entry.data.capacity() > 2 * entry.data.len() {
            entry.data.shrink_to_fit();
        }
        self.evictable_size -= tokens;
        self.total_size -= tokens;
    }

    /// Turns the earlier registrations of `node` into nodes above it, each with its figures
    /// (and the leaf's access time, never older than its own), as sglang's tree holds them.
    /// `node` keeps its handle, locks and children with its newest registration's pages.
    pub(super) fn materialize(&mut self, node: NodeId) {
        let registrations = std::mem::take(self.arena.registrations_mut(node));
        let start = self.arena[node].start();
        let mut lower = node;
        for index in (0..registrations.len()).rev() {
            let (end_page, stats) = registrations.get(index);
            let end = start + end_page * self.layout.page_size();
            let upper = self.split(lower, end, stats.created);
            *self.arena.stats_mut(upper) = stats;
            lower = upper;
        }
    }

    /// Makes a node end at `pos` (page-aligned, strictly inside `node`'s key), as sglang's
    /// split at time `now`: `node`'s registrations become nodes, then the one holding `pos` is
    /// split unless it starts there.
    pub(super) fn cut(&mut self, node: NodeId, pos: usize, now: u64) -> Cut {
        self.materialize(node);
        let mut lower = node;
        while self.arena[lower].start() > pos {
            lower = self.arena[lower].parent;
        }
        if self.arena[lower].start() == pos {
            let upper = self.arena[lower].parent;
            return Cut {
                upper,
                lower,
                split: false,
            };
        }
        let upper = self.split(lower, pos, now);
        Cut {
            upper,
            lower,
            split: true,
        }
    }

    /// What is wrong with the registrations of `node`, if it has any.
    pub(super) fn registration_inconsistency(&self, node: NodeId) -> Option<&'static str> {
        let registrations = self.arena.registrations(node)?;
        let entry = &self.arena[node];
        registrations.inconsistency(entry.num_pages(self.layout), self.arena.stats(node).created)
    }
}

#[cfg(test)]
mod tests {
    use super::super::{EvictionPolicy, InsertParams, Namespace, RadixCache, RadixError, TreePos};
    use super::Registrations;
    use crate::alloc::{KvAllocator, PagedAllocator};

    /// A cache of page size 1 under `policy` holding `[1]`, locked and grown in place by
    /// registrations of `[2]` and `[3]` (as a decoding request registers its pages), with slots
    /// equal to the tokens.
    fn grown(policy: EvictionPolicy) -> (RadixCache, TreePos) {
        let mut cache = RadixCache::with_policy(1, policy);
        let first = cache.insert(&[1], &[1]).unwrap();
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
            let outcome = cache
                .insert_from_with(Namespace::DEFAULT, at, &key, &key, registration)
                .unwrap();
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
        assert_eq!(cache.total_size(), 2);
        assert_eq!(cache.match_prefix(&[1, 2, 3]).len, 2, "[3] went first");
        cache.check().unwrap();
        assert_eq!(cache.evict(2, &mut allocator).unwrap(), 2);
        assert_eq!(cache.total_size(), 0);
        cache.check().unwrap();
    }

    #[test]
    fn under_fifo_each_registration_competes_at_its_own_creation_time() {
        let (mut cache, at) = grown(EvictionPolicy::Fifo);
        // [9] is cached after the leaf's registrations. The leaf competes as its newest
        // registration, [3], created before [9]; then as [2], then as [1]; [9] goes last.
        cache.insert(&[9], &[9]).unwrap();
        cache.dec_lock_ref(at.node).unwrap();
        let mut allocator = allocator();
        let mut order = Vec::new();
        for _ in 0..4 {
            let before: Vec<u32> = cache.cached_slots().collect();
            assert_eq!(cache.evict(1, &mut allocator).unwrap(), 1);
            let after: Vec<u32> = cache.cached_slots().collect();
            order.extend(before.into_iter().filter(|slot| !after.contains(slot)));
            cache.check().unwrap();
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
        assert!(cache.arena.registrations(at.node).is_none());
        assert_eq!(
            cache.arena[at.node].start(),
            2,
            "the leaf keeps its newest pages"
        );
        cache.check().unwrap();
        // The locked leaf and its new ancestors are still protected, and nothing is evictable.
        assert_eq!(cache.protected_size(), 3);
        assert_eq!(cache.evictable_size(), 0);
    }

    #[test]
    fn creation_offsets_past_32_bits_turn_the_registrations_into_nodes() {
        let (mut cache, mut at) = grown(EvictionPolicy::Fifo);
        cache.clock += u64::from(u32::MAX);
        // [4] is created 2^32 ticks after [1]: kept beside it while it is the newest, it cannot
        // be kept as an earlier registration, so [5] turns [1], [2] and [3] into nodes first.
        for len in [4, 5] {
            let key: Vec<u32> = (1..=len).collect();
            let outcome = cache
                .insert_from_with(Namespace::DEFAULT, at, &key, &key, InsertParams::default())
                .unwrap();
            assert_eq!(outcome.last_node, at.node);
            at.len = len as usize;
        }
        assert_eq!(cache.arena.registrations(at.node).map(|r| r.len()), Some(1));
        assert_eq!(cache.arena[at.node].start(), 3, "the leaf holds [4, 5]");
        cache.check().unwrap();
        cache.dec_lock_ref(at.node).unwrap();
        let mut allocator = allocator();
        let mut left = Vec::new();
        for _ in 0..5 {
            assert_eq!(cache.evict(1, &mut allocator).unwrap(), 1);
            left.push(cache.match_prefix(&[1, 2, 3, 4, 5]).len);
            cache.check().unwrap();
        }
        assert_eq!(left, [4, 3, 2, 1, 0], "newest first");
    }

    #[test]
    fn the_check_finds_registrations_out_of_order_or_past_the_leaf() {
        let broken = |wreck: fn(&mut Registrations)| {
            let (mut cache, at) = grown(EvictionPolicy::Lru);
            cache.check().unwrap();
            wreck(cache.arena.registrations_mut(at.node));
            match cache.check() {
                Err(RadixError::Inconsistent { what, .. }) => what,
                other => panic!("the check passed a broken leaf: {other:?}"),
            }
        };
        assert_eq!(
            broken(|r| r.list.swap(0, 1)),
            "registration ends out of order"
        );
        assert_eq!(
            broken(|r| r.list[1].created_after_first = 0),
            "registration created out of order"
        );
        assert_eq!(
            broken(|r| r.list[1].end_page = 3),
            "registration ends past the leaf's newest"
        );
        assert_eq!(
            broken(|r| r.list[1].created_after_first = 7),
            "registration created after the leaf's newest"
        );
    }

    #[test]
    fn a_refused_free_leaves_a_grown_leaf_as_it_was() {
        let (mut cache, at) = grown(EvictionPolicy::Lru);
        cache.dec_lock_ref(at.node).unwrap();
        let before = (
            cache.arena.registrations(at.node).cloned(),
            cache.total_size(),
        );
        // Slots 1..=3 were never handed out by this allocator: the free is refused.
        let mut fresh = PagedAllocator::new(16, 1, false).unwrap();
        assert!(cache.evict(2, &mut fresh).is_err());
        let after = (
            cache.arena.registrations(at.node).cloned(),
            cache.total_size(),
        );
        assert_eq!(after, before);
        cache.check().unwrap();
        // The leaf is still evicted newest registration first.
        let mut allocator = allocator();
        assert_eq!(cache.evict(1, &mut allocator).unwrap(), 1);
        assert_eq!(cache.match_prefix(&[1, 2, 3]).len, 2);
    }
}
