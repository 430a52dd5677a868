//! End-to-end batch flow: extend, decode, speculative decode, chunked prefill, prefix reuse,
//! retraction and release, with the invariant checker after every step and the pool back to
//! full capacity at the end.

use kvown_runtime::alloc::{KvAllocator, PagedAllocator};
use kvown_runtime::batch::Req;
use kvown_runtime::batch::{
    ScheduleBatch, alloc_for_decode, alloc_for_extend, alloc_for_spec_decode, commit_spec_tokens,
    prepare_for_decode, prepare_for_extend, prepare_for_spec_decode, release_kv_cache,
    retract_decode,
};
use kvown_runtime::batch::{cache_unfinished_req, init_next_round_input};
use kvown_runtime::cache::{KvCache, TreeCache};
use kvown_runtime::error::KvError;
use kvown_runtime::error::OutOfMemory;
use kvown_runtime::radix::{Namespace, RadixCache, RadixConfig};
use kvown_runtime::slots::ReqToTokenPool;

fn cache(pool_tokens: usize, page_size: usize, radix: bool) -> KvCache<PagedAllocator> {
    let allocator = PagedAllocator::new(pool_tokens, page_size, false).unwrap();
    let tree = if radix {
        TreeCache::Radix(RadixCache::new(RadixConfig::new(page_size)).unwrap())
    } else {
        TreeCache::Disabled
    };
    KvCache::new(allocator, ReqToTokenPool::new(8, 256).unwrap(), tree).unwrap()
}

fn extend(reqs: Vec<Req>, cache: &mut KvCache<PagedAllocator>) -> ScheduleBatch {
    let mut reqs = reqs;
    for req in &mut reqs {
        init_next_round_input(req, cache, usize::MAX).unwrap();
    }
    alloc_for_extend(prepare_for_extend(ScheduleBatch::new(reqs)), cache)
        .map_err(|f| f.error)
        .unwrap()
}

fn decode(batch: ScheduleBatch, cache: &mut KvCache<PagedAllocator>) -> ScheduleBatch {
    let prepared = prepare_for_decode(batch, cache)
        .map_err(|(_, e)| e)
        .unwrap();
    alloc_for_decode(prepared, cache)
        .map_err(|f| f.error)
        .unwrap()
}

fn release_all(batch: ScheduleBatch, cache: &mut KvCache<PagedAllocator>, insert: bool) {
    let mut reqs = batch.into_reqs();
    for i in 0..reqs.len() {
        release_kv_cache(&mut reqs[i], cache, insert).unwrap();
        cache.check(&reqs).unwrap();
    }
}

#[test]
fn extend_then_decode_settles_allocated_and_committed_together() {
    for page_size in [1, 3, 4, 16] {
        let mut cache = cache(1024, page_size, true);
        let prompt: Vec<u32> = (0..21).collect();
        let mut batch = extend(vec![Req::new(1, prompt.clone())], &mut cache);
        cache.check(batch.reqs()).unwrap();
        let kv = batch.reqs()[0].kv();
        assert_eq!((kv.kv_allocated_len(), kv.kv_committed_len()), (21, 21));
        assert_eq!(batch.out_cache_loc().len(), 21);
        for step in 0..10 {
            batch.reqs_mut()[0].push_output(100 + step);
            batch = decode(batch, &mut cache);
            cache.check(batch.reqs()).unwrap();
            let kv = batch.reqs()[0].kv();
            assert_eq!(kv.kv_allocated_len(), 22 + step as usize);
            assert_eq!(kv.kv_committed_len(), kv.kv_allocated_len());
            assert_eq!(kv.decode_batch_idx(), step as u64 + 1);
            let row = cache
                .req_to_token()
                .row(kv.req_pool_idx().unwrap())
                .unwrap();
            assert_eq!(row[21 + step as usize], batch.out_cache_loc()[0]);
        }
        release_all(batch, &mut cache, true);
        assert!(cache.tree().evictable_size() > 0, "finished KV is cached");
        cache.evict_shortfall(usize::MAX / 2).unwrap();
        assert_eq!(cache.available_size(), cache.allocator().capacity());
    }
}

#[test]
fn prefix_reuse_locks_and_protects_the_matched_pages() {
    let page_size = 4;
    let mut cache = cache(1024, page_size, true);
    let shared: Vec<u32> = (0..16).collect();
    let first = extend(
        vec![Req::new(
            1,
            shared.iter().copied().chain([50, 51]).collect(),
        )],
        &mut cache,
    );
    release_all(first, &mut cache, true);
    let batch = extend(
        vec![Req::new(2, shared.iter().copied().chain([60]).collect())],
        &mut cache,
    );
    let kv = batch.reqs()[0].kv();
    assert_eq!(kv.cache_protected_len(), 16, "four whole pages matched");
    assert_eq!(
        batch.out_cache_loc().len(),
        1,
        "only the new token is allocated"
    );
    assert_eq!(cache.tree().protected_size(), 16);
    cache.check(batch.reqs()).unwrap();
    release_all(batch, &mut cache, true);
    assert_eq!(cache.tree().protected_size(), 0);
}

#[test]
fn out_of_memory_is_transactional_and_reports_numbers() {
    let mut cache = cache(64, 16, false);
    let big = Req::new(1, (0..100).collect());
    let mut reqs = vec![big];
    init_next_round_input(&mut reqs[0], &mut cache, usize::MAX).unwrap();
    let before_free = cache.available_size();
    let failure =
        alloc_for_extend(prepare_for_extend(ScheduleBatch::new(reqs)), &mut cache).unwrap_err();
    assert_eq!(
        failure.error,
        KvError::OutOfMemory(OutOfMemory {
            requested: 112,
            available: 64,
            evictable: 0
        })
    );
    assert_eq!(cache.available_size(), before_free);
    assert_eq!(cache.req_to_token().available_size(), 8, "no row kept");
    let batch = failure.batch.cancel();
    assert!(!batch.reqs()[0].kv().holds_kv());
    cache.check(batch.reqs()).unwrap();
}

#[test]
fn chunked_prefill_moves_protected_up_between_chunks() {
    let page_size = 4;
    let mut cache = cache(1024, page_size, true);
    let mut reqs = vec![Req::new(1, (0..30).collect())];
    init_next_round_input(&mut reqs[0], &mut cache, 10).unwrap();
    let mut batch =
        alloc_for_extend(prepare_for_extend(ScheduleBatch::new(reqs)), &mut cache).unwrap();
    assert_eq!(batch.reqs()[0].kv().kv_committed_len(), 10);
    cache_unfinished_req(&mut batch.reqs_mut()[0], &mut cache).unwrap();
    assert_eq!(batch.reqs()[0].kv().cache_protected_len(), 8);
    assert_eq!(
        batch.reqs()[0].prefix_len(),
        10,
        "the unaligned tail stays the request's own"
    );
    cache.check(batch.reqs()).unwrap();
    let mut reqs = batch.into_reqs();
    init_next_round_input(&mut reqs[0], &mut cache, 10).unwrap();
    let batch = alloc_for_extend(prepare_for_extend(ScheduleBatch::new(reqs)), &mut cache).unwrap();
    assert_eq!(batch.reqs()[0].kv().kv_committed_len(), 20);
    cache.check(batch.reqs()).unwrap();
    release_all(batch, &mut cache, true);
}

#[test]
fn speculative_reserve_then_commit_and_release_over_allocation() {
    let page_size = 4;
    let mut cache = cache(1024, page_size, true);
    let mut batch = extend(vec![Req::new(1, (0..9).collect())], &mut cache);
    let prepared = prepare_for_spec_decode(batch, &cache, 6)
        .map_err(|(_, e)| e)
        .unwrap();
    batch = alloc_for_spec_decode(prepared, &mut cache)
        .map_err(|f| f.error)
        .unwrap();
    let kv = batch.reqs()[0].kv();
    assert_eq!(kv.kv_committed_len(), 9);
    assert_eq!(kv.kv_allocated_len(), 16, "ceil_align(9 + 6, 4)");
    cache.check(batch.reqs()).unwrap();
    assert!(matches!(
        commit_spec_tokens(&mut batch, &[8]),
        Err(KvError::CommitBeyondAllocation { .. })
    ));
    commit_spec_tokens(&mut batch, &[3]).unwrap();
    assert_eq!(batch.reqs()[0].kv().kv_committed_len(), 12);
    cache.check(batch.reqs()).unwrap();
    release_all(batch, &mut cache, false);
    assert_eq!(cache.available_size(), cache.allocator().capacity());
}

#[test]
fn retraction_frees_until_the_next_step_fits() {
    let page_size = 4;
    let mut cache = cache(48, page_size, false);
    let reqs: Vec<Req> = (0..3).map(|i| Req::new(i, (0..16).collect())).collect();
    let mut batch = extend(reqs, &mut cache);
    assert_eq!(cache.available_size(), 0);
    let outcome = retract_decode(&mut batch, &mut cache, None).unwrap();
    assert_eq!(outcome.retracted.len(), 1);
    assert!(outcome.aborted.is_empty());
    assert_eq!(batch.len(), 2);
    let retracted = &outcome.retracted[0];
    assert!(!retracted.kv().holds_kv());
    assert_eq!(retracted.retraction_count, 1);
    assert_eq!(retracted.kv().decode_batch_idx(), 0);
    cache.check(batch.reqs()).unwrap();
    let batch = decode(batch, &mut cache);
    cache.check(batch.reqs()).unwrap();
    release_all(batch, &mut cache, false);
    assert_eq!(cache.available_size(), cache.allocator().capacity());
}

#[test]
fn double_release_is_a_typed_error() {
    let mut cache = cache(256, 4, false);
    let batch = extend(vec![Req::new(7, vec![1, 2, 3])], &mut cache);
    let mut req = batch.into_reqs().pop().unwrap();
    release_kv_cache(&mut req, &mut cache, false).unwrap();
    assert_eq!(
        release_kv_cache(&mut req, &mut cache, false),
        Err(KvError::NotHeld { rid: 7 })
    );
    cache.check([&req]).unwrap();
}

#[test]
fn registering_a_prefix_another_request_cached_first_frees_the_duplicates() {
    let page_size = 4;
    let mut cache = cache(1024, page_size, true);
    let prompt: Vec<u32> = (100..121).collect();
    let mut batch = extend(
        vec![Req::new(1, prompt.clone()), Req::new(2, prompt)],
        &mut cache,
    );
    cache_unfinished_req(&mut batch.reqs_mut()[0], &mut cache).unwrap();
    let free_before = cache.available_size();
    cache_unfinished_req(&mut batch.reqs_mut()[1], &mut cache).unwrap();
    assert_eq!(
        cache.available_size() - free_before,
        20,
        "five duplicate pages freed"
    );
    let rows: Vec<Vec<u32>> = batch
        .reqs()
        .iter()
        .map(|req| cache.req_to_token().row(req.held_row().unwrap()).unwrap()[..20].to_vec())
        .collect();
    assert_eq!(
        rows[0], rows[1],
        "the second row now points at the cached slots"
    );
    assert_eq!(batch.reqs()[1].kv().cache_protected_len(), 20);
    cache.check(batch.reqs()).unwrap();
    release_all(batch, &mut cache, true);
}

/// Each request's `cache_protected_len`, in batch order.
fn protected_lens(batch: &ScheduleBatch) -> Vec<usize> {
    batch
        .reqs()
        .iter()
        .map(|req| req.kv().cache_protected_len())
        .collect()
}

#[test]
fn requests_share_prefixes_only_within_their_namespace() {
    let page_size = 4;
    let mut cache = cache(1024, page_size, true);
    let (adapter_a, adapter_b) = (Namespace(1), Namespace(2));
    let prompt: Vec<u32> = (100..121).collect();
    // Two requests of one prompt in two namespaces register their pages as a chunked prefill
    // would: neither finds the other's, so neither frees a duplicate.
    let mut batch = extend(
        vec![
            Req::new_in(adapter_a, 1, prompt.clone()),
            Req::new_in(adapter_b, 2, prompt.clone()),
        ],
        &mut cache,
    );
    let free_before = cache.available_size();
    for req in batch.reqs_mut() {
        cache_unfinished_req(req, &mut cache).unwrap();
        assert_eq!(req.kv().cache_protected_len(), 20);
    }
    assert_eq!(
        cache.available_size(),
        free_before,
        "no duplicates across namespaces"
    );
    assert_eq!(
        cache.tree().protected_size(),
        40,
        "each namespace caches its own five pages"
    );
    cache.check(batch.reqs()).unwrap();
    release_all(batch, &mut cache, true);

    // A later request matches its own namespace's prefix, and nothing elsewhere.
    let later = |rid, namespace| Req::new_in(namespace, rid, prompt.clone());
    let batch = extend(
        vec![
            later(3, adapter_a),
            later(4, adapter_b),
            later(5, Namespace::DEFAULT),
            Req::new(6, prompt.clone()),
        ],
        &mut cache,
    );
    assert_eq!(protected_lens(&batch), [20, 20, 0, 0]);
    let rows: Vec<Vec<u32>> = batch.reqs()[..2]
        .iter()
        .map(|req| cache.req_to_token().row(req.held_row().unwrap()).unwrap()[..20].to_vec())
        .collect();
    assert_ne!(rows[0], rows[1], "each reads its own namespace's KV");
    assert_eq!(batch.reqs()[0].namespace(), adapter_a);
    assert_eq!(batch.reqs()[3].namespace(), Namespace::DEFAULT);
    cache.check(batch.reqs()).unwrap();
    release_all(batch, &mut cache, true);

    // A request that matched nothing and registered nothing is cached on release in its
    // namespace too.
    let other: Vec<u32> = (300..321).collect();
    let batch = extend(vec![Req::new_in(adapter_b, 7, other.clone())], &mut cache);
    release_all(batch, &mut cache, true);
    let batch = extend(
        vec![
            Req::new_in(adapter_b, 8, other.clone()),
            Req::new_in(adapter_a, 9, other),
        ],
        &mut cache,
    );
    assert_eq!(protected_lens(&batch), [20, 0]);
    release_all(batch, &mut cache, true);
    let capacity = cache.allocator().capacity();
    cache.evict_shortfall(capacity).unwrap();
    assert_eq!(
        cache.available_size(),
        capacity,
        "every namespace's pages come back"
    );
}

/// Every `out_cache_loc` slot is the row slot of the position `out_positions` gives it.
fn assert_out_positions_match_rows(batch: &ScheduleBatch, cache: &KvCache<PagedAllocator>) {
    let mut slots = batch.out_cache_loc().iter();
    for (req, positions) in batch.out_positions() {
        let row = cache.req_to_token().row(req.held_row().unwrap()).unwrap();
        for position in positions {
            assert_eq!(Some(&row[position]), slots.next(), "request {}", req.rid());
        }
    }
    assert_eq!(slots.next(), None, "every slot has a position");
}

#[test]
fn out_positions_give_each_new_slot_its_row_position() {
    let page_size = 4;
    let mut cache = cache(1024, page_size, true);
    let shared: Vec<u32> = (0..12).collect();
    let first = extend(
        vec![Req::new(1, [shared.clone(), vec![7]].concat())],
        &mut cache,
    );
    release_all(first, &mut cache, true);
    let mut batch = extend(
        vec![
            Req::new(2, [shared, vec![8, 9]].concat()),
            Req::new(3, vec![5, 6, 7]),
        ],
        &mut cache,
    );
    let ranges: Vec<_> = batch.out_positions().map(|(_, range)| range).collect();
    assert_eq!(
        ranges,
        [12..14, 0..3],
        "the prefix hit starts past the cached pages"
    );
    assert_out_positions_match_rows(&batch, &cache);

    batch = decode(batch, &mut cache);
    let ranges: Vec<_> = batch.out_positions().map(|(_, range)| range).collect();
    assert_eq!(ranges, [14..15, 3..4]);
    assert_out_positions_match_rows(&batch, &cache);

    let finished = batch.take_if(|req| req.rid() == 3);
    assert!(batch.out_cache_loc().is_empty() && batch.out_positions().next().is_none());
    let mut reqs = batch.into_reqs();
    reqs.extend(finished);
    for req in &mut reqs {
        release_kv_cache(req, &mut cache, false).unwrap();
    }
    cache.check(&reqs).unwrap();
}

#[test]
fn a_recycled_out_cache_loc_buffer_keeps_its_storage_and_none_of_its_slots() {
    let mut cache = cache(256, 4, false);
    let first = extend(vec![Req::new(1, (0..40).collect())], &mut cache);
    let (reqs, buffer) = first.into_parts();
    assert_eq!(
        buffer.len(),
        40,
        "into_parts hands back the last out_cache_loc"
    );
    let capacity = buffer.capacity();
    let mut second = vec![Req::new(2, (100..110).collect())];
    init_next_round_input(&mut second[0], &mut cache, usize::MAX).unwrap();
    let batch = ScheduleBatch::with_buffer(second, buffer);
    assert!(
        batch.out_cache_loc().is_empty(),
        "the old slots are dropped"
    );
    let batch = alloc_for_extend(prepare_for_extend(batch), &mut cache)
        .map_err(|f| f.error)
        .unwrap();
    assert_eq!(batch.out_cache_loc().len(), 10);
    let (more, buffer) = batch.into_parts();
    assert_eq!(buffer.capacity(), capacity, "no new allocation");
    release_all(
        ScheduleBatch::new(reqs.into_iter().chain(more).collect()),
        &mut cache,
        false,
    );
    assert_eq!(cache.available_size(), cache.allocator().capacity());
}

/// `take_if` keeps both orders and calls the predicate once per request in order, whether it
/// takes a few requests (one bulk move each) or many (one pass).
#[test]
fn take_if_keeps_batch_order_for_few_and_many_finished() {
    for finished_every in [7, 2] {
        let reqs: Vec<Req> = (0..40).map(|rid| Req::new(rid, vec![1, 2, 3])).collect();
        let mut batch = ScheduleBatch::new(reqs);
        let mut seen = Vec::new();
        let taken = batch.take_if(|req| {
            seen.push(req.rid());
            req.rid() % finished_every == 0
        });
        let rids = |reqs: &[Req]| reqs.iter().map(Req::rid).collect::<Vec<_>>();
        assert_eq!(
            seen,
            (0..40).collect::<Vec<_>>(),
            "one call per request, in order"
        );
        assert_eq!(
            rids(&taken),
            (0..40)
                .filter(|rid| rid % finished_every == 0)
                .collect::<Vec<_>>()
        );
        assert_eq!(
            rids(batch.reqs()),
            (0..40)
                .filter(|rid| rid % finished_every != 0)
                .collect::<Vec<_>>()
        );
    }
}

/// The scheduler's state is plain data: a cache, its requests and a batch in any state can be
/// moved to (or shared with) another thread, as a scheduler thread that owns them needs.
#[test]
fn the_scheduler_state_moves_between_threads() {
    fn send_and_sync<T: Send + Sync>() {}
    send_and_sync::<KvCache<PagedAllocator>>();
    send_and_sync::<Req>();
    send_and_sync::<ScheduleBatch>();
    send_and_sync::<ScheduleBatch<kvown_runtime::batch::DecodePrepared>>();
    send_and_sync::<KvError>();
    send_and_sync::<kvown_runtime::check::Violation>();

    let mut cache = cache(64, 4, true);
    let batch = extend(vec![Req::new(1, (0..6).collect())], &mut cache);
    let (cache, batch) = std::thread::spawn(move || {
        let mut cache = cache;
        let prepared = prepare_for_decode(batch, &cache)
            .map_err(|(_, e)| e)
            .unwrap();
        let batch = alloc_for_decode(prepared, &mut cache)
            .map_err(|failure| failure.error)
            .unwrap();
        (cache, batch)
    })
    .join()
    .unwrap();
    assert_eq!(batch.reqs()[0].kv().kv_committed_len(), 7);
    cache.check(batch.reqs()).unwrap();
}
