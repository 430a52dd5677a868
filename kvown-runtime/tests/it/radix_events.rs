//! Cache events: the page hash against values computed by hand, each place pages enter or
//! leave the tree, namespaces, restarting the stream, and a request's whole life through the
//! batch flow, every stream replayed as a router would.

use crate::common::cache_events;
use crate::common::radix_setup;

use cache_events::{Replay, reference_hash};
use kvown_runtime::alloc::{KvAllocator, PageId, PagedAllocator};
use kvown_runtime::batch::Req;
use kvown_runtime::batch::{
    ScheduleBatch, alloc_for_decode, alloc_for_extend, prepare_for_decode, prepare_for_extend,
    release_kv_cache,
};
use kvown_runtime::batch::{cache_unfinished_req, init_next_round_input};
use kvown_runtime::cache::{KvCache, TreeCache};
use kvown_runtime::check::check_radix;
use kvown_runtime::radix::{
    CacheEvent, Insert, Namespace, PageHash, RadixCache, RadixConfig, StoredPage, TreePos,
};
use kvown_runtime::slots::ReqToTokenPool;
use radix_setup::{alloc_slots, allocator, key, path_slots};

/// A cache with events on and its stream's opening `Cleared` taken.
fn cache_with_events(page_size: usize) -> RadixCache {
    let mut cache = RadixCache::new(RadixConfig::new(page_size)).unwrap();
    cache.enable_events();
    assert_eq!(cache.take_events(), [CacheEvent::Cleared]);
    cache
}

/// The pages of a `Stored` event: (hash, page id, tokens).
fn stored(event: &CacheEvent) -> Vec<(PageHash, PageId, Vec<u32>)> {
    let CacheEvent::Stored { pages, tokens, .. } = event else {
        panic!("not a store: {event:?}");
    };
    pages
        .iter()
        .map(|page| (page.hash, page.page, tokens[page.tokens.clone()].to_vec()))
        .collect()
}

#[test]
fn page_hashes_equal_values_computed_by_hand() {
    // FNV-1a 64 of the little-endian bytes of [namespace, tokens...], computed outside Rust.
    let seed = PageHash::seed(Namespace::DEFAULT);
    assert_eq!(seed, PageHash(0x4d25_767f_9dce_13f5));
    assert_eq!(
        PageHash::seed(Namespace(7)),
        PageHash(0x6d35_7266_9b2c_de42)
    );
    let first = seed.chain(&[1, 2]);
    assert_eq!(first, PageHash(0x7562_41e1_be8c_9396));
    assert_eq!(first.chain(&[3, 4]), PageHash(0xeb29_754b_740c_25f1));
    let in_seven: Vec<PageHash> = PageHash::of_pages(Namespace(7), &[1, 2, 3, 4, 5], 2).collect();
    assert_eq!(
        in_seven,
        [
            PageHash(0x53a2_94f1_6b29_8b81),
            PageHash(0x4b5c_4d08_7de3_8206)
        ]
    );
    // A page's hash is its whole prefix's: the same at the same end for any page size.
    assert_eq!(seed.chain(&[1, 2, 3, 4]), first.chain(&[3, 4]));
    assert_eq!(reference_hash(Namespace(7), &[1, 2, 3, 4]), in_seven[1]);
    assert_eq!(format!("{}", PageHash(0xab)), "00000000000000ab");
}

#[test]
fn events_are_off_by_default_and_cost_nothing_then() {
    let ps = 4;
    let mut alloc = allocator(ps, 16);
    let mut cache = RadixCache::new(RadixConfig::new(ps)).unwrap();
    assert!(!cache.config().events);
    let bytes = cache.bookkeeping_bytes();
    let slots = alloc_slots(&mut alloc, 8);
    cache.insert(Insert::new(&key(ps, 2, 0), &slots)).unwrap();
    cache.evict(8, &mut alloc).unwrap();
    assert_eq!(cache.take_events(), []);
    assert!(cache.bookkeeping_bytes() >= bytes);
}

#[test]
fn a_new_leaf_stores_its_pages_chained_from_the_root_and_from_its_parent() {
    let ps = 4;
    let mut alloc = allocator(ps, 16);
    let mut cache = cache_with_events(ps);
    let prompt = key(ps, 2, 0);
    let slots = alloc_slots(&mut alloc, 8);
    cache.insert(Insert::new(&prompt, &slots)).unwrap();
    let events = cache.take_events();
    let hashes: Vec<PageHash> = PageHash::of_pages(Namespace::DEFAULT, &prompt, ps).collect();
    assert_eq!(
        events,
        [CacheEvent::Stored {
            namespace: Namespace::DEFAULT,
            parent_hash: None,
            pages: vec![
                StoredPage {
                    hash: hashes[0],
                    page: slots[0] / 4,
                    tokens: 0..4,
                },
                StoredPage {
                    hash: hashes[1],
                    page: slots[4] / 4,
                    tokens: 4..8,
                },
            ],
            tokens: prompt.clone(),
        }]
    );
    // Sharing the first page, diverging in the second: the node splits (no event) and the
    // new leaf's one page hangs below the first page.
    let mut other = prompt[..4].to_vec();
    other.extend([90, 91, 92, 93]);
    let mut other_slots = slots[..4].to_vec();
    other_slots.extend(alloc_slots(&mut alloc, 4));
    let outcome = cache.insert(Insert::new(&other, &other_slots)).unwrap();
    assert_eq!(outcome.prefix_len, 4);
    let events = cache.take_events();
    assert_eq!(events.len(), 1);
    let CacheEvent::Stored { parent_hash, .. } = &events[0] else {
        panic!("a store");
    };
    assert_eq!(*parent_hash, Some(hashes[0]));
    assert_eq!(
        stored(&events[0]),
        [(
            reference_hash(Namespace::DEFAULT, &other),
            other_slots[4] / 4,
            vec![90, 91, 92, 93]
        )]
    );
    check_radix(&cache).unwrap();
}

#[test]
fn a_split_by_a_match_and_a_cached_insert_queue_nothing() {
    let ps = 2;
    let mut alloc = allocator(ps, 16);
    let mut cache = cache_with_events(ps);
    let prompt = key(ps, 3, 0);
    let slots = alloc_slots(&mut alloc, 6);
    cache.insert(Insert::new(&prompt, &slots)).unwrap();
    cache.take_events();
    // The match ends inside the node: it splits, and the pages stay where they were.
    let at = cache.match_prefix(&prompt[..2]);
    assert_eq!(path_slots(&cache, at), slots[..2]);
    cache
        .insert(Insert::new(&prompt[..4], &slots[..4]))
        .unwrap();
    assert_eq!(cache.take_events(), []);
    check_radix(&cache).unwrap();
}

#[test]
fn extending_an_own_leaf_in_place_stores_only_the_new_pages() {
    let ps = 4;
    let mut alloc = allocator(ps, 16);
    let mut cache = cache_with_events(ps);
    let mut prompt = key(ps, 1, 0);
    let mut slots = alloc_slots(&mut alloc, 4);
    let outcome = cache.insert(Insert::new(&prompt, &slots)).unwrap();
    cache.inc_lock_ref(outcome.last_node).unwrap();
    cache.take_events();
    prompt.extend(key(ps, 2, 100));
    slots.extend(alloc_slots(&mut alloc, 8));
    let at = TreePos {
        node: outcome.last_node,
        len: 4,
    };
    let extended = cache.insert(Insert::new(&prompt, &slots).from(at)).unwrap();
    assert_eq!(extended.last_node, outcome.last_node, "extended in place");
    let events = cache.take_events();
    assert_eq!(events.len(), 1);
    let CacheEvent::Stored { parent_hash, .. } = &events[0] else {
        panic!("a store");
    };
    assert_eq!(
        *parent_hash,
        Some(reference_hash(Namespace::DEFAULT, &prompt[..4]))
    );
    let expected: Vec<(PageHash, PageId, Vec<u32>)> = [4, 8]
        .map(|end| {
            let hash = reference_hash(Namespace::DEFAULT, &prompt[..end + 4]);
            (hash, slots[end] / 4, prompt[end..end + 4].to_vec())
        })
        .into();
    assert_eq!(stored(&events[0]), expected);
    check_radix(&cache).unwrap();
}

#[test]
fn an_eviction_removes_descendants_before_ancestors_in_one_event() {
    let ps = 1;
    let mut alloc = allocator(ps, 16);
    let mut cache = cache_with_events(ps);
    let mut replay = Replay::default();
    // [0 1] then two leaves below it: [0 1 2 3] and [0 1 5].
    let slots = alloc_slots(&mut alloc, 4);
    cache.insert(Insert::new(&[0, 1, 2, 3], &slots)).unwrap();
    let mut branch = slots[..2].to_vec();
    branch.extend(alloc_slots(&mut alloc, 1));
    cache.insert(Insert::new(&[0, 1, 5], &branch)).unwrap();
    replay.apply(cache.take_events());
    assert_eq!(replay.pages.len(), 5);
    cache.evict(usize::MAX, &mut alloc).unwrap();
    let events = cache.take_events();
    let [CacheEvent::Removed { hashes }] = &events[..] else {
        panic!("one removal: {events:?}");
    };
    let hash = |prefix: &[u32]| reference_hash(Namespace::DEFAULT, prefix);
    // Least recently used leaf first, each leaf deepest page first, the parent last.
    assert_eq!(
        *hashes,
        [
            hash(&[0, 1, 2, 3]),
            hash(&[0, 1, 2]),
            hash(&[0, 1, 5]),
            hash(&[0, 1]),
            hash(&[0]),
        ]
    );
    replay.apply(events);
    assert!(replay.pages.is_empty());
    // Two evictions in a row (nothing in between) are still one event each time they are
    // taken apart; back to back they merge.
    let slots = alloc_slots(&mut alloc, 2);
    cache.insert(Insert::new(&[7], &slots[..1])).unwrap();
    cache.insert(Insert::new(&[8], &slots[1..])).unwrap();
    cache.take_events();
    cache.evict(1, &mut alloc).unwrap();
    cache.evict(1, &mut alloc).unwrap();
    let events = cache.take_events();
    assert_eq!(events.len(), 1, "{events:?}");
    check_radix(&cache).unwrap();
}

/// A leaf grown in place is evicted registration by registration: each eviction removes only
/// the newest registration's pages, and a router replaying the stream holds what the tree holds.
#[test]
fn a_grown_leaf_is_removed_one_registration_at_a_time() {
    let ps = 4;
    let mut alloc = allocator(ps, 16);
    let mut cache = cache_with_events(ps);
    let mut replay = Replay::default();
    let mut prompt = key(ps, 1, 0);
    let mut slots = alloc_slots(&mut alloc, 4);
    let first = cache.insert(Insert::new(&prompt, &slots)).unwrap();
    cache.inc_lock_ref(first.last_node).unwrap();
    for registration in 1..3u32 {
        let at = TreePos {
            node: first.last_node,
            len: prompt.len(),
        };
        prompt.extend(key(ps, 1, 100 * registration));
        slots.extend(alloc_slots(&mut alloc, 4));
        let outcome = cache.insert(Insert::new(&prompt, &slots).from(at)).unwrap();
        assert_eq!(outcome.last_node, first.last_node, "grown in place");
    }
    cache.dec_lock_ref(first.last_node).unwrap();
    replay.apply(cache.take_events());
    assert_eq!(replay.pages.len(), 3);
    let hash = |end: usize| reference_hash(Namespace::DEFAULT, &prompt[..end]);
    for (removed, left) in [(12, 2), (8, 1), (4, 0)] {
        assert_eq!(cache.evict(1, &mut alloc).unwrap(), ps);
        let events = cache.take_events();
        assert_eq!(
            events,
            [CacheEvent::Removed {
                hashes: vec![hash(removed)]
            }]
        );
        replay.apply(events);
        assert_eq!(replay.pages.len(), left);
        check_radix(&cache).unwrap();
    }
}

#[test]
fn a_refused_eviction_queues_nothing() {
    let ps = 4;
    let mut alloc = allocator(ps, 16);
    let mut cache = cache_with_events(ps);
    let slots = alloc_slots(&mut alloc, 8);
    cache.insert(Insert::new(&key(ps, 2, 0), &slots)).unwrap();
    cache.take_events();
    // An allocator that does not hold the pages refuses their free.
    let mut other = allocator(ps, 16);
    assert!(cache.evict(8, &mut other).is_err());
    assert_eq!(cache.take_events(), []);
}

#[test]
fn the_same_tokens_in_two_namespaces_hash_apart() {
    let ps = 2;
    let mut alloc = allocator(ps, 16);
    let mut cache = cache_with_events(ps);
    let prompt = key(ps, 2, 0);
    let mut replay = Replay::default();
    for namespace in [Namespace(1), Namespace(2)] {
        let slots = alloc_slots(&mut alloc, 4);
        cache
            .insert(Insert::new(namespace.key(&prompt), &slots))
            .unwrap();
    }
    let events = cache.take_events();
    let [first, second] = &events[..] else {
        panic!("two stores: {events:?}");
    };
    let hashes = |event| stored(event).into_iter().map(|(hash, ..)| hash);
    assert!(hashes(first).all(|hash| !hashes(second).any(|other| other == hash)));
    replay.apply(events);
    assert_eq!(replay.pages.len(), 4);
}

#[test]
fn enabling_on_a_filled_cache_clears_then_stores_every_page_parents_first() {
    let ps = 2;
    let mut alloc = allocator(ps, 32);
    let mut cache = RadixCache::new(RadixConfig::new(ps)).unwrap();
    let slots = alloc_slots(&mut alloc, 6);
    cache
        .insert(Insert::new(&[1, 1, 2, 2, 3, 3], &slots))
        .unwrap();
    let mut branch = slots[..2].to_vec();
    branch.extend(alloc_slots(&mut alloc, 2));
    cache.insert(Insert::new(&[1, 1, 9, 9], &branch)).unwrap();
    let adapter = alloc_slots(&mut alloc, 2);
    cache
        .insert(Insert::new(Namespace(3).key(&[1, 1]), &adapter))
        .unwrap();
    cache.enable_events();
    let events = cache.take_events();
    assert_eq!(events[0], CacheEvent::Cleared);
    // Three nodes of the default namespace (after the split) and one of namespace 3.
    assert_eq!(events.len(), 5, "{events:?}");
    let mut replay = Replay::default();
    replay.apply(events);
    let expected = [
        (Namespace::DEFAULT, vec![1, 1], slots[0] / 2),
        (Namespace::DEFAULT, vec![1, 1, 2, 2], slots[2] / 2),
        (Namespace::DEFAULT, vec![1, 1, 2, 2, 3, 3], slots[4] / 2),
        (Namespace::DEFAULT, vec![1, 1, 9, 9], branch[2] / 2),
        (Namespace(3), vec![1, 1], adapter[0] / 2),
    ];
    assert_eq!(
        replay.by_prefix(),
        expected
            .into_iter()
            .map(|(namespace, prefix, page)| ((namespace, prefix), page))
            .collect()
    );
    // Restarting drops what was not taken and starts over with the same snapshot.
    cache.evict(2, &mut alloc).unwrap();
    cache.enable_events();
    let events = cache.take_events();
    assert_eq!(events[0], CacheEvent::Cleared);
    let mut restarted = Replay::default();
    restarted.apply(events);
    assert_eq!(restarted.pages.len(), cache.sizes().total() / ps);
    check_radix(&cache).unwrap();
}

#[test]
fn bookkeeping_counts_the_hashes_and_the_queued_events() {
    let ps = 4;
    let mut alloc = allocator(ps, 64);
    let mut cache = RadixCache::new(RadixConfig::new(ps)).unwrap();
    let off = cache.bookkeeping_bytes();
    cache.enable_events();
    let on = cache.bookkeeping_bytes();
    assert!(on > off, "the log and its first event: {on} > {off}");
    let slots = alloc_slots(&mut alloc, 64);
    cache.insert(Insert::new(&key(ps, 16, 0), &slots)).unwrap();
    let queued = cache.bookkeeping_bytes();
    // At least the 16 queued pages' tokens and records, and a hash per page id up to the last.
    let floor = 16 * (ps * 4 + size_of::<StoredPage>()) + 16 * size_of::<PageHash>();
    assert!(queued >= on + floor, "{queued} >= {on} + {floor}");
    cache.take_events();
    assert!(cache.bookkeeping_bytes() + 16 * ps * 4 <= queued);
}

/// A radix `KvCache` with events on.
fn kv_cache_with_events(page_size: usize) -> KvCache<PagedAllocator> {
    let allocator = PagedAllocator::new(256, page_size, false).unwrap();
    let tree = TreeCache::Radix(RadixCache::new(RadixConfig::new(page_size)).unwrap());
    let mut cache = KvCache::new(allocator, ReqToTokenPool::new(4, 256).unwrap(), tree).unwrap();
    assert!(cache.enable_cache_events());
    cache
}

/// The cached pages a replay must show after `req` cached its whole pages of `tokens`: the page
/// of each prefix ending at a page boundary.
fn pages_of_prefixes(
    cache: &KvCache<PagedAllocator>,
    row: &[u32],
    tokens: &[u32],
) -> Vec<((Namespace, Vec<u32>), PageId)> {
    let ps = cache.page_size();
    (ps..=tokens.len())
        .step_by(ps)
        .map(|end| {
            let page = row[end - ps] / ps as u32;
            ((Namespace(5), tokens[..end].to_vec()), page)
        })
        .collect()
}

#[test]
fn a_request_life_through_the_batch_flow_yields_a_consistent_stream() {
    for ps in [1, 4] {
        let mut cache = kv_cache_with_events(ps);
        let mut replay = Replay::default();
        replay.apply(cache.take_cache_events());
        assert!(replay.pages.is_empty());
        let prompt: Vec<u32> = (0..10).collect();
        let mut req = Req::new_in(Namespace(5), 1, prompt);
        init_next_round_input(&mut req, &mut cache, usize::MAX).unwrap();
        let prepared = prepare_for_extend(ScheduleBatch::new(vec![req]));
        let mut batch = alloc_for_extend(prepared, &mut cache)
            .map_err(|failure| failure.error)
            .unwrap();
        // Decode, registering each page as it fills (the fast path of the own leaf after the
        // first registration).
        for step in 0..12 {
            batch.reqs_mut()[0].push_output(100 + step);
            let prepared = prepare_for_decode(batch, &cache)
                .map_err(|(_, error)| error)
                .unwrap();
            batch = alloc_for_decode(prepared, &mut cache)
                .map_err(|failure| failure.error)
                .unwrap();
            cache_unfinished_req(&mut batch.reqs_mut()[0], &mut cache).unwrap();
            cache.check(batch.reqs()).unwrap();
            replay.apply(cache.take_cache_events());
            let req = &batch.reqs()[0];
            let row = cache
                .req_to_token()
                .row(req.kv().req_pool_idx().unwrap())
                .unwrap();
            let protected = req.kv().cache_protected_len();
            let expected = pages_of_prefixes(&cache, row, &req.fill_ids()[..protected]);
            assert_eq!(replay.by_prefix(), expected.into_iter().collect());
        }
        let mut reqs = batch.into_reqs();
        let tokens = reqs[0].fill_ids().to_vec();
        let committed = reqs[0].kv().kv_committed_len().min(tokens.len());
        let row = cache
            .req_to_token()
            .row(reqs[0].kv().req_pool_idx().unwrap())
            .unwrap()
            .to_vec();
        release_kv_cache(&mut reqs[0], &mut cache, true).unwrap();
        cache.check(&reqs).unwrap();
        replay.apply(cache.take_cache_events());
        let cached_len = committed / ps * ps;
        let expected = pages_of_prefixes(&cache, &row, &tokens[..cached_len]);
        assert_eq!(
            replay.by_prefix(),
            expected.into_iter().collect(),
            "ps {ps}"
        );
        // Evicting everything leaves a replay with nothing.
        let capacity = cache.allocator().capacity();
        assert!(cache.evict_shortfall(capacity).unwrap() > 0);
        replay.apply(cache.take_cache_events());
        assert!(replay.pages.is_empty(), "ps {ps}");
        assert_eq!(cache.take_cache_events(), []);
    }
}

#[test]
fn a_cache_without_a_radix_tree_has_no_events() {
    let allocator = PagedAllocator::new(64, 4, false).unwrap();
    let rows = ReqToTokenPool::new(2, 64).unwrap();
    let mut cache = KvCache::new(allocator, rows, TreeCache::Disabled).unwrap();
    assert!(!cache.enable_cache_events());
    assert_eq!(cache.take_cache_events(), []);
}
