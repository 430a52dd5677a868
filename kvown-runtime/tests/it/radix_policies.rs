//! Eviction policies: the order each one evicts in, what a parent left childless inherits from
//! its evicted children (across calls and within one call), and what the batch flow records
//! (a request's priority; a hit when a finished request is inserted, none when a running one
//! registers its pages).

use kvown_runtime::alloc::{KvAllocator, KvSlot, PageId, PagedAllocator, SlotCalls};
use kvown_runtime::batch::Req;
use kvown_runtime::batch::{ScheduleBatch, alloc_for_extend, prepare_for_extend, release_kv_cache};
use kvown_runtime::batch::{cache_unfinished_req, init_next_round_input};
use kvown_runtime::cache::{KvCache, TreeCache};
use kvown_runtime::check::check_radix;
use kvown_runtime::radix::{
    EvictionPolicy, Insert, InsertParams, RadixCache, RadixConfig, TreePos,
};
use kvown_runtime::slots::ReqToTokenPool;

/// A page-size-1 cache with a policy, and keys inserted under names.
struct Scene {
    tree: RadixCache,
    alloc: PagedAllocator,
    /// Per name: the slots of the key's last token, the one the key's own node holds.
    names: Vec<(&'static str, KvSlot)>,
}

impl Scene {
    fn new(policy: EvictionPolicy) -> Scene {
        Scene {
            tree: RadixCache::new(RadixConfig::new(1).with_policy(policy)).unwrap(),
            alloc: PagedAllocator::new(64, 1, false).unwrap(),
            names: Vec::new(),
        }
    }

    /// Inserts `key` from the root with `params`, naming the node that holds its last token;
    /// frees the duplicates. Returns the slots it passed.
    fn insert(&mut self, name: &'static str, key: &[u32], params: InsertParams) -> Vec<KvSlot> {
        let mut slots = Vec::new();
        self.alloc.alloc(key.len(), &mut slots).unwrap();
        let outcome = self
            .tree
            .insert(Insert::new(key, &slots).from(TreePos::ROOT).params(params))
            .unwrap();
        self.alloc
            .free_segment(&slots[..outcome.prefix_len], 0)
            .unwrap();
        if outcome.prefix_len < key.len() {
            self.names.push((name, slots[key.len() - 1]));
        }
        check_radix(&self.tree).unwrap();
        slots
    }

    /// The named keys still cached (read without touching access times).
    fn cached(&self) -> Vec<&'static str> {
        let page_size = self.tree.config().page_size as KvSlot;
        let held: Vec<PageId> = self.tree.cached_pages().map(|(_, page)| page).collect();
        self.names
            .iter()
            .filter(|(_, slot)| held.contains(&(slot / page_size)))
            .map(|&(name, _)| name)
            .collect()
    }

    /// Evicts one node at a time until nothing is evictable; the names in eviction order.
    fn eviction_order(&mut self) -> Vec<&'static str> {
        let mut order = Vec::new();
        while self.tree.evict(1, &mut self.alloc).unwrap() > 0 {
            check_radix(&self.tree).unwrap();
            let left = self.cached();
            order.extend(self.cached_before(&left));
        }
        order
    }

    /// The names cached before this eviction that `left` no longer holds.
    fn cached_before(&mut self, left: &[&'static str]) -> Vec<&'static str> {
        let (gone, kept) = self
            .names
            .iter()
            .partition(|(name, _)| !left.contains(name));
        self.names = kept;
        gone.into_iter().map(|(name, _)| name).collect()
    }
}

fn params(priority: i32, chunked: bool) -> InsertParams {
    InsertParams { priority, chunked }
}

#[test]
fn each_policy_evicts_in_its_own_order() {
    // Three leaves under the root. `a` is cached first (priority 5, one hit), `b` second
    // (priority -1, a chunked insert: no hit), `c` third (priority 0) and inserted twice (two
    // hits); then `a` is matched, so the access order is b, c, a.
    let expected = [
        (EvictionPolicy::Lru, ["b", "c", "a"]),
        (EvictionPolicy::Mru, ["a", "c", "b"]),
        (EvictionPolicy::Fifo, ["a", "b", "c"]),
        (EvictionPolicy::Filo, ["c", "b", "a"]),
        (EvictionPolicy::Lfu, ["b", "a", "c"]),
        // Below two hits first (b, then a: older access), then c.
        (EvictionPolicy::Slru, ["b", "a", "c"]),
        (EvictionPolicy::Priority, ["b", "c", "a"]),
    ];
    for (policy, order) in expected {
        let mut scene = Scene::new(policy);
        assert_eq!(scene.tree.config().policy, policy);
        scene.insert("a", &[1, 1], params(5, false));
        scene.insert("b", &[2, 2], params(-1, true));
        scene.insert("c", &[3, 3], params(0, false));
        scene.insert("c again", &[3, 3], params(0, false));
        assert_eq!(scene.tree.match_prefix(&[1, 1]).len, 2);
        assert_eq!(scene.eviction_order(), order, "{policy}");
        assert_eq!(scene.alloc.available_size(), scene.alloc.capacity());
    }
}

#[test]
fn priority_and_lfu_set_apart_what_lru_would_evict_first() {
    // `old` is cached first and never touched again, but with a higher priority and more hits
    // than `new`: LRU evicts it first, Priority and LFU keep it.
    for (policy, first) in [
        (EvictionPolicy::Lru, "old"),
        (EvictionPolicy::Priority, "new"),
        (EvictionPolicy::Lfu, "new"),
    ] {
        let mut scene = Scene::new(policy);
        scene.insert("old", &[1, 1], params(3, false));
        scene.insert("old again", &[1, 1], params(3, false));
        scene.insert("new", &[2, 2], params(0, false));
        assert_eq!(scene.tree.evict(1, &mut scene.alloc).unwrap(), 2);
        let kept = if first == "old" { "new" } else { "old" };
        assert_eq!(scene.cached(), [kept], "{policy}");
    }
}

/// Page size 1. `p` = [1] with two children: `x` = [1, 2] (two hits) and `y` = [1, 3] (one
/// hit); beside them `q` = [5] (two hits, used after `x`). Inserting `y` splits the node of
/// `x`, whose upper part `p` has no hits of its own.
fn lfu_family() -> Scene {
    let mut scene = Scene::new(EvictionPolicy::Lfu);
    let x = scene.insert("x", &[1, 2], params(0, false));
    scene.insert("y", &[1, 3], params(0, false));
    scene.names.push(("p", x[0]));
    scene.insert("x again", &[1, 2], params(0, false));
    scene.insert("q", &[5], params(0, false));
    scene.insert("q again", &[5], params(0, false));
    scene
}

#[test]
fn a_parent_left_childless_competes_with_the_hits_of_its_evicted_children() {
    // Node by node: y (1 hit), x (2, used before q), then p has 0 + 1 + 2 = 3 hits against
    // q's 2: q goes before p. Without the inherited hits p (0) would go third.
    let mut scene = lfu_family();
    assert_eq!(scene.eviction_order(), ["y", "x", "q", "p"]);
    // In one call the plan ranks p by what it will inherit: three tokens leave p.
    let mut scene = lfu_family();
    assert_eq!(scene.tree.evict(3, &mut scene.alloc).unwrap(), 3);
    check_radix(&scene.tree).unwrap();
    assert_eq!(scene.cached(), ["p"]);
}

#[test]
fn a_parent_left_childless_competes_at_the_priority_of_its_evicted_children() {
    // p = [1] (priority 0), its child x = [1, 2] (priority 5); r = [7] (priority 5) used after
    // x; then a match of [1] alone makes p the newest. x goes first, then p, at priority 5 and
    // p's newer time, after r. Without x's priority p (0) would go before r.
    let family = || {
        let mut scene = Scene::new(EvictionPolicy::Priority);
        scene.insert("p", &[1], params(0, false));
        scene.insert("x", &[1, 2], params(5, false));
        scene.insert("r", &[7], params(5, false));
        assert_eq!(scene.tree.match_prefix(&[1]).len, 1);
        scene
    };
    assert_eq!(family().eviction_order(), ["x", "r", "p"]);
    let mut scene = family();
    assert_eq!(scene.tree.evict(2, &mut scene.alloc).unwrap(), 2);
    assert_eq!(scene.cached(), ["p"]);
}

#[test]
fn a_parent_left_childless_competes_at_the_newest_access_of_its_evicted_children() {
    // p = [1] cached first; r = [7] second; x = [1, 2] last (an insert stamps only where it
    // ends, so p keeps its own older time). Under MRU x goes first and p, inheriting x's time,
    // is then the newest: it goes before r. With its own time p would go last.
    let family = || {
        let mut scene = Scene::new(EvictionPolicy::Mru);
        scene.insert("p", &[1], params(0, false));
        scene.insert("r", &[7], params(0, false));
        scene.insert("x", &[1, 2], params(0, false));
        scene
    };
    assert_eq!(family().eviction_order(), ["x", "p", "r"]);
    let mut scene = family();
    assert_eq!(scene.tree.evict(2, &mut scene.alloc).unwrap(), 2);
    assert_eq!(scene.cached(), ["r"]);
}

#[test]
fn a_split_makes_a_new_upper_part_at_the_priority_of_the_node_it_cuts() {
    // `long` = [1, 2, 3] (priority 4) is cut by a match of [1, 2] into [1, 2] and [3]. `mid`,
    // cached after `long` but before the match, sits beside it.
    for (policy, order) in [
        // The upper part [1, 2] is a new node (sglang `_split_node`), created by the match,
        // after `mid`: after [3] goes, `mid` goes before it.
        (EvictionPolicy::Fifo, ["long", "mid", "upper"]),
        // It has `long`'s priority 4, above `mid`'s 1, though the match made it newest.
        (EvictionPolicy::Priority, ["mid", "long", "upper"]),
    ] {
        let mut scene = Scene::new(policy);
        let long = scene.insert("long", &[1, 2, 3], params(4, false));
        scene.names.push(("upper", long[0]));
        scene.insert("mid", &[9], params(1, false));
        assert_eq!(scene.tree.match_prefix(&[1, 2]).len, 2);
        check_radix(&scene.tree).unwrap();
        assert_eq!(scene.eviction_order(), order, "{policy}");
    }
}

/// A cache of page size 4 with `policy`, rows for four requests.
fn kv_cache(policy: EvictionPolicy) -> KvCache<PagedAllocator> {
    let allocator = PagedAllocator::new(256, 4, false).unwrap();
    let tree = TreeCache::Radix(RadixCache::new(RadixConfig::new(4).with_policy(policy)).unwrap());
    KvCache::new(allocator, ReqToTokenPool::new(4, 64).unwrap(), tree).unwrap()
}

/// Extends, registers (as a running request would) and finishes `req`, inserting its prefix.
fn run_to_finish(cache: &mut KvCache<PagedAllocator>, mut req: Req) {
    init_next_round_input(&mut req, cache, usize::MAX).unwrap();
    let batch = alloc_for_extend(prepare_for_extend(ScheduleBatch::new(vec![req])), cache)
        .map_err(|failure| failure.error)
        .unwrap();
    let mut reqs = batch.into_reqs();
    cache_unfinished_req(&mut reqs[0], cache).unwrap();
    release_kv_cache(&mut reqs[0], cache, true).unwrap();
    cache.check(&[]).unwrap();
}

/// How much of `prompt` is still cached (a match stamps; use it last).
fn cached_len(cache: &mut KvCache<PagedAllocator>, prompt: &[u32]) -> usize {
    // One token more: a match leaves at least one token to compute.
    let mut req = Req::new(99, [prompt, &[0]].concat());
    init_next_round_input(&mut req, cache, usize::MAX).unwrap();
    let matched = req.kv().cache_protected_len();
    let batch = alloc_for_extend(prepare_for_extend(ScheduleBatch::new(vec![req])), cache)
        .map_err(|failure| failure.error)
        .unwrap();
    release_kv_cache(&mut batch.into_reqs()[0], cache, false).unwrap();
    matched
}

#[test]
fn the_batch_flow_records_the_request_priority_and_a_hit_per_finished_request() {
    // `kept`'s prompt finished twice (two hits) at priority 2, long ago; `newer`'s once, at
    // priority 0, after. Its registrations while running are no hits, so under LFU `newer`
    // has one hit, not two: it goes first, as under Priority. LRU takes `kept`'s end (the
    // second request's match split it at its first page).
    let kept: Vec<u32> = (100..108).collect();
    let newer: Vec<u32> = (200..208).collect();
    for (policy, evicted) in [
        (EvictionPolicy::Lfu, &newer),
        (EvictionPolicy::Priority, &newer),
        (EvictionPolicy::Lru, &kept),
    ] {
        let mut cache = kv_cache(policy);
        run_to_finish(&mut cache, Req::new(1, kept.clone()).with_priority(2));
        run_to_finish(&mut cache, Req::new(2, kept.clone()).with_priority(2));
        run_to_finish(&mut cache, Req::new(3, newer.clone()));
        assert_eq!(cache.tree().evictable_size(), 16);
        assert!(cache.evict_shortfall(cache.available_size() + 4).unwrap() >= 4);
        cache.check(&[]).unwrap();
        assert!(cached_len(&mut cache, evicted) < 8, "{policy}");
        let survivor = if evicted == &kept { &newer } else { &kept };
        assert_eq!(cached_len(&mut cache, survivor), 8, "{policy}");
    }
}

/// An insert that splits a node stamps its lower half, as sglang's `_insert_helper` does (it
/// stamps the node it walks into, and the lower half keeps that node): at page size 1, insert
/// [1, 2], then [3], then [1, 3] (splitting [1, 2]); the least recently used leaf is then [3],
/// not [2], under `lru` as in sglang.
#[test]
fn an_insert_that_splits_a_node_stamps_its_lower_half() {
    let mut allocator = PagedAllocator::new(16, 1, false).unwrap();
    let mut slots = Vec::new();
    allocator.alloc(5, &mut slots).unwrap();
    assert_eq!(slots, [1, 2, 3, 4, 5]);
    let mut tree = RadixCache::new(RadixConfig::new(1).with_policy(EvictionPolicy::Lru)).unwrap();
    tree.insert(Insert::new(&[1, 2], &slots[0..2])).unwrap();
    tree.insert(Insert::new(&[3], &slots[2..3])).unwrap();
    let outcome = tree.insert(Insert::new(&[1, 3], &slots[3..5])).unwrap();
    assert_eq!(
        outcome.prefix_len, 1,
        "[1] was cached: slot 4 is the caller's duplicate"
    );
    allocator.free(&slots[3..4]).unwrap();
    tree.evict(1, &mut allocator).unwrap();
    let freed: Vec<KvSlot> = allocator.free_pages().take(2).collect();
    assert_eq!(
        freed[0], 3,
        "the oldest leaf is [3]; [2] was stamped by the split"
    );
    assert!(tree.match_prefix(&[1, 2]).len == 2, "[2] stays cached");
}
