//! A request's row, slots and prefix lock belong to the cache that gave them: every batch-flow
//! call refuses a request that holds KV in another cache (`KvError::OtherCache`), and a batch
//! prepared with one cache cannot be allocated in another (`KvError::PreparedForOtherCache`),
//! leaving both caches exactly as they were. Without the check, releasing a request into the
//! wrong cache freed pages that another request of that cache held.

use kvown_runtime::alloc::PagedAllocator;
use kvown_runtime::batch::Req;
use kvown_runtime::batch::{
    ScheduleBatch, alloc_for_decode, alloc_for_extend, alloc_for_spec_decode, prepare_for_decode,
    prepare_for_extend, prepare_for_spec_decode, release_kv_cache, retract_decode,
};
use kvown_runtime::batch::{cache_unfinished_req, init_next_round_input};
use kvown_runtime::cache::{KvCache, TreeCache};
use kvown_runtime::check::Violation;
use kvown_runtime::error::KvError;
use kvown_runtime::radix::{RadixCache, RadixConfig};
use kvown_runtime::slots::ReqToTokenPool;

type Cache = KvCache<PagedAllocator>;

const PAGE_SIZE: usize = 4;

fn cache() -> Cache {
    let allocator = PagedAllocator::new(128, PAGE_SIZE, false).unwrap();
    let rows = ReqToTokenPool::new(4, 64).unwrap();
    let tree = TreeCache::Radix(RadixCache::new(RadixConfig::new(PAGE_SIZE)).unwrap());
    KvCache::new(allocator, rows, tree).unwrap()
}

/// A running batch of one request of `len` tokens, extended in `cache`.
fn running(cache: &mut Cache, rid: u64, len: usize) -> ScheduleBatch {
    let mut req = Req::new(
        rid,
        (0..len as u32).map(|t| t + 1000 * rid as u32).collect(),
    );
    init_next_round_input(&mut req, cache, usize::MAX).unwrap();
    alloc_for_extend(prepare_for_extend(ScheduleBatch::new(vec![req])), cache)
        .map_err(|failure| failure.error)
        .unwrap()
}

/// What a refused call must leave untouched.
fn state(cache: &Cache) -> (PagedAllocator, ReqToTokenPool, usize, usize) {
    let tree = cache.tree();
    (
        cache.allocator().clone(),
        cache.req_to_token().clone(),
        tree.evictable_size(),
        tree.protected_size(),
    )
}

/// Two caches with one running request each: both hold the same slots and the same row.
fn two_caches() -> (Cache, ScheduleBatch, Cache, ScheduleBatch) {
    let mut a = cache();
    let batch_a = running(&mut a, 1, 10);
    let mut b = cache();
    let batch_b = running(&mut b, 2, 10);
    assert_ne!(a.id(), b.id());
    (a, batch_a, b, batch_b)
}

fn assert_other_cache(error: &KvError, a: &Cache, b: &Cache) {
    assert_eq!(
        *error,
        KvError::OtherCache {
            rid: 1,
            bound: a.id(),
            used: b.id()
        }
    );
    // The message names both caches, so a user can tell which one the request belongs to.
    let expected = format!(
        "request 1 holds KV in cache {}, not in cache {}",
        a.id(),
        b.id()
    );
    assert!(error.to_string().starts_with(&expected), "{error}");
    assert_ne!(
        a.id().to_string(),
        b.id().to_string(),
        "two caches print alike"
    );
}

#[test]
fn release_into_another_cache_frees_nothing() {
    let (a, batch_a, mut b, batch_b) = two_caches();
    let before = (state(&a), state(&b));
    let mut req = batch_a.into_reqs().pop().unwrap();
    let error = release_kv_cache(&mut req, &mut b, true).unwrap_err();
    assert_other_cache(&error, &a, &b);
    assert_eq!((state(&a), state(&b)), before);
    a.check([&req]).unwrap();
    b.check(batch_b.reqs()).unwrap();
}

#[test]
fn decode_in_another_cache_is_refused_at_prepare_and_at_alloc() {
    let (mut a, batch_a, mut b, _batch_b) = two_caches();
    let before = (state(&a), state(&b));
    let (batch_a, error) = prepare_for_decode(batch_a, &b).unwrap_err();
    assert_other_cache(&error, &a, &b);
    assert_eq!(
        batch_a.reqs()[0].kv().decode_batch_idx(),
        0,
        "no clock ticked"
    );

    // Prepared with its own cache, then allocated in the other one.
    let prepared = prepare_for_decode(batch_a, &a).unwrap();
    let failure = alloc_for_decode(prepared, &mut b).unwrap_err();
    assert_eq!(
        failure.error,
        KvError::PreparedForOtherCache {
            prepared: a.id(),
            used: b.id()
        }
    );
    assert_eq!((state(&a), state(&b)), before);
    let batch_a = alloc_for_decode(*failure.batch, &mut a)
        .map_err(|failure| failure.error)
        .unwrap();
    a.check(batch_a.reqs()).unwrap();
}

#[test]
fn speculative_reservation_in_another_cache_is_refused() {
    let (a, batch_a, mut b, _batch_b) = two_caches();
    let before = (state(&a), state(&b));
    let (batch_a, error) = prepare_for_spec_decode(batch_a, &b, 4).unwrap_err();
    assert_other_cache(&error, &a, &b);
    let prepared = prepare_for_spec_decode(batch_a, &a, 4).unwrap();
    let failure = alloc_for_spec_decode(prepared, &mut b).unwrap_err();
    assert!(matches!(
        failure.error,
        KvError::PreparedForOtherCache { .. }
    ));
    assert_eq!((state(&a), state(&b)), before);
}

#[test]
fn a_chunked_prefill_cannot_continue_in_another_cache() {
    let mut a = cache();
    let mut b = cache();
    let _batch_b = running(&mut b, 2, 10);
    // Request 1 prefills its first chunk of 8 tokens in `a`.
    let mut req = Req::new(1, (0..20).collect());
    init_next_round_input(&mut req, &mut a, 8).unwrap();
    let batch = alloc_for_extend(prepare_for_extend(ScheduleBatch::new(vec![req])), &mut a)
        .map_err(|failure| failure.error)
        .unwrap();
    let mut req = batch.into_reqs().pop().unwrap();
    let before = (state(&a), state(&b));

    let error = init_next_round_input(&mut req, &mut b, 8).unwrap_err();
    assert_other_cache(&error, &a, &b);
    let error = cache_unfinished_req(&mut req, &mut b).unwrap_err();
    assert_other_cache(&error, &a, &b);
    let failure =
        alloc_for_extend(prepare_for_extend(ScheduleBatch::new(vec![req])), &mut b).unwrap_err();
    assert_other_cache(&failure.error, &a, &b);
    assert_eq!((state(&a), state(&b)), before);

    let mut req = failure.batch.cancel().into_reqs().pop().unwrap();
    release_kv_cache(&mut req, &mut a, false).unwrap();
    assert_eq!(req.kv().kv_cache(), None, "released: bound to no cache");
    a.check([&req]).unwrap();
}

#[test]
fn a_request_that_matched_nothing_holds_nothing_and_stays_unbound() {
    let mut a = cache();
    let mut req = Req::new(1, vec![1, 2, 3, 4, 5]);
    init_next_round_input(&mut req, &mut a, usize::MAX).unwrap();
    assert_eq!(req.kv().kv_cache(), None);
    // Free to go to another cache.
    let mut b = cache();
    let batch = alloc_for_extend(prepare_for_extend(ScheduleBatch::new(vec![req])), &mut b)
        .map_err(|failure| failure.error)
        .unwrap();
    assert_eq!(batch.reqs()[0].kv().kv_cache(), Some(b.id()));
    b.check(batch.reqs()).unwrap();
    a.check(std::iter::empty()).unwrap();
}

#[test]
fn a_matched_request_is_bound_before_it_holds_a_row() {
    let mut a = cache();
    let mut b = cache();
    // Request 2 finishes in `a` and leaves its pages cached; request 1 shares its prefix.
    let mut batch = running(&mut a, 2, 9);
    let mut done = batch.take_if(|_| true).pop().unwrap();
    release_kv_cache(&mut done, &mut a, true).unwrap();
    let mut req = Req::new(1, (2000..2009).collect());
    init_next_round_input(&mut req, &mut a, usize::MAX).unwrap();
    assert_eq!(req.prefix_len(), 8, "two cached pages matched and locked");
    assert_eq!(req.kv().kv_cache(), Some(a.id()));
    let failure =
        alloc_for_extend(prepare_for_extend(ScheduleBatch::new(vec![req])), &mut b).unwrap_err();
    assert_other_cache(&failure.error, &a, &b);
    assert_eq!(b.available_size(), b.allocator().num_pages() * PAGE_SIZE);
}

#[test]
fn retraction_with_a_request_of_another_cache_releases_nothing() {
    let (a, batch_a, mut b, batch_b) = two_caches();
    let mut mixed = batch_b;
    mixed.extend_reqs(batch_a.into_reqs());
    let before = (state(&a), state(&b));
    let error = retract_decode(&mut mixed, &mut b, None).unwrap_err();
    assert_other_cache(&error, &a, &b);
    assert_eq!(mixed.len(), 2, "no request taken out");
    assert_eq!((state(&a), state(&b)), before);
}

#[test]
fn the_checker_reports_a_request_of_another_cache() {
    let (a, batch_a, b, _batch_b) = two_caches();
    let violation = b.check(batch_a.reqs()).unwrap_err();
    assert_eq!(
        violation,
        Violation::CacheRecord {
            rid: 1,
            holds: true,
            recorded: Some(a.id())
        }
    );
}
