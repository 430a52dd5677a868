//! `KvAllocator`s that wrap a `PagedAllocator`, as a backend does ([`AllocatorLayer`]s): one
//! that changes nothing, and the error paths that only a misbehaving allocator reaches.
//! `Faulty` passes every call on but, once armed, refuses every free after a given
//! number of successful ones, as an allocator whose bookkeeping disagrees with the batch
//! flow's (or a backend that reports a device failure) would. A call that fails this way must
//! drop no request, leave the prefix cache as it was, and the accounting identity must still
//! hold over the requests it hands back. Armed the other way, it frees a held page behind its
//! holder's back, and the checker must name the page and both of its holders.

use crate::common::faulty;

use faulty::{ExtendFault, Faults, Faulty};
use kvown_runtime::alloc::{
    AllocError, AsPageAllocator, KvAllocator, KvSlot, PageId, PagedAllocator, SlotCalls,
};
use kvown_runtime::batch::Req;
use kvown_runtime::batch::{
    ScheduleBatch, alloc_for_decode, alloc_for_extend, alloc_for_spec_decode, commit_spec_tokens,
    prepare_for_decode, prepare_for_extend, prepare_for_spec_decode, release_kv_cache,
    retract_decode,
};
use kvown_runtime::batch::{cache_unfinished_req, init_next_round_input};
use kvown_runtime::cache::{KvCache, TreeCache};
use kvown_runtime::check::{Holder, Violation};
use kvown_runtime::check::{ReclaimError, reclaim_leaks};
use kvown_runtime::error::KvError;
use kvown_runtime::error::{OutOfMemory, PageOutOfRange};
use kvown_runtime::radix::{RadixCache, RadixConfig, RadixError};
use kvown_runtime::slots::ReqToTokenPool;

/// The allocator of these tests.
type FaultyAllocator = Faulty<PagedAllocator>;

/// A layer over a `PagedAllocator` that changes nothing: every call passes through the
/// layer's defaults, the blanket `KvAllocator` and `AsPageAllocator`.
struct PassThrough(PagedAllocator);

// Named in full: with the trait in scope, its calls would be ambiguous with `KvAllocator`'s.
impl kvown_runtime::alloc::AllocatorLayer for PassThrough {
    type Inner = PagedAllocator;

    fn inner(&self) -> &PagedAllocator {
        &self.0
    }

    fn inner_mut(&mut self) -> &mut PagedAllocator {
        &mut self.0
    }
}

/// A cache of `pool_tokens` slots in pages of 4, no prefix cache, with the fault's handle.
fn faulty_cache(pool_tokens: usize) -> (KvCache<FaultyAllocator>, Faults) {
    faulty_cache_with(pool_tokens, TreeCache::Disabled)
}

/// [`faulty_cache`] with `tree` as its prefix cache.
fn faulty_cache_with(pool_tokens: usize, tree: TreeCache) -> (KvCache<FaultyAllocator>, Faults) {
    let faults = Faults::default();
    let allocator = Faulty {
        inner: PagedAllocator::new(pool_tokens, 4, false).unwrap(),
        faults: faults.clone(),
    };
    let rows = ReqToTokenPool::new(8, 64).unwrap();
    let cache = KvCache::new(allocator, rows, tree).unwrap();
    (cache, faults)
}

/// [`faulty_cache`] of 64 slots with a radix prefix cache.
fn faulty_radix_cache() -> (KvCache<FaultyAllocator>, Faults) {
    faulty_cache_with(
        64,
        TreeCache::Radix(RadixCache::new(RadixConfig::new(4)).unwrap()),
    )
}

/// Matches and extends `reqs` in one batch.
fn extend(mut reqs: Vec<Req>, cache: &mut KvCache<FaultyAllocator>) -> ScheduleBatch {
    for req in &mut reqs {
        init_next_round_input(req, cache, usize::MAX).unwrap();
    }
    alloc_for_extend(prepare_for_extend(ScheduleBatch::new(reqs)), cache)
        .map_err(|failure| failure.error)
        .unwrap()
}

/// Extends `count` requests of 8 tokens each (two whole pages), rids `1..=count`.
fn extend_eight_token_requests(count: u64, cache: &mut KvCache<FaultyAllocator>) -> ScheduleBatch {
    let reqs = (1..=count)
        .map(|rid| Req::new(rid, (0..8).map(|t| t as u32 + 100 * rid as u32).collect()))
        .collect();
    extend(reqs, cache)
}

/// One decode step of `batch`, which must succeed.
fn decode<A: KvAllocator>(batch: ScheduleBatch, cache: &mut KvCache<A>) -> ScheduleBatch {
    let prepared = prepare_for_decode(batch, cache)
        .map_err(|(_, error)| error)
        .unwrap();
    alloc_for_decode(prepared, cache)
        .map_err(|failure| failure.error)
        .unwrap()
}

/// Releases every request that still holds KV, evicts the prefix cache, then checks that the
/// pool is whole.
fn release_all_and_check_whole(reqs: &mut [Req], cache: &mut KvCache<FaultyAllocator>) {
    for req in reqs.iter_mut().filter(|req| req.kv().holds_kv()) {
        release_kv_cache(req, cache, false).unwrap();
    }
    cache.check(&*reqs).unwrap();
    let capacity = cache.allocator().capacity();
    cache.evict_shortfall(capacity).unwrap();
    assert_eq!(cache.available_size(), capacity);
}

/// The wrapped allocator and the prefix cache's sizes and pages: what a refused call of the
/// cache must leave as it was.
#[derive(Debug, PartialEq)]
struct CacheState {
    allocator: PagedAllocator,
    tree_sizes: (usize, usize, usize),
    cached_pages: Vec<PageId>,
}

impl CacheState {
    fn of(cache: &KvCache<FaultyAllocator>) -> CacheState {
        let tree = cache.tree().radix().expect("a radix cache");
        let mut cached_pages: Vec<PageId> = tree.cached_pages().map(|(_, page)| page).collect();
        cached_pages.sort_unstable();
        CacheState {
            allocator: cache.allocator().inner.clone(),
            tree_sizes: (
                tree.sizes().total(),
                tree.sizes().evictable,
                tree.sizes().protected,
            ),
            cached_pages,
        }
    }
}

/// Everything a refused call must leave as it was: the request's record and row, and the cache.
#[derive(Debug, PartialEq)]
struct Snapshot {
    record: kvown_runtime::batch::ReqKvInfo,
    row: Vec<KvSlot>,
    cache: CacheState,
}

impl Snapshot {
    fn take(req: &Req, cache: &KvCache<FaultyAllocator>) -> Snapshot {
        let row = req.held_row().unwrap();
        Snapshot {
            record: req.kv().clone(),
            row: cache.req_to_token().row(row).unwrap().to_vec(),
            cache: CacheState::of(cache),
        }
    }
}

/// Two requests extended in one batch (so neither matches the other), pages of 4: rid 1 with
/// 8 tokens, rid 2 with the same 8 and 4 more. Rid 1's pages are registered in the prefix
/// cache; rid 2's first two pages are then duplicates of them.
fn shared_prefix_pair(cache: &mut KvCache<FaultyAllocator>) -> Vec<Req> {
    let prompt: Vec<u32> = (0..12).map(|t| t + 500).collect();
    let reqs = vec![
        Req::new(1, prompt[..8].to_vec()),
        Req::new(2, prompt.clone()),
    ];
    let mut reqs = extend(reqs, cache).into_reqs();
    cache_unfinished_req(&mut reqs[0], cache).unwrap();
    cache.check(&reqs).unwrap();
    reqs
}

#[test]
fn a_release_refused_by_the_allocator_changes_nothing() {
    let (mut cache, faults) = faulty_cache(64);
    let batch = extend_eight_token_requests(1, &mut cache);
    let mut reqs = batch.into_reqs();
    let available = cache.available_size();
    let record = reqs[0].kv().clone();

    faults.set_frees_left(Some(0));
    let error = release_kv_cache(&mut reqs[0], &mut cache, false).unwrap_err();
    assert!(
        matches!(error, KvError::Alloc(AllocError::NotAllocated { .. })),
        "{error}"
    );
    assert_eq!(reqs[0].kv(), &record, "the request still holds its KV");
    assert_eq!(cache.available_size(), available);
    cache.check(&reqs).unwrap();

    faults.set_frees_left(None);
    release_all_and_check_whole(&mut reqs, &mut cache);
}

// A device can run out of memory after the host's count said the extend fits. The rows the
// call would have taken stay free with their generations (they used to be taken, bumped, and
// given back bumped).
#[test]
fn a_refused_extend_allocation_leaves_the_row_pool_as_it_was() {
    let (mut cache, faults) = faulty_cache(64);
    let held = extend_eight_token_requests(1, &mut cache).into_reqs();
    let (rows, allocator) = (
        cache.req_to_token().clone(),
        cache.allocator().inner.clone(),
    );
    let prepared = prepare_for_extend(ScheduleBatch::new(vec![
        Req::new(7, (0..6).collect()),
        Req::new(8, (0..5).collect()),
    ]));
    faults.fault_next_extend(ExtendFault::Refuse);
    let failure = alloc_for_extend(prepared, &mut cache).unwrap_err();
    assert_eq!(
        failure.error,
        KvError::OutOfMemory(OutOfMemory {
            requested: 11,
            available: 56,
            evictable: 0,
        })
    );
    assert_eq!(cache.req_to_token(), &rows);
    assert_eq!(cache.allocator().inner, allocator);

    let next = rows.next_rows(2).unwrap().to_vec();
    let batch = alloc_for_extend(*failure.batch, &mut cache)
        .map_err(|failure| failure.error)
        .unwrap();
    for (req, row) in batch.reqs().iter().zip(next) {
        assert_eq!(req.kv().req_pool_idx(), Some(row));
        assert_eq!(
            cache.req_to_token().req_generation(row),
            Ok(rows.req_generation(row).unwrap() + 1),
            "one assignment, one generation"
        );
    }
    let mut all = held;
    all.extend(batch.into_reqs());
    release_all_and_check_whole(&mut all, &mut cache);
}

// The batch flow evicts the shortfall before it asks the allocator for the slots; an allocator
// that then refuses cannot undo the eviction. The evicted entries were unlocked cache, so the
// cache stays consistent, and a retry finds the room already made.
#[test]
fn an_extend_refused_by_the_allocator_after_the_eviction_leaves_the_entries_evicted() {
    let (mut cache, faults) = faulty_cache_with(
        16,
        TreeCache::Radix(RadixCache::new(RadixConfig::new(4)).unwrap()),
    );
    let mut cached = extend_eight_token_requests(1, &mut cache).into_reqs();
    release_kv_cache(&mut cached[0], &mut cache, true).unwrap();
    assert_eq!(
        (cache.available_size(), cache.tree().evictable_size()),
        (8, 8)
    );
    let mut req = Req::new(2, (0..12).map(|t| t + 900).collect());
    init_next_round_input(&mut req, &mut cache, usize::MAX).unwrap();
    let prepared = prepare_for_extend(ScheduleBatch::new(vec![req]));

    faults.fault_next_extend(ExtendFault::Refuse);
    let failure = alloc_for_extend(prepared, &mut cache).unwrap_err();
    assert!(matches!(failure.error, KvError::OutOfMemory(_)));
    assert_eq!(
        (cache.available_size(), cache.tree().evictable_size()),
        (16, 0),
        "the shortfall was evicted before the allocator refused"
    );
    cache.check([]).unwrap();
    let batch = alloc_for_extend(*failure.batch, &mut cache)
        .map_err(|failure| failure.error)
        .unwrap();
    release_all_and_check_whole(&mut batch.into_reqs(), &mut cache);
}

// The extend clears the batch's `out_cache_loc` before the allocator appends to it; when the
// allocator then refuses, the batch handed back (and readied again with `cancel`) must not pair
// the last allocation's positions with slots it no longer has.
#[test]
fn a_refused_extend_allocation_leaves_out_cache_loc_and_out_positions_agreeing() {
    let (mut cache, faults) = faulty_cache(64);
    let batch = decode(extend_eight_token_requests(1, &mut cache), &mut cache);
    let positions = |batch: &ScheduleBatch| -> Vec<(usize, usize)> {
        batch
            .out_positions()
            .map(|(_, range)| (range.start, range.end))
            .collect()
    };
    assert_eq!(positions(&batch), [(8, 9)]);
    assert_eq!(batch.out_cache_loc().len(), 1);

    // An extend of the same batch (nothing new to back), refused by the allocator.
    faults.fault_next_extend(ExtendFault::Refuse);
    let failure = alloc_for_extend(prepare_for_extend(batch), &mut cache).unwrap_err();
    assert!(matches!(failure.error, KvError::OutOfMemory(_)));
    let batch = failure.batch.cancel();
    let named: usize = positions(&batch)
        .iter()
        .map(|(start, end)| end - start)
        .sum();
    assert_eq!(
        named,
        batch.out_cache_loc().len(),
        "out_positions names exactly the slots of out_cache_loc"
    );
    release_all_and_check_whole(&mut batch.into_reqs(), &mut cache);
}

#[test]
fn a_refused_release_of_a_speculative_over_allocation_changes_nothing() {
    // Committed 9 of 16 allocated: the release frees [0, 9) and the over-allocation [12, 16)
    // in one call, so a refusal cannot free the first part and keep the second.
    let (mut cache, faults) = faulty_cache(64);
    let batch = extend_eight_token_requests(1, &mut cache);
    let prepared = prepare_for_spec_decode(batch, &cache, 6)
        .map_err(|(_, error)| error)
        .unwrap();
    let mut batch = alloc_for_spec_decode(prepared, &mut cache)
        .map_err(|failure| failure.error)
        .unwrap();
    commit_spec_tokens(&mut batch, &[1]).unwrap();
    let mut reqs = batch.into_reqs();
    let kv = reqs[0].kv();
    assert_eq!((kv.kv_committed_len(), kv.kv_allocated_len()), (9, 16));
    let (available, record) = (cache.available_size(), kv.clone());

    faults.set_frees_left(Some(0));
    release_kv_cache(&mut reqs[0], &mut cache, false).unwrap_err();
    assert_eq!(reqs[0].kv(), &record);
    assert_eq!(
        cache.available_size(),
        available,
        "no page of the request was freed"
    );
    cache.check(&reqs).unwrap();

    // One free is all the release needs: a budget of one releases everything.
    faults.set_frees_left(Some(1));
    release_kv_cache(&mut reqs[0], &mut cache, false).unwrap();
    cache.check(&reqs).unwrap();
    assert_eq!(cache.available_size(), cache.allocator().capacity());
}

#[test]
fn a_retraction_whose_second_release_fails_hands_every_request_back() {
    // Four requests of two pages fill the 8-page pool; with one more token each, every one
    // opens a page next step (4 pages needed, none free): retracting rid 4 frees two pages (3
    // still needed), so rid 3 is next, and its release is the one the allocator refuses.
    let (mut cache, faults) = faulty_cache(32);
    let mut batch = extend_eight_token_requests(4, &mut cache);
    assert_eq!(cache.available_size(), 0);
    for req in batch.reqs_mut() {
        req.push_output(7);
    }

    faults.set_frees_left(Some(1));
    let error = retract_decode(&mut batch, &mut cache, None).unwrap_err();
    assert!(
        matches!(error, KvError::Alloc(AllocError::NotAllocated { .. })),
        "{error}"
    );

    // Not released, in batch order; then taken out for release, in release order.
    let rids: Vec<u64> = batch.reqs().iter().map(Req::rid).collect();
    assert_eq!(rids, [1, 2, 4, 3]);
    let holds: Vec<bool> = batch.reqs().iter().map(|req| req.kv().holds_kv()).collect();
    assert_eq!(holds, [true, true, false, true], "only rid 4 was released");
    let retracted = &batch.reqs()[2];
    assert!(retracted.is_retracted && retracted.retraction_count == 1);
    assert!(
        !batch.reqs()[3].is_retracted,
        "the refused release left rid 3 as it was"
    );
    assert_eq!(cache.available_size(), 8, "rid 4's two pages are free");
    cache.check(batch.reqs()).unwrap();

    faults.set_frees_left(None);
    let mut reqs = batch.into_reqs();
    release_all_and_check_whole(&mut reqs, &mut cache);
}

#[test]
fn a_layer_hands_out_the_pages_its_inner_allocator_does() {
    let mut wrapped = PassThrough(PagedAllocator::new(64, 4, false).unwrap());
    let mut own = PagedAllocator::new(64, 4, false).unwrap();
    for num_pages in [1, 3, 0, 5] {
        let (mut by_default, mut by_own) = (vec![99], vec![99]);
        wrapped.alloc_page_ids(num_pages, &mut by_default).unwrap();
        own.alloc_page_ids(num_pages, &mut by_own).unwrap();
        assert_eq!(by_default, by_own);
        assert_eq!(wrapped.0, own);
    }
    // Far more pages (or slots) than the pool has: refused before anything is reserved for
    // them (2^40 pages of 4 slots once aborted the process reserving 16 TiB).
    for num_pages in [usize::MAX, 1 << 40] {
        let mut out = vec![99];
        let error = wrapped.alloc_page_ids(num_pages, &mut out).unwrap_err();
        assert!(matches!(error, AllocError::OutOfMemory(_)), "{error}");
        let error = wrapped.alloc(num_pages / 4 * 4, &mut out).unwrap_err();
        assert!(matches!(error, AllocError::OutOfMemory(_)), "{error}");
        assert_eq!(out, [99]);
        assert_eq!(wrapped.0, own);
    }
}

#[test]
fn a_refused_free_of_registered_duplicates_leaves_the_request_and_the_tree_as_they_were() {
    // Registering rid 2 inserts [0, 12): [0, 8) is cached already, so rid 2's slots there are
    // duplicates to free, and the tree would take its third page. The allocator refuses that
    // free: the tree must not have taken the page either.
    let (mut cache, faults) = faulty_radix_cache();
    let mut reqs = shared_prefix_pair(&mut cache);
    let before = Snapshot::take(&reqs[1], &cache);
    assert_eq!(before.cache.tree_sizes.0, 8, "rid 1's two pages are cached");

    faults.set_frees_left(Some(0));
    let error = cache_unfinished_req(&mut reqs[1], &mut cache).unwrap_err();
    assert!(
        matches!(error, KvError::Alloc(AllocError::NotAllocated { .. })),
        "{error}"
    );
    assert_eq!(Snapshot::take(&reqs[1], &cache), before);
    cache.check(&reqs).unwrap();

    // Allowed one free, the same call goes through: rid 2's row points at rid 1's pages and
    // the tree holds all three.
    faults.set_frees_left(Some(1));
    cache_unfinished_req(&mut reqs[1], &mut cache).unwrap();
    let row_of =
        |req: &Req| cache.req_to_token().row(req.held_row().unwrap()).unwrap()[..8].to_vec();
    assert_eq!(row_of(&reqs[1]), row_of(&reqs[0]));
    assert_eq!(reqs[1].kv().cache_protected_len(), 12);
    assert_eq!(cache.tree().radix().unwrap().sizes().total(), 12);
    cache.check(&reqs).unwrap();

    faults.set_frees_left(None);
    release_all_and_check_whole(&mut reqs, &mut cache);
}

#[test]
fn a_refused_release_with_insertion_leaves_the_request_and_the_tree_as_they_were() {
    let (mut cache, faults) = faulty_radix_cache();
    let mut reqs = shared_prefix_pair(&mut cache);
    let before = Snapshot::take(&reqs[1], &cache);

    faults.set_frees_left(Some(0));
    release_kv_cache(&mut reqs[1], &mut cache, true).unwrap_err();
    assert_eq!(Snapshot::take(&reqs[1], &cache), before);
    cache.check(&reqs).unwrap();

    // One free is all the release needs: rid 2's duplicates go back, its third page stays cached.
    faults.set_frees_left(Some(1));
    release_kv_cache(&mut reqs[1], &mut cache, true).unwrap();
    assert!(!reqs[1].kv().holds_kv());
    assert_eq!(cache.tree().radix().unwrap().sizes().total(), 12);
    cache.check(&reqs).unwrap();

    faults.set_frees_left(None);
    release_all_and_check_whole(&mut reqs, &mut cache);
}

/// A radix cache of 64 slots (pages of 4) holding three released 8-token prompts, rid 1 the
/// least recently used: six cached pages in three unlocked leaves, 40 slots free.
fn three_cached_prompts() -> (KvCache<FaultyAllocator>, Faults, Vec<Req>) {
    let (mut cache, faults) = faulty_radix_cache();
    let mut reqs = extend_eight_token_requests(3, &mut cache).into_reqs();
    for req in &mut reqs {
        release_kv_cache(req, &mut cache, true).unwrap();
    }
    assert_eq!(cache.tree().radix().unwrap().sizes().total(), 24);
    (cache, faults, reqs)
}

/// The slots a cache hands out when everything free is allocated: its free-list order.
fn free_list_order(cache: &KvCache<FaultyAllocator>) -> Vec<KvSlot> {
    let mut allocator = cache.allocator().inner.clone();
    let mut slots = Vec::new();
    allocator
        .alloc(allocator.available_size(), &mut slots)
        .unwrap();
    slots
}

#[test]
fn a_refused_eviction_keeps_what_it_had_not_freed_and_the_next_one_evicts_as_if_it_had_not_been_tried()
 {
    // Two caches built alike; the first one's allocator refuses the eviction's free.
    let (mut refused, faults, reqs) = three_cached_prompts();
    let (mut untried, _, _) = three_cached_prompts();
    let before = CacheState::of(&refused);

    // 44 slots asked, 40 free: the shortfall of 4 takes the least recently used leaf, 8 tokens;
    // all 64 take the three leaves, one free each. The first free is refused: nothing evicted.
    faults.set_frees_left(Some(0));
    for (asked, chosen_tokens) in [(44, 8), (64, 24)] {
        let error = refused.evict_shortfall(asked).unwrap_err();
        assert!(
            matches!(
                error,
                KvError::Radix(RadixError::Free {
                    tokens,
                    evicted: 0,
                    source: AllocError::NotAllocated { .. },
                }) if tokens == chosen_tokens
            ),
            "{error}"
        );
        assert_eq!(
            CacheState::of(&refused),
            before,
            "the tree and the allocator are as they were"
        );
        refused.check(&reqs).unwrap();
    }
    faults.set_frees_left(Some(1));

    // The refusals left the LRU order as it was: both caches evict the same leaves, and their
    // pages go back to the free list in the same order.
    assert_eq!(refused.evict_shortfall(44), Ok(8));
    assert_eq!(untried.evict_shortfall(44), Ok(8));
    assert_eq!(CacheState::of(&refused), CacheState::of(&untried));
    assert_eq!(free_list_order(&refused), free_list_order(&untried));
    refused.check(&reqs).unwrap();

    // The two leaves left go in two frees: allowed one, the first leaf is evicted and the
    // second stays cached, still evictable; the next eviction takes it as if nothing had failed.
    faults.set_frees_left(Some(1));
    let error = refused.evict_shortfall(64).unwrap_err();
    assert!(
        matches!(
            error,
            KvError::Radix(RadixError::Free {
                tokens: 16,
                evicted: 8,
                ..
            })
        ),
        "{error}"
    );
    assert_eq!(refused.tree().evictable_size(), 8);
    refused.check(&reqs).unwrap();
    faults.set_frees_left(None);
    assert_eq!(refused.evict_shortfall(64), Ok(8));
    assert_eq!(untried.evict_shortfall(64), Ok(16));
    for cache in [&refused, &untried] {
        assert_eq!(cache.available_size(), 64);
    }
    assert_eq!(free_list_order(&refused), free_list_order(&untried));
}

#[test]
fn the_checker_finds_a_page_freed_behind_its_holders_back() {
    // Request 1 holds two pages; the allocator frees its second page along with request 2's
    // release, as a second owner of the allocator would.
    let (mut cache, faults) = faulty_cache(64);
    let mut reqs = extend_eight_token_requests(2, &mut cache).into_reqs();
    let row = reqs[0].kv().req_pool_idx().unwrap();
    let second_page = cache.req_to_token().row(row).unwrap()[4] / 4;

    faults.smuggle(second_page);
    release_kv_cache(&mut reqs[1], &mut cache, false).unwrap();
    assert_eq!(
        cache.check(&reqs),
        Err(Violation::PageHeldTwice {
            page: second_page as usize,
            first: Holder::Free,
            second: Holder::Request(1),
        })
    );
    // Its holder cannot free it again: the release is refused whole.
    let record = reqs[0].kv().clone();
    let error = release_kv_cache(&mut reqs[0], &mut cache, false).unwrap_err();
    assert!(
        matches!(error, KvError::Alloc(AllocError::DoubleFree { .. })),
        "{error}"
    );
    assert_eq!(reqs[0].kv(), &record, "the request still holds its KV");
}

#[test]
fn the_checker_finds_pages_a_lost_free_left_to_no_one_and_reclaim_frees_them() {
    // Request 2's release reports success but the allocator keeps its two pages: they are held
    // by no one (no row or lock is left to name a request).
    let (mut cache, faults) = faulty_cache(64);
    let mut reqs = extend_eight_token_requests(2, &mut cache).into_reqs();
    let row = reqs[1].kv().req_pool_idx().unwrap();
    let mut lost_pages: Vec<PageId> = cache.req_to_token().row(row).unwrap()[..8]
        .iter()
        .map(|&slot| slot / 4)
        .collect();
    lost_pages.dedup();
    faults.lose_next_free();
    release_kv_cache(&mut reqs[1], &mut cache, false).unwrap();
    let live = ..1;
    let lost = Violation::UnclaimedPages {
        first: *lost_pages.iter().min().unwrap(),
        count: 2,
    };
    assert_eq!(cache.check(&reqs[live]), Err(lost.clone()));

    // A reclaim whose free is refused changes nothing.
    faults.set_frees_left(Some(0));
    let refused = reclaim_leaks(&mut cache, &mut reqs[live]).unwrap_err();
    assert!(
        matches!(refused, ReclaimError::Free { pages: 2, .. }),
        "{refused}"
    );
    assert_eq!(cache.check(&reqs[live]), Err(lost));

    faults.set_frees_left(None);
    let reclaimed = reclaim_leaks(&mut cache, &mut reqs[live]).unwrap();
    assert_eq!(reclaimed.pages, lost_pages);
    assert!(reclaimed.rows.is_empty() && reclaimed.locks.is_empty());
    assert!(!reclaimed.is_empty(), "pages alone are a leak");
    cache.check(&reqs[live]).unwrap();
    release_all_and_check_whole(&mut reqs, &mut cache);
}

#[test]
fn the_checker_finds_a_page_a_row_names_twice_and_the_one_it_names_nowhere() {
    // The extend takes two pages but the row names the first twice: the accounting balances
    // (two pages held, eight positions owned), so only the page census can see it: the row's
    // two runs of positions claim one page.
    let (mut cache, faults) = faulty_cache(64);
    faults.fault_next_extend(ExtendFault::Alias);
    let mut reqs = extend_eight_token_requests(1, &mut cache).into_reqs();
    let row = cache
        .req_to_token()
        .row(reqs[0].kv().req_pool_idx().unwrap())
        .unwrap()[..8]
        .to_vec();
    assert_eq!(row[..4], row[4..], "one page named at both page positions");
    let held: Vec<PageId> = (1..=16)
        .filter(|&page| cache.allocator().inner.is_page_allocated(page))
        .collect();
    let named = row[0] / 4;
    let unnamed: Vec<PageId> = held.iter().copied().filter(|&page| page != named).collect();
    assert_eq!((held.len(), unnamed.len()), (2, 1));
    let twice = Violation::PageHeldTwice {
        page: named as usize,
        first: Holder::Request(1),
        second: Holder::Request(1),
    };
    assert_eq!(cache.check(&reqs), Err(twice.clone()));
    // Reclaiming runs the same census: it refuses, changing nothing.
    let before = (
        cache.allocator().inner.clone(),
        cache.req_to_token().clone(),
    );
    assert_eq!(
        reclaim_leaks(&mut cache, &mut reqs),
        Err(ReclaimError::Violation(twice))
    );
    assert_eq!(
        (
            cache.allocator().inner.clone(),
            cache.req_to_token().clone()
        ),
        before
    );
    // The release frees the one page the row names; reclaiming gives back the other.
    release_kv_cache(&mut reqs[0], &mut cache, false).unwrap();
    let reclaimed = reclaim_leaks(&mut cache, &mut reqs).unwrap();
    assert_eq!(reclaimed.pages, unnamed);
    release_all_and_check_whole(&mut reqs, &mut cache);
}

#[test]
fn the_checker_names_a_page_past_the_pool_instead_of_panicking() {
    // The extend's first page comes back as slots past the pool: the checker (and a reclaim,
    // which runs the same census) used to index past their page table and panic.
    let (mut cache, faults) = faulty_cache(64);
    faults.fault_next_extend(ExtendFault::Stray);
    let mut reqs = extend_eight_token_requests(1, &mut cache).into_reqs();
    let row = cache
        .req_to_token()
        .row(reqs[0].kv().req_pool_idx().unwrap())
        .unwrap()[0];
    let stray = Violation::PageOutOfRange {
        range: PageOutOfRange {
            page: row / 4,
            pages: 17,
        },
        holder: Holder::Request(1),
    };
    assert_eq!(row as usize / 4, 19, "the first page moved 18 pages up");
    assert_eq!(cache.check(&reqs), Err(stray.clone()));
    let (allocator, table) = (
        cache.allocator().inner.clone(),
        cache.req_to_token().clone(),
    );
    assert_eq!(
        reclaim_leaks(&mut cache, &mut reqs).unwrap_err(),
        ReclaimError::Violation(stray)
    );
    assert_eq!(cache.allocator().inner, allocator);
    assert_eq!(cache.req_to_token(), &table);
}

/// Extends two requests, decodes them across a page boundary, reserves speculatively, then
/// releases everything: each step's `out_cache_loc` and rows, in order.
fn batch_flow_trace<A: KvAllocator + AsPageAllocator>(allocator: A) -> Vec<Vec<KvSlot>> {
    let mut cache = KvCache::new(
        allocator,
        ReqToTokenPool::new(4, 64).unwrap(),
        TreeCache::Disabled,
    )
    .unwrap();
    let mut trace = Vec::new();
    let mut record = |batch: &ScheduleBatch, cache: &KvCache<A>| {
        trace.push(batch.out_cache_loc().to_vec());
        for req in batch.reqs() {
            let row = cache.req_to_token().row(req.held_row().unwrap()).unwrap();
            trace.push(row[..req.kv().kv_allocated_len()].to_vec());
        }
    };
    let reqs = vec![
        Req::new(1, (0..6).collect()),
        Req::new(2, (10..13).collect()),
    ];
    let mut batch = alloc_for_extend(prepare_for_extend(ScheduleBatch::new(reqs)), &mut cache)
        .map_err(|failure| failure.error)
        .unwrap();
    record(&batch, &cache);
    for _ in 0..3 {
        batch = decode(batch, &mut cache);
        record(&batch, &cache);
    }
    let prepared = prepare_for_spec_decode(batch, &cache, 3)
        .map_err(|(_, e)| e)
        .unwrap();
    let batch = alloc_for_spec_decode(prepared, &mut cache)
        .map_err(|failure| failure.error)
        .unwrap();
    record(&batch, &cache);
    let mut reqs = batch.into_reqs();
    cache.check(&reqs).unwrap();
    for req in &mut reqs {
        release_kv_cache(req, &mut cache, false).unwrap();
    }
    cache.check(&reqs).unwrap();
    assert_eq!(cache.available_size(), cache.allocator().capacity());
    trace
}

#[test]
fn the_batch_flow_through_a_layer_matches_the_paged_allocators_own() {
    let by_default = batch_flow_trace(PassThrough(PagedAllocator::new(64, 4, false).unwrap()));
    let by_own = batch_flow_trace(PagedAllocator::new(64, 4, false).unwrap());
    assert_eq!(by_default.len(), 15);
    assert_eq!(by_default, by_own);
}

// `AllocFailure::batch`: "exactly as prepared, except after the allocator itself refused the
// slots: then the last allocation's `out_cache_loc` ... is forgotten". The speculative
// reservation writes no `out_cache_loc`, and one the allocator refuses keeps the batch's.
#[test]
fn a_refused_speculative_reservation_keeps_the_last_out_cache_loc() {
    let (mut cache, faults) = faulty_cache(64);
    let batch = decode(extend_eight_token_requests(1, &mut cache), &mut cache);
    let decoded = batch.out_cache_loc().to_vec();
    assert_eq!(decoded.len(), 1);
    let prepared = prepare_for_spec_decode(batch, &cache, 4)
        .map_err(|(_, error)| error)
        .unwrap();
    faults.fault_next_extend(ExtendFault::Refuse);
    let failure = alloc_for_spec_decode(prepared, &mut cache).unwrap_err();
    assert!(matches!(failure.error, KvError::OutOfMemory(_)));
    let mut batch = failure.batch.cancel();
    assert_eq!(batch.out_cache_loc(), decoded);
    let positions: Vec<_> = batch
        .out_positions()
        .map(|(req, range)| (req.rid(), range.start, range.end))
        .collect();
    assert_eq!(positions, [(1, 8, 9)]);
    release_all_and_check_whole(batch.reqs_mut(), &mut cache);
}
