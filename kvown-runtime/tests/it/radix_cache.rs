//! Radix prefix cache behaviour (sglang `mem_cache/radix_cache.py`, `RadixCache`) against the real
//! allocators.

use crate::common::radix_setup;

use kvown_runtime::alloc::{KvAllocator, KvSlot, PagedAllocator, SlotCalls};
use kvown_runtime::check::check_radix;
use kvown_runtime::error::PageSizeMismatch;
use kvown_runtime::radix::{
    EvictionPolicy, Insert, NodeId, RadixCache, RadixConfig, RadixError, TreePos,
};
use radix_setup::{alloc_slots, allocator, key, path_slots};

const PAGE_SIZES: [usize; 4] = [1, 3, 4, 16];

/// Matches `key` and returns the slots of the matched prefix.
fn matched_slots(cache: &mut RadixCache, key: &[u32]) -> Vec<KvSlot> {
    let at = cache.match_prefix(key);
    path_slots(cache, at)
}

/// Inserts `key` with freshly allocated slots, frees the duplicates, returns the slots.
fn insert_fresh(cache: &mut RadixCache, alloc: &mut PagedAllocator, key: &[u32]) -> Vec<KvSlot> {
    let slots = alloc_slots(alloc, key.len());
    let outcome = cache.insert(Insert::new(key, &slots)).unwrap();
    alloc.free_segment(&slots[..outcome.prefix_len], 0).unwrap();
    check_radix(cache).unwrap();
    slots
}

/// A fresh leaf of `pages` pages (tokens from `base`, fresh slots) locked once, as a request
/// holds its own leaf: its key, its slots, and its end.
fn locked_leaf(
    cache: &mut RadixCache,
    alloc: &mut PagedAllocator,
    pages: usize,
    base: u32,
) -> (Vec<u32>, Vec<KvSlot>, TreePos) {
    let ps = cache.config().page_size;
    let k = key(ps, pages, base);
    let row = alloc_slots(alloc, pages * ps);
    let node = cache.insert(Insert::new(&k, &row)).unwrap().last_node;
    cache.inc_lock_ref(node).unwrap();
    let end = TreePos { node, len: k.len() };
    (k, row, end)
}

#[test]
fn match_page_aligns_and_splits() {
    for ps in PAGE_SIZES {
        let mut alloc = allocator(ps, 32);
        let mut cache = RadixCache::new(RadixConfig::new(ps)).unwrap();
        let full = key(ps, 4, 100);
        let slots = insert_fresh(&mut cache, &mut alloc, &full);

        // A query sharing 2 pages and part of the third matches exactly 2 whole pages.
        let mut query = full[..2 * ps].to_vec();
        query.extend(std::iter::repeat_n(7, ps));
        let matched = cache.match_prefix(&query);
        assert_eq!(matched.len, 2 * ps, "ps {ps}");
        assert_eq!(path_slots(&cache, matched), slots[..2 * ps]);
        check_radix(&cache).unwrap();

        // The match split the node: locking its end protects exactly 2 pages.
        cache.inc_lock_ref(matched.node).unwrap();
        assert_eq!(cache.sizes().protected, 2 * ps);
        assert_eq!(cache.sizes().evictable, 2 * ps);
        cache.dec_lock_ref(matched.node).unwrap();

        // A tail shorter than a page never matches.
        let short = &full[..4 * ps - 1];
        assert_eq!(cache.match_prefix(short).len, 3 * ps);
        assert_eq!(cache.match_prefix(&full).len, 4 * ps);
        assert_eq!(cache.match_prefix(&[1; 3]), TreePos::ROOT);
        check_radix(&cache).unwrap();
    }
}

#[test]
fn locks_move_tokens_only_on_zero_one_transitions() {
    for ps in PAGE_SIZES {
        let mut alloc = allocator(ps, 32);
        let mut cache = RadixCache::new(RadixConfig::new(ps)).unwrap();
        let a = key(ps, 3, 0);
        let mut b = a[..ps].to_vec();
        b.extend(key(ps, 2, 1000));
        insert_fresh(&mut cache, &mut alloc, &a);
        insert_fresh(&mut cache, &mut alloc, &b);
        assert_eq!(
            (cache.sizes().evictable, cache.sizes().protected),
            (5 * ps, 0)
        );

        let node_a = cache.match_prefix(&a).node;
        let node_b = cache.match_prefix(&b).node;
        cache.inc_lock_ref(node_a).unwrap();
        assert_eq!(
            (cache.sizes().evictable, cache.sizes().protected),
            (2 * ps, 3 * ps)
        );
        cache.inc_lock_ref(node_a).unwrap();
        assert_eq!(
            (cache.sizes().evictable, cache.sizes().protected),
            (2 * ps, 3 * ps)
        );
        cache.inc_lock_ref(node_b).unwrap();
        assert_eq!(
            (cache.sizes().evictable, cache.sizes().protected),
            (0, 5 * ps)
        );
        cache.dec_lock_ref(node_a).unwrap();
        assert_eq!(
            (cache.sizes().evictable, cache.sizes().protected),
            (0, 5 * ps)
        );
        cache.dec_lock_ref(node_a).unwrap();
        assert_eq!(
            (cache.sizes().evictable, cache.sizes().protected),
            (2 * ps, 3 * ps)
        );
        cache.dec_lock_ref(node_b).unwrap();
        assert_eq!(
            (cache.sizes().evictable, cache.sizes().protected),
            (5 * ps, 0)
        );
        assert!(matches!(
            cache.dec_lock_ref(node_b),
            Err(RadixError::LockUnderflow { .. })
        ));
        assert_eq!(
            (cache.sizes().evictable, cache.sizes().protected),
            (5 * ps, 0)
        );
        // The root is locked forever; locking or unlocking it changes nothing.
        cache.inc_lock_ref(NodeId::ROOT).unwrap();
        cache.dec_lock_ref(NodeId::ROOT).unwrap();
        cache.dec_lock_ref(NodeId::ROOT).unwrap();
        assert_eq!(cache.sizes().total(), 5 * ps);
        check_radix(&cache).unwrap();
    }
}

#[test]
fn unlocking_a_node_locked_only_through_its_descendant_is_refused() {
    for ps in PAGE_SIZES {
        let mut alloc = allocator(ps, 32);
        let mut cache = RadixCache::new(RadixConfig::new(ps)).unwrap();
        let full = key(ps, 2, 0);
        insert_fresh(&mut cache, &mut alloc, &full);
        // Split: the upper node's count holds the leaf's lock, none of its own.
        let upper = cache.match_prefix(&full[..ps]).node;
        let leaf = cache.match_prefix(&full).node;
        cache.inc_lock_ref(leaf).unwrap();
        let before = format!("{cache:?}");
        assert_eq!(
            cache.dec_lock_ref(upper),
            Err(RadixError::LockUnderflow { node: upper })
        );
        assert_eq!(
            cache.move_lock(upper, leaf),
            Err(RadixError::LockUnderflow { node: upper })
        );
        assert_eq!(format!("{cache:?}"), before, "ps {ps}");
        // The leaf's own lock still goes, and with it every lock on the path.
        cache.dec_lock_ref(leaf).unwrap();
        assert_eq!(cache.sizes().evictable, full.len());
        check_radix(&cache).unwrap();
    }
}

#[test]
fn evict_is_lru_whole_node_and_spares_locked_nodes() {
    for ps in PAGE_SIZES {
        let mut alloc = allocator(ps, 32);
        let mut cache = RadixCache::new(RadixConfig::new(ps)).unwrap();
        let keys = [key(ps, 2, 0), key(ps, 3, 1000), key(ps, 1, 2000)];
        let slots: Vec<_> = keys
            .iter()
            .map(|k| insert_fresh(&mut cache, &mut alloc, k))
            .collect();
        // Touch key 0 so key 1 is least recently used; lock key 2.
        cache.match_prefix(&keys[0]);
        let locked = cache.match_prefix(&keys[2]).node;
        cache.inc_lock_ref(locked).unwrap();
        let available = alloc.available_size();

        // One token asked: the LRU node goes, whole.
        assert_eq!(cache.evict(1, &mut alloc).unwrap(), 3 * ps);
        assert_eq!(alloc.available_size(), available + 3 * ps);
        assert!(slots[1].iter().all(|&s| alloc.is_page_free(s / ps as u32)));
        assert_eq!(cache.match_prefix(&keys[1]).len, 0);
        assert_eq!(cache.match_prefix(&keys[0]).len, 2 * ps);
        check_radix(&cache).unwrap();

        // Asking for more than is evictable evicts what is there and spares the locked node.
        assert_eq!(cache.evict(100 * ps, &mut alloc).unwrap(), 2 * ps);
        assert_eq!(cache.evict(1, &mut alloc).unwrap(), 0);
        assert_eq!(cache.match_prefix(&keys[2]).len, ps);
        assert_eq!(matched_slots(&mut cache, &keys[2]), slots[2]);
        assert_eq!(cache.sizes().total(), cache.sizes().protected);
        check_radix(&cache).unwrap();
        alloc.check().unwrap();
    }
}

/// Inserts two keys that share their first two pages and differ in the third: a two-page
/// parent with two one-page leaves. Returns the shared key.
fn insert_parent_of_two_leaves(cache: &mut RadixCache, alloc: &mut PagedAllocator) -> Vec<u32> {
    let shared = key(cache.config().page_size, 2, 0);
    for tail in [500, 600] {
        let mut k = shared.clone();
        k.extend(key(cache.config().page_size, 1, tail));
        insert_fresh(cache, alloc, &k);
    }
    shared
}

#[test]
fn evicting_children_makes_the_parent_an_evictable_leaf() {
    for ps in PAGE_SIZES {
        let mut alloc = allocator(ps, 32);
        let mut cache = RadixCache::new(RadixConfig::new(ps)).unwrap();
        insert_parent_of_two_leaves(&mut cache, &mut alloc);
        assert_eq!(cache.sizes().total(), 4 * ps);
        // Two leaves of one page, then their parent, in a single call.
        assert_eq!(cache.evict(3 * ps, &mut alloc).unwrap(), 4 * ps);
        assert_eq!(cache.sizes().total(), 0);
        assert_eq!(alloc.available_size(), alloc.capacity());
        check_radix(&cache).unwrap();
    }
}

#[test]
fn a_parent_left_childless_competes_in_lru_order_within_the_same_eviction() {
    for ps in PAGE_SIZES {
        for parent_touched_last in [false, true] {
            let mut alloc = allocator(ps, 32);
            let mut cache = RadixCache::new(RadixConfig::new(ps)).unwrap();
            // Parent P (two pages) with one-page leaves A and B, then an unrelated two-page U.
            let shared = insert_parent_of_two_leaves(&mut cache, &mut alloc);
            let touch_parent = |cache: &mut RadixCache| cache.match_prefix(&shared);
            if !parent_touched_last {
                touch_parent(&mut cache);
            }
            let unrelated = key(ps, 2, 9000);
            insert_fresh(&mut cache, &mut alloc, &unrelated);
            if parent_touched_last {
                touch_parent(&mut cache);
            }

            // Four pages asked: A and B go first; then P, childless now, against U by access
            // time (P inherits its children's when newer).
            assert_eq!(cache.evict(4 * ps, &mut alloc).unwrap(), 4 * ps);
            let (kept, gone) = match parent_touched_last {
                false => (&unrelated, &shared),
                true => (&shared, &unrelated),
            };
            assert_eq!(cache.match_prefix(kept).len, 2 * ps, "page size {ps}");
            assert_eq!(cache.match_prefix(gone).len, 0, "page size {ps}");
            assert_eq!(cache.sizes().total(), 2 * ps);
            assert_eq!(alloc.available_size(), alloc.capacity() - 2 * ps);
            check_radix(&cache).unwrap();
        }
    }
}

#[test]
fn a_leaf_unlocked_again_without_an_access_is_evicted_once() {
    for ps in PAGE_SIZES {
        let mut alloc = allocator(ps, 32);
        let mut cache = RadixCache::new(RadixConfig::new(ps)).unwrap();
        insert_fresh(&mut cache, &mut alloc, &key(ps, 1, 0));
        let twice = insert_fresh(&mut cache, &mut alloc, &key(ps, 2, 100));
        let end = cache.match_prefix(&key(ps, 2, 100)).node;
        // Locked and unlocked with no match or insert between: listed again at the same
        // access time, so the LRU order holds the leaf twice.
        cache.inc_lock_ref(end).unwrap();
        cache.dec_lock_ref(end).unwrap();

        assert_eq!(cache.evict(100 * ps, &mut alloc).unwrap(), 3 * ps);
        assert_eq!(alloc.available_size(), alloc.capacity());
        assert!(twice.iter().all(|&s| alloc.is_page_free(s / ps as u32)));
        assert_eq!(cache.sizes().total(), 0);
        check_radix(&cache).unwrap();
        alloc.check().unwrap();
    }
}

// sglang's `evict_from_tree_cache` evicts what the allocator lacks: `evict(n - available)`.
#[test]
fn evicting_the_shortfall_evicts_only_what_is_missing() {
    let ps = 4;
    let mut alloc = allocator(ps, 8);
    let mut cache = RadixCache::new(RadixConfig::new(ps)).unwrap();
    insert_fresh(&mut cache, &mut alloc, &key(ps, 2, 0));
    insert_fresh(&mut cache, &mut alloc, &key(ps, 3, 100));
    insert_fresh(&mut cache, &mut alloc, &key(ps, 2, 200));
    assert_eq!(alloc.available_size(), ps);
    assert_eq!(
        cache
            .evict(ps.saturating_sub(alloc.available_size()), &mut alloc)
            .unwrap(),
        0
    );
    // Two pages short: the LRU node (2 pages) covers it, nothing more goes.
    assert_eq!(
        cache
            .evict((3 * ps).saturating_sub(alloc.available_size()), &mut alloc)
            .unwrap(),
        2 * ps
    );
    assert_eq!(cache.sizes().total(), 5 * ps);
    let mut wrong = allocator(1, 8);
    assert!(matches!(
        cache.evict(1, &mut wrong),
        Err(RadixError::PageSizeMismatch(_))
    ));
    check_radix(&cache).unwrap();
}

// An eviction refuses an allocator of another page size whatever it is asked for, nothing
// included: a shortfall of 0 (an allocator with room enough) is refused too.
#[test]
fn evict_refuses_an_allocator_of_another_page_size_even_with_room() {
    let ps = 4;
    let mut alloc = allocator(ps, 8);
    let mut cache = RadixCache::new(RadixConfig::new(ps)).unwrap();
    insert_fresh(&mut cache, &mut alloc, &key(ps, 2, 0));
    let mut wrong = allocator(2, 8);
    let mismatch = RadixError::PageSizeMismatch(PageSizeMismatch {
        cache: ps,
        allocator: 2,
    });
    assert_eq!(cache.evict(0, &mut wrong), Err(mismatch.clone()));
    for num_tokens in [0, 4, wrong.available_size(), wrong.available_size() + 1] {
        assert_eq!(
            cache.evict(
                num_tokens.saturating_sub(wrong.available_size()),
                &mut wrong
            ),
            Err(mismatch.clone()),
            "{num_tokens} tokens"
        );
    }
    assert_eq!(cache.sizes().total(), 2 * ps, "nothing evicted");
    assert_eq!(wrong.available_size(), wrong.capacity());
    check_radix(&cache).unwrap();
}

#[test]
fn insert_reports_prefix_and_duplicates_are_freed_once() {
    for ps in PAGE_SIZES {
        let mut alloc = allocator(ps, 32);
        let mut cache = RadixCache::new(RadixConfig::new(ps)).unwrap();
        let full = key(ps, 4, 0);
        let tree_slots = insert_fresh(&mut cache, &mut alloc, &full);

        // Request B matched 1 page (protected), then computed the rest itself while A's insert
        // landed: its pages for [protected, prefix_len) are duplicates, freed by B once.
        let protected = ps;
        let mut row = tree_slots[..protected].to_vec();
        row.extend(alloc_slots(&mut alloc, 4 * ps));
        let mut longer = full.clone();
        longer.extend(key(ps, 1, 900));
        let outcome = cache.insert(Insert::new(&longer, &row)).unwrap();
        assert_eq!(outcome.prefix_len, 4 * ps);
        alloc
            .free_segment(&row[protected..outcome.prefix_len], protected)
            .unwrap();
        // Freeing them again is refused: they were freed exactly once.
        assert!(
            alloc
                .free_segment(&row[protected..outcome.prefix_len], protected)
                .is_err()
        );

        // The re-match returns the tree's slots, and the new page is B's.
        let matched = cache.match_prefix(&longer);
        assert_eq!(matched.len, 5 * ps);
        let mut expected = tree_slots.clone();
        expected.extend_from_slice(&row[4 * ps..]);
        assert_eq!(path_slots(&cache, matched), expected);

        // Every allocated slot is cached now: free + cached == capacity.
        assert_eq!(
            alloc.available_size() + cache.sizes().total(),
            alloc.capacity()
        );
        let again = cache.insert(Insert::new(&longer, &expected)).unwrap();
        assert_eq!(again.prefix_len, 5 * ps);
        assert_eq!(again.last_node, matched.node);
        check_radix(&cache).unwrap();
        alloc.check().unwrap();
    }
}

#[test]
fn insert_from_extends_the_callers_leaf_in_place() {
    for ps in PAGE_SIZES {
        let mut alloc = allocator(ps, 32);
        let mut cache = RadixCache::new(RadixConfig::new(ps)).unwrap();
        let (mut k, mut row, mut pos) = locked_leaf(&mut cache, &mut alloc, 2, 0);
        let first = pos.node;
        for page in 0..3u32 {
            k.extend(key(ps, 1, 500 + page * 50));
            row.extend(alloc_slots(&mut alloc, ps));
            let outcome = cache.insert(Insert::new(&k, &row).from(pos)).unwrap();
            assert_eq!(outcome.prefix_len, pos.len);
            assert_eq!(outcome.last_node, first, "extended in place");
            pos.len = k.len();
            assert_eq!(cache.sizes().protected, k.len());
            check_radix(&cache).unwrap();
        }
        // A second locker: the next page becomes a child leaf and the lock moves down.
        cache.inc_lock_ref(pos.node).unwrap();
        k.extend(key(ps, 1, 800));
        row.extend(alloc_slots(&mut alloc, ps));
        let outcome = cache.insert(Insert::new(&k, &row).from(pos)).unwrap();
        assert_ne!(outcome.last_node, pos.node);
        assert_eq!(cache.sizes().evictable, ps);
        cache.move_lock(pos.node, outcome.last_node).unwrap();
        assert_eq!(cache.sizes().protected, k.len());
        assert_eq!(matched_slots(&mut cache, &k), row);
        cache.dec_lock_ref(outcome.last_node).unwrap();
        cache.dec_lock_ref(pos.node).unwrap();
        assert_eq!(cache.sizes().protected, 0);
        check_radix(&cache).unwrap();
    }
}

// A hint inside the caller's own leaf, not at its end, takes the general walk and still
// extends that leaf in place: its one lock (the caller's) covers the new pages.
#[test]
fn insert_from_inside_the_callers_leaf_extends_it_in_place() {
    for ps in PAGE_SIZES {
        let mut alloc = allocator(ps, 8);
        let mut cache = RadixCache::new(RadixConfig::new(ps)).unwrap();
        let (mut k, mut row, end) = locked_leaf(&mut cache, &mut alloc, 2, 0);
        let inside = TreePos {
            node: end.node,
            len: ps,
        };
        k.extend(key(ps, 1, 500));
        row.extend(alloc_slots(&mut alloc, ps));
        let outcome = cache.insert(Insert::new(&k, &row).from(inside)).unwrap();
        assert_eq!(outcome.prefix_len, 2 * ps);
        assert_eq!(outcome.last_node, end.node, "extended in place");
        assert_eq!(cache.sizes().protected, 3 * ps);
        assert_eq!(matched_slots(&mut cache, &k), row);
        check_radix(&cache).unwrap();
    }
}

// A leaf extended in place keeps spare capacity only while it is locked: once its last lock
// goes, the tree costs what the same key inserted in one call costs, plus where each earlier
// registration ends and what its node would carry for eviction (16 bytes each).
#[test]
fn a_grown_leaf_gives_its_spare_capacity_back_when_unlocked() {
    for ps in PAGE_SIZES {
        let mut alloc = allocator(ps, 32);
        let mut grown = RadixCache::new(RadixConfig::new(ps)).unwrap();
        let (mut k, mut row, TreePos { node, .. }) = locked_leaf(&mut grown, &mut alloc, 1, 0);
        for page in 0..4u32 {
            let at = TreePos { node, len: k.len() };
            k.extend(key(ps, 1, 100 + page * 50));
            row.extend(alloc_slots(&mut alloc, ps));
            assert_eq!(
                grown
                    .insert(Insert::new(&k, &row).from(at))
                    .unwrap()
                    .last_node,
                node
            );
        }
        let while_locked = grown.bookkeeping_bytes();
        grown.dec_lock_ref(node).unwrap();
        let mut at_once = RadixCache::new(RadixConfig::new(ps)).unwrap();
        at_once.insert(Insert::new(&k, &row)).unwrap();
        let registrations = 4 * 16;
        assert_eq!(
            grown.bookkeeping_bytes(),
            at_once.bookkeeping_bytes() + registrations,
            "page size {ps}"
        );
        assert!(while_locked > grown.bookkeeping_bytes(), "page size {ps}");
        check_radix(&grown).unwrap();
    }
}

// The in-place extension of the caller's own leaf checks the key and the new slots as the
// general path does: a bad call fails with the same error and changes nothing.
#[test]
fn extending_the_callers_leaf_refuses_bad_arguments_without_changing_anything() {
    let ps = 4;
    let mut alloc = allocator(ps, 32);
    let mut cache = RadixCache::new(RadixConfig::new(ps)).unwrap();
    let (k, row, pos) = locked_leaf(&mut cache, &mut alloc, 2, 0);
    let mut longer = k.clone();
    longer.extend(key(ps, 1, 100));
    let mut slots = row.clone();
    slots.extend(alloc_slots(&mut alloc, ps));
    let mut broken = slots.clone();
    broken.swap(2 * ps + 1, 2 * ps + 2);
    let shifted: Vec<KvSlot> = slots.iter().map(|&slot| slot + 1).collect();
    let refused = [
        cache.insert(Insert::new(&longer[..2 * ps + 1], &slots[..2 * ps + 1]).from(pos)),
        cache.insert(Insert::new(&longer, &slots[..2 * ps]).from(pos)),
        cache.insert(Insert::new(&longer, &broken).from(pos)),
        cache.insert(Insert::new(&longer, &shifted).from(pos)),
    ];
    assert!(matches!(refused[0], Err(RadixError::UnalignedKey { .. })));
    assert!(matches!(refused[1], Err(RadixError::LengthMismatch { .. })));
    assert!(matches!(
        refused[2],
        Err(RadixError::BrokenPage { position: 9, .. })
    ));
    assert!(matches!(
        refused[3],
        Err(RadixError::MisalignedPage { position: 8, .. })
    ));
    assert_eq!(cache.sizes().total(), k.len());
    assert_eq!(cache.sizes().protected, k.len());
    assert_eq!(cache.match_prefix(&longer).len, k.len());
    check_radix(&cache).unwrap();

    let outcome = cache
        .insert(Insert::new(&longer, &slots).from(pos))
        .unwrap();
    assert_eq!((outcome.prefix_len, outcome.last_node), (k.len(), pos.node));
    assert_eq!(matched_slots(&mut cache, &longer), slots);
    assert_eq!(cache.sizes().protected, longer.len());
    check_radix(&cache).unwrap();
}

#[test]
fn insert_from_a_stale_hint_splits_and_branches() {
    let ps = 4;
    let mut alloc = allocator(ps, 32);
    let mut cache = RadixCache::new(RadixConfig::new(ps)).unwrap();
    let base = key(ps, 2, 0);
    let base_slots = alloc_slots(&mut alloc, 2 * ps);
    let node = cache
        .insert(Insert::new(&base, &base_slots))
        .unwrap()
        .last_node;
    cache.inc_lock_ref(node).unwrap();
    cache.inc_lock_ref(node).unwrap();
    let hint = TreePos {
        node,
        len: base.len(),
    };
    // Requests A and B both stand at the end of `node`. While B's lock is briefly released,
    // A (sole locker) registers a page, which extends `node` in place.
    cache.dec_lock_ref(node).unwrap();
    let mut a = base.clone();
    a.extend(key(ps, 1, 100));
    let mut a_row = base_slots.clone();
    a_row.extend(alloc_slots(&mut alloc, ps));
    assert_eq!(
        cache
            .insert(Insert::new(&a, &a_row).from(hint))
            .unwrap()
            .last_node,
        node
    );
    // B locks `node` again; its position now lies inside `node`, and its page differs.
    cache.inc_lock_ref(node).unwrap();
    let mut b = base.clone();
    b.extend(key(ps, 1, 300));
    let mut b_row = base_slots.clone();
    b_row.extend(alloc_slots(&mut alloc, ps));
    let outcome = cache.insert(Insert::new(&b, &b_row).from(hint)).unwrap();
    assert_eq!(outcome.prefix_len, 2 * ps);
    cache.move_lock(node, outcome.last_node).unwrap();
    assert_eq!(matched_slots(&mut cache, &a), a_row);
    assert_eq!(matched_slots(&mut cache, &b), b_row);
    // The old position now lies in the node split off above `node`; reading from it still works.
    assert_eq!(path_slots(&cache, hint), base_slots);
    check_radix(&cache).unwrap();
}

#[test]
fn insert_refuses_bad_arguments_without_changing_anything() {
    let ps = 4;
    let mut alloc = allocator(ps, 32);
    let mut cache = RadixCache::new(RadixConfig::new(ps)).unwrap();
    let k = key(ps, 2, 0);
    let slots = alloc_slots(&mut alloc, 2 * ps);
    assert!(matches!(
        cache.insert(Insert::new(&k[..5], &slots[..5])),
        Err(RadixError::UnalignedKey { len: 5, .. })
    ));
    assert!(matches!(
        cache.insert(Insert::new(&k, &slots[..4])),
        Err(RadixError::LengthMismatch { .. })
    ));
    let mut broken = slots.clone();
    broken.swap(1, 2);
    assert!(matches!(
        cache.insert(Insert::new(&k, &broken)),
        Err(RadixError::BrokenPage { position: 1, .. })
    ));
    let shifted: Vec<_> = slots.iter().map(|s| s + 1).collect();
    assert!(matches!(
        cache.insert(Insert::new(&k, &shifted)),
        Err(RadixError::MisalignedPage { position: 0, .. })
    ));
    // The first bad page is named by its position, here in the key's second page.
    let mut second_broken = slots.clone();
    second_broken.swap(ps + 1, ps + 2);
    assert!(matches!(
        cache.insert(Insert::new(&k, &second_broken)),
        Err(RadixError::BrokenPage { position: 5, .. })
    ));
    let second_shifted = [&slots[..ps], &shifted[ps..]].concat();
    assert!(matches!(
        cache.insert(Insert::new(&k, &second_shifted)),
        Err(RadixError::MisalignedPage { position: 4, .. })
    ));
    let node = cache.insert(Insert::new(&k, &slots)).unwrap().last_node;
    let unlocked = TreePos { node, len: k.len() };
    assert!(matches!(
        cache.insert(Insert::new(&k, &slots).from(unlocked)),
        Err(RadixError::HintNotLocked { .. })
    ));
    cache.inc_lock_ref(node).unwrap();
    let beyond = TreePos {
        node,
        len: k.len() + ps,
    };
    assert!(matches!(
        cache.insert(Insert::new(&k, &slots).from(beyond)),
        Err(RadixError::HintOutOfRange { .. })
    ));
    // The caller's own leaf end (the fast path's case), past the end of a shorter key.
    let own_end = TreePos { node, len: k.len() };
    let short = k.len() - ps;
    assert!(matches!(
        cache.insert(Insert::new(&k[..short], &slots[..short]).from(own_end)),
        Err(RadixError::HintOutOfRange { .. })
    ));
    assert_eq!(cache.sizes().total(), k.len());
    cache.dec_lock_ref(node).unwrap();
    cache.evict(1, &mut alloc).unwrap();
    assert!(matches!(
        cache.inc_lock_ref(node),
        Err(RadixError::UnknownNode { .. })
    ));
    assert_eq!(cache.sizes().total(), 0);
    check_radix(&cache).unwrap();
}

#[test]
fn a_hint_past_its_node_is_reported_with_the_keys_length() {
    let ps = 4;
    let mut alloc = allocator(ps, 32);
    let mut cache = RadixCache::new(RadixConfig::new(ps)).unwrap();
    let k = key(ps, 3, 0);
    let slots = alloc_slots(&mut alloc, k.len());
    let node = cache
        .insert(Insert::new(&k[..ps], &slots[..ps]))
        .unwrap()
        .last_node;
    cache.inc_lock_ref(node).unwrap();
    // The hint lies within the key but past the end of its node.
    let past = TreePos { node, len: 2 * ps };
    assert_eq!(
        cache.insert(Insert::new(&k, &slots).from(past)),
        Err(RadixError::HintOutOfRange {
            node,
            len: 2 * ps,
            node_end: ps,
            key_len: k.len(),
            page_size: ps,
        })
    );
    check_radix(&cache).unwrap();
}

// The tree cannot know whether the caller allocated a page, but it refuses one it holds already
// (which a later eviction would free twice) and one named twice in the same insert.
#[test]
fn insert_refuses_a_page_already_cached_or_named_twice_without_changing_anything() {
    for ps in PAGE_SIZES {
        let mut alloc = allocator(ps, 32);
        let mut cache = RadixCache::new(RadixConfig::new(ps)).unwrap();
        let cached = insert_fresh(&mut cache, &mut alloc, &key(ps, 2, 0));
        let cached_page = cached[ps] / ps as u32;
        let other = key(ps, 2, 500);
        let fresh = alloc_slots(&mut alloc, ps);
        let fresh_page = fresh[0] / ps as u32;
        let before = format!("{cache:?}");
        // Through the general insert: a new leaf whose second page is the tree's.
        assert_eq!(
            cache.insert(Insert::new(&other, &[&fresh[..], &cached[ps..]].concat())),
            Err(RadixError::PageCached {
                position: ps,
                page: cached_page
            }),
            "page size {ps}"
        );
        assert_eq!(
            cache.insert(Insert::new(&other, &[&fresh[..], &fresh[..]].concat())),
            Err(RadixError::PageRepeated {
                first: 0,
                second: ps,
                page: fresh_page
            }),
            "page size {ps}"
        );
        assert_eq!(format!("{cache:?}"), before, "page size {ps}");
        // Through the caller's own leaf (extended in place), one page and two.
        let (own, own_row, end) = locked_leaf(&mut cache, &mut alloc, 1, 900);
        let after_leaf = format!("{cache:?}");
        let longer = [own.clone(), key(ps, 2, 1000)].concat();
        let one_more = &longer[..2 * ps];
        assert_eq!(
            cache.insert(Insert::new(one_more, &[&own_row[..], &cached[..ps]].concat()).from(end)),
            Err(RadixError::PageCached {
                position: ps,
                page: cached[0] / ps as u32
            }),
            "page size {ps}"
        );
        assert_eq!(
            cache.insert(Insert::new(&longer, &[&own_row[..], &fresh, &fresh].concat()).from(end)),
            Err(RadixError::PageRepeated {
                first: ps,
                second: 2 * ps,
                page: fresh_page
            }),
            "page size {ps}"
        );
        assert_eq!(format!("{cache:?}"), after_leaf, "page size {ps}");
        check_radix(&cache).unwrap();
        // Once evicted, a page may be cached again.
        cache.dec_lock_ref(end.node).unwrap();
        cache.evict(usize::MAX, &mut alloc).unwrap();
        assert_eq!(cache.sizes().total(), 0);
        let outcome = cache.insert(Insert::new(&other, &[&fresh[..], &cached[ps..]].concat()));
        assert_eq!(outcome.map(|outcome| outcome.prefix_len), Ok(0));
        check_radix(&cache).unwrap();
    }
}

// Pages out of order are looked at one by one; in order (as allocators hand them out) a repeat
// is impossible and one pass suffices.
#[test]
fn insert_finds_a_repeat_among_pages_out_of_order_and_takes_distinct_ones() {
    for ps in PAGE_SIZES {
        let mut alloc = allocator(ps, 32);
        let mut cache = RadixCache::new(RadixConfig::new(ps)).unwrap();
        let fresh = alloc_slots(&mut alloc, 4 * ps);
        let page = |i: usize| &fresh[i * ps..(i + 1) * ps];
        let k = key(ps, 4, 0);
        let repeated = [page(2), page(0), page(3), page(0)].concat();
        assert_eq!(
            cache.insert(Insert::new(&k, &repeated)),
            Err(RadixError::PageRepeated {
                first: ps,
                second: 3 * ps,
                page: fresh[0] / ps as u32
            }),
            "page size {ps}"
        );
        assert_eq!(cache.sizes().total(), 0);
        check_radix(&cache).unwrap();
        let shuffled = [page(2), page(0), page(3), page(1)].concat();
        cache.insert(Insert::new(&k, &shuffled)).unwrap();
        assert_eq!(matched_slots(&mut cache, &k), shuffled);
        check_radix(&cache).unwrap();
        assert_eq!(cache.evict(usize::MAX, &mut alloc), Ok(4 * ps));
        assert_eq!(alloc.available_size(), alloc.capacity());
    }
}

#[test]
fn a_parent_left_as_leaf_is_as_recent_as_its_newest_child() {
    let ps = 4;
    let mut alloc = allocator(ps, 32);
    let mut cache = RadixCache::new(RadixConfig::new(ps)).unwrap();
    let parent = key(ps, 1, 0);
    let other = key(ps, 1, 100);
    let mut child = parent.clone();
    child.extend(key(ps, 1, 200));
    insert_fresh(&mut cache, &mut alloc, &parent);
    let other_slots = alloc_slots(&mut alloc, ps);
    let other_node = cache
        .insert(Insert::new(&other, &other_slots))
        .unwrap()
        .last_node;
    // Stamps only the new leaf; the parent's own stamp stays older than `other`'s.
    insert_fresh(&mut cache, &mut alloc, &child);
    cache.inc_lock_ref(other_node).unwrap();
    assert_eq!(
        cache.evict(1, &mut alloc).unwrap(),
        ps,
        "only the child is unlocked"
    );
    cache.dec_lock_ref(other_node).unwrap();
    // `other` was used after the parent's insert but before the child's: it goes first.
    let newer = key(ps, 1, 300);
    insert_fresh(&mut cache, &mut alloc, &newer);
    assert_eq!(cache.evict(1, &mut alloc).unwrap(), ps);
    assert_eq!(cache.match_prefix(&parent).len, ps);
    assert_eq!(cache.match_prefix(&other).len, 0);
    check_radix(&cache).unwrap();
}

// `move_lock` between any two nodes, not only down the holder's own path, leaves the counts
// that `inc_lock_ref(to)` then `dec_lock_ref(from)` leave: across to a sibling branch, then up
// to their shared parent.
#[test]
fn a_lock_moves_across_branches_and_up_as_lock_then_unlock_would() {
    for ps in PAGE_SIZES {
        let mut alloc = allocator(ps, 8);
        let mut cache = RadixCache::new(RadixConfig::new(ps)).unwrap();
        let shared = key(ps, 1, 0);
        let left = [shared.clone(), key(ps, 1, 100)].concat();
        let right = [shared.clone(), key(ps, 1, 200)].concat();
        insert_fresh(&mut cache, &mut alloc, &left);
        insert_fresh(&mut cache, &mut alloc, &right);
        let node_of = |cache: &mut RadixCache, key: &[u32]| cache.match_prefix(key).node;
        let (left_leaf, right_leaf) = (node_of(&mut cache, &left), node_of(&mut cache, &right));
        let parent = node_of(&mut cache, &shared);
        assert!(left_leaf != right_leaf && parent != left_leaf && parent != right_leaf);
        // Errors name nodes: two nodes print apart.
        assert_ne!(left_leaf.to_string(), right_leaf.to_string());

        cache.inc_lock_ref(left_leaf).unwrap();
        assert_eq!(
            (cache.sizes().protected, cache.sizes().evictable),
            (2 * ps, ps)
        );
        cache.move_lock(left_leaf, right_leaf).unwrap();
        // The shared page stays protected, the left page is evictable again.
        assert_eq!(
            (cache.sizes().protected, cache.sizes().evictable),
            (2 * ps, ps)
        );
        assert_eq!(
            cache.dec_lock_ref(left_leaf),
            Err(RadixError::LockUnderflow { node: left_leaf })
        );
        cache.move_lock(right_leaf, parent).unwrap();
        assert_eq!(
            (cache.sizes().protected, cache.sizes().evictable),
            (ps, 2 * ps)
        );
        check_radix(&cache).unwrap();
        cache.dec_lock_ref(parent).unwrap();
        assert_eq!(
            (cache.sizes().protected, cache.sizes().evictable),
            (0, 3 * ps)
        );
        check_radix(&cache).unwrap();
    }
}

#[test]
fn path_slots_into_copies_any_range_and_refuses_a_start_past_the_end_or_a_wrong_length() {
    let ps = 4;
    let mut alloc = allocator(ps, 8);
    let mut cache = RadixCache::new(RadixConfig::new(ps)).unwrap();
    let k = key(ps, 3, 0);
    let row = insert_fresh(&mut cache, &mut alloc, &k);
    // Split the key over two nodes, so that the copy walks up from one to the other.
    insert_fresh(
        &mut cache,
        &mut alloc,
        &[&k[..ps], &key(ps, 1, 900)[..]].concat(),
    );
    let at = cache.match_prefix(&k);
    assert_eq!(at.len, k.len());
    for start in [0, 1, ps + 2, k.len()] {
        let mut out = vec![0; k.len() - start];
        cache.path_slots_into(at, start, &mut out).unwrap();
        assert_eq!(out, row[start..], "from {start}");
    }
    let mut short = vec![0; k.len() - 1];
    assert_eq!(
        cache.path_slots_into(at, 0, &mut short),
        Err(RadixError::LengthMismatch {
            key: k.len(),
            slots: k.len() - 1
        })
    );
    assert_eq!(
        cache.path_slots_into(at, k.len() + 1, &mut []),
        Err(RadixError::StartPastEnd {
            start: k.len() + 1,
            end: k.len()
        })
    );
    // A position inside a page is no position of the tree.
    let unaligned = TreePos {
        node: at.node,
        len: k.len() - 1,
    };
    assert!(matches!(
        cache.path_slots_into(unaligned, 0, &mut short),
        Err(RadixError::HintOutOfRange { len: 11, .. })
    ));
}

// The tree takes any page of `u32` slots, the last one (ending at 2^32, past every pool) too:
// reading its slots back must not step past `u32::MAX` (a debug panic).
#[test]
fn the_slots_of_the_last_page_of_the_u32_range_read_back_without_overflow() {
    let last = u32::MAX;
    // Large pages keep the page id, and so the tree's page index, small.
    for page_size in [256, 1 << 16] {
        let slots: Vec<KvSlot> = (last - (page_size as u32 - 1)..=last).collect();
        let k = key(page_size, 1, 0);
        let mut cache = RadixCache::new(RadixConfig::new(page_size)).unwrap();
        let outcome = cache.insert(Insert::new(&k, &slots)).unwrap();
        let at = TreePos {
            node: outcome.last_node,
            len: page_size,
        };
        assert_eq!(path_slots(&cache, at), slots, "page size {page_size}");
        let mut tail = vec![0; 1];
        cache.path_slots_into(at, page_size - 1, &mut tail).unwrap();
        assert_eq!(tail, [last]);
        let pages: Vec<_> = cache.cached_pages().map(|(_, page)| page).collect();
        assert_eq!(pages, [last / page_size as u32]);
        check_radix(&cache).unwrap();
    }
}

#[test]
fn a_page_size_of_zero_or_past_any_allocators_is_a_typed_error() {
    assert_eq!(
        RadixCache::new(RadixConfig::new(0)).unwrap_err(),
        RadixError::ZeroPageSize
    );
    assert_eq!(
        RadixCache::new(RadixConfig::new(0).with_policy(EvictionPolicy::Lfu)).unwrap_err(),
        RadixError::ZeroPageSize
    );
    let cache = RadixCache::new(RadixConfig::new(4).with_policy(EvictionPolicy::Lfu)).unwrap();
    assert_eq!(
        (cache.config().page_size, cache.config().policy),
        (4, EvictionPolicy::Lfu)
    );
    assert_eq!(cache.sizes().total(), 0);
    let max = u32::MAX as usize / 2;
    assert_eq!(
        RadixCache::new(RadixConfig::new(max + 1)).unwrap_err(),
        RadixError::PageSizeTooLarge {
            page_size: max + 1,
            max
        }
    );
}
