//! Unit tests of the request bookkeeping against sglang's rules (`mem_cache/allocation.py`,
//! `managers/schedule_batch.py`, `mem_cache/radix_cache.py`) and their edge cases: row contents after extend and decode, release accounting, the next-decode memory
//! formulas, retraction order and end state, speculative reservation, chunked prefill at page
//! size > 1, release between match and allocation, and errors that change nothing.

use kvown_runtime::alloc::{AllocError, KvAllocator, KvSlot, PagedAllocator, ceil_align};
use kvown_runtime::batch::Req;
use kvown_runtime::batch::{
    ScheduleBatch, alloc_for_decode, alloc_for_extend, alloc_for_spec_decode, check_decode_mem,
    commit_spec_tokens, new_tokens_required_next_decode, prepare_for_decode, prepare_for_extend,
    prepare_for_spec_decode, release_kv_cache, reset_for_retract, retract_decode,
};
use kvown_runtime::batch::{cache_unfinished_req, init_next_round_input};
use kvown_runtime::cache::{KvCache, TreeCache};
use kvown_runtime::check::Violation;
use kvown_runtime::check::{ReclaimError, reclaim_leaks};
use kvown_runtime::error::KvError;
use kvown_runtime::radix::{RadixCache, TreePos};
use kvown_runtime::slots::ReqToTokenPool;

type Cache = KvCache<PagedAllocator>;

fn cache(pool_tokens: usize, page_size: usize, radix: bool) -> Cache {
    cache_with(pool_tokens, page_size, radix, 8, 256)
}

fn cache_with(
    pool_tokens: usize,
    page_size: usize,
    radix: bool,
    rows: usize,
    width: usize,
) -> Cache {
    let allocator = PagedAllocator::new(pool_tokens, page_size, false).unwrap();
    let tree = if radix {
        TreeCache::Radix(RadixCache::new(page_size))
    } else {
        TreeCache::Disabled
    };
    KvCache::new(allocator, ReqToTokenPool::new(rows, width).unwrap(), tree).unwrap()
}

fn extend_chunked(reqs: Vec<Req>, cache: &mut Cache, chunk: usize) -> ScheduleBatch {
    let mut reqs = reqs;
    for req in &mut reqs {
        init_next_round_input(req, cache, chunk).unwrap();
    }
    alloc_for_extend(prepare_for_extend(ScheduleBatch::new(reqs)), cache)
        .map_err(|f| f.error)
        .unwrap()
}

fn extend(reqs: Vec<Req>, cache: &mut Cache) -> ScheduleBatch {
    extend_chunked(reqs, cache, usize::MAX)
}

fn decode(batch: ScheduleBatch, cache: &mut Cache) -> ScheduleBatch {
    let prepared = prepare_for_decode(batch, cache)
        .map_err(|(_, e)| e)
        .unwrap();
    alloc_for_decode(prepared, cache)
        .map_err(|f| f.error)
        .unwrap()
}

fn reserve(batch: ScheduleBatch, cache: &mut Cache, reserve: usize) -> ScheduleBatch {
    let prepared = prepare_for_spec_decode(batch, cache, reserve)
        .map_err(|(_, e)| e)
        .unwrap();
    alloc_for_spec_decode(prepared, cache)
        .map_err(|f| f.error)
        .unwrap()
}

fn row_of(cache: &Cache, req: &Req) -> Vec<KvSlot> {
    cache
        .req_to_token()
        .row(req.kv().req_pool_idx().unwrap())
        .unwrap()
        .to_vec()
}

fn ladder(req: &Req) -> (usize, usize, usize) {
    let kv = req.kv();
    (
        kv.cache_protected_len(),
        kv.kv_committed_len(),
        kv.kv_allocated_len(),
    )
}

fn tokens(base: u32, len: usize) -> Vec<u32> {
    (base..base + len as u32).collect()
}

/// Allocator, table and tree sizes: what an error must leave untouched.
fn state(cache: &Cache) -> (PagedAllocator, ReqToTokenPool, usize, usize, usize) {
    let tree = cache.tree();
    (
        cache.allocator().clone(),
        cache.req_to_token().clone(),
        tree.evictable_size(),
        tree.protected_size(),
        tree.radix().map_or(0, RadixCache::total_size),
    )
}

/// Releases every request that holds KV, without caching it.
fn release_held(reqs: &mut [Req], cache: &mut Cache) {
    for req in reqs.iter_mut().filter(|req| req.kv().holds_kv()) {
        release_kv_cache(req, cache, false).unwrap();
    }
}

fn empty_out(mut cache: Cache) {
    cache.check(std::iter::empty()).unwrap();
    assert_eq!(cache.tree().protected_size(), 0);
    let capacity = cache.allocator().capacity();
    cache.evict_shortfall(capacity + 1).unwrap();
    assert_eq!(cache.available_size(), capacity);
}

/// Checks `cache` with every request that holds KV in it (`all`), releases them, and
/// [`empty_out`]s it.
fn release_all_and_empty_out(mut all: Vec<Req>, mut cache: Cache) {
    cache.check(&all).unwrap();
    for req in &mut all {
        release_kv_cache(req, &mut cache, false).unwrap();
    }
    empty_out(cache);
}

// sglang `write_cache_indices`: row[0:prefix] == prefix slots, row[prefix:seq] == the request's out_cache_loc segment.
#[test]
fn extend_writes_prefix_then_new_slots_into_the_row() {
    let page_size = 4;
    let mut cache = cache(256, page_size, true);
    let shared = tokens(0, 16);
    let first = extend(
        vec![Req::new(1, [shared.clone(), vec![90, 91]].concat())],
        &mut cache,
    );
    let cached_slots = row_of(&cache, &first.reqs()[0])[..16].to_vec();
    let mut req = first.into_reqs().pop().unwrap();
    release_kv_cache(&mut req, &mut cache, true).unwrap();

    let reqs = vec![
        Req::new(2, tokens(500, 7)),
        Req::new(3, [shared.clone(), vec![60, 61, 62]].concat()),
        Req::new(4, [shared[..9].to_vec(), vec![70]].concat()),
    ];
    let batch = extend(reqs, &mut cache);
    cache.check(batch.reqs()).unwrap();
    let out = batch.out_cache_loc();
    let expected_prefix = [0, 16, 8];
    let expected_seq = [7, 19, 10];
    assert_eq!(
        out.len(),
        7 + 3 + 2,
        "len(out_cache_loc) == sum of extend lens"
    );
    let mut offset = 0;
    for (i, req) in batch.reqs().iter().enumerate() {
        let (prefix, seq) = (expected_prefix[i], expected_seq[i]);
        assert_eq!(
            req.prefix_len(),
            seq,
            "a held request continues from committed"
        );
        assert_eq!(ladder(req), (prefix, seq, seq));
        let row = row_of(&cache, req);
        assert_eq!(&row[..prefix], &cached_slots[..prefix]);
        assert_eq!(&row[prefix..seq], &out[offset..offset + seq - prefix]);
        offset += seq - prefix;
    }
    for mut req in batch.into_reqs() {
        release_kv_cache(&mut req, &mut cache, true).unwrap();
    }
    empty_out(cache);
}

// sglang `alloc_for_decode`: decode writes row[seq_old]; a new page only when the new token opens one.
#[test]
fn decode_writes_the_old_length_and_opens_pages_only_at_boundaries() {
    let page_size = 4;
    let mut cache = cache(256, page_size, false);
    let lens = [4, 5, 7, 8];
    let reqs = lens
        .iter()
        .enumerate()
        .map(|(i, &len)| Req::new(i as u64, tokens(100 * i as u32, len)))
        .collect();
    let mut batch = extend(reqs, &mut cache);
    let before = cache.available_size();
    let rows_before: Vec<Vec<KvSlot>> = batch.reqs().iter().map(|r| row_of(&cache, r)).collect();
    for req in batch.reqs_mut() {
        req.push_output(1);
    }
    assert_eq!(
        new_tokens_required_next_decode(batch.reqs(), page_size, None),
        2 * page_size,
        "only lengths 4 and 8 open a page"
    );
    batch = decode(batch, &mut cache);
    assert_eq!(before - cache.available_size(), 2 * page_size);
    let out = batch.out_cache_loc().to_vec();
    for (i, req) in batch.reqs().iter().enumerate() {
        let old = lens[i];
        let row = row_of(&cache, req);
        assert_eq!(row[old], out[i]);
        assert_eq!(&row[..old], &rows_before[i][..old]);
        assert_eq!(ladder(req), (0, old + 1, old + 1));
        if old % page_size == 0 {
            assert_eq!(out[i] as usize % page_size, 0);
        } else {
            assert_eq!(out[i], row[old - 1] + 1);
        }
    }
    release_all_and_empty_out(batch.into_reqs(), cache);
}

// sglang `release_kv_cache` / `cache_finished_req`: release frees [protected, ceil_align(allocated)) minus what the tree took over.
#[test]
fn release_frees_the_owned_range_minus_the_tree_take() {
    let page_size = 4;
    // Radix off: everything the request owns comes back.
    let mut plain = cache(256, page_size, false);
    let mut req = extend(vec![Req::new(1, tokens(0, 10))], &mut plain)
        .into_reqs()
        .pop()
        .unwrap();
    let before = plain.available_size();
    release_kv_cache(&mut req, &mut plain, true).unwrap();
    assert_eq!(plain.available_size() - before, 12);
    empty_out(plain);

    let mut cache = cache(256, page_size, true);
    let prompt = tokens(0, 10);
    // Two identical prompts at once: neither matches, both own all their pages.
    let batch = extend(
        vec![Req::new(1, prompt.clone()), Req::new(2, prompt.clone())],
        &mut cache,
    );
    let mut reqs = batch.into_reqs();
    let before = cache.available_size();
    release_kv_cache(&mut reqs[0], &mut cache, true).unwrap();
    // The tree takes [0, 8); the unaligned tail's page (8..12) is freed.
    assert_eq!(cache.available_size() - before, 4);
    assert_eq!(cache.tree().radix().unwrap().total_size(), 8);
    let before = cache.available_size();
    release_kv_cache(&mut reqs[1], &mut cache, true).unwrap();
    // Its [0, 8) duplicates the tree: freed with the tail.
    assert_eq!(cache.available_size() - before, 12);
    assert_eq!(cache.tree().radix().unwrap().total_size(), 8);
    cache.check(&reqs).unwrap();

    // A request with a protected prefix: the tree's [0, 8) is untouched, its lock dropped once.
    let mut req = extend(
        vec![Req::new(3, [prompt[..8].to_vec(), tokens(900, 6)].concat())],
        &mut cache,
    )
    .into_reqs()
    .pop()
    .unwrap();
    assert_eq!(ladder(&req), (8, 14, 14));
    assert_eq!(cache.tree().protected_size(), 8);
    // Locked, the cached prefix is not counted as room.
    assert_eq!(cache.available_with_eviction(), cache.available_size());
    let before = cache.available_size();
    release_kv_cache(&mut req, &mut cache, false).unwrap();
    assert_eq!(cache.available_size() - before, ceil_align(14, 4) - 8);
    assert_eq!(cache.tree().protected_size(), 0);
    assert_eq!(cache.tree().evictable_size(), 8);
    assert_eq!(cache.available_with_eviction(), cache.available_size() + 8);
    assert_eq!(
        release_kv_cache(&mut req, &mut cache, false),
        Err(KvError::NotHeld { rid: 3 })
    );
    empty_out(cache);
}

// `new_tokens_required_next_decode` (kvown's count, not sglang's): ps × (requests with committed % ps == 0); page size 1: the request count.
// Spec: Σ ceil_align(alloc + max(0, committed + reserve − alloc)) − ceil_align(alloc).
#[test]
fn new_tokens_required_next_decode_formulas() {
    for page_size in [1, 4] {
        let mut cache = cache(512, page_size, false);
        let reqs = [3, 4, 5, 8, 12]
            .iter()
            .map(|&len| Req::new(len as u64, tokens(0, len)))
            .collect();
        let batch = extend(reqs, &mut cache);
        let expected = if page_size == 1 { 5 } else { 3 * 4 };
        assert_eq!(
            new_tokens_required_next_decode(batch.reqs(), page_size, None),
            expected
        );
        for mut req in batch.into_reqs() {
            release_kv_cache(&mut req, &mut cache, false).unwrap();
        }
    }

    let page_size = 4;
    let spec = |committed: usize, allocated: usize, reserve: usize| {
        let x = (committed + reserve).saturating_sub(allocated);
        ceil_align(allocated + x, page_size) - ceil_align(allocated, page_size)
    };
    let mut cache = cache(512, page_size, false);
    let mut batch = extend(
        vec![Req::new(1, tokens(0, 9)), Req::new(2, tokens(50, 16))],
        &mut cache,
    );
    // committed == allocated: 9 + 6 -> 16 (one page over 12), 16 + 6 -> 24 (two pages).
    assert_eq!(spec(9, 9, 6) + spec(16, 16, 6), 4 + 8);
    assert_eq!(
        new_tokens_required_next_decode(batch.reqs(), page_size, Some(6)),
        12
    );
    batch = reserve(batch, &mut cache, 6);
    assert_eq!(ladder(&batch.reqs()[0]), (0, 9, 16));
    assert_eq!(ladder(&batch.reqs()[1]), (0, 16, 24));
    assert_eq!(
        new_tokens_required_next_decode(batch.reqs(), page_size, Some(6)),
        0,
        "the reservation already covers the next step"
    );
    commit_spec_tokens(&mut batch, &[3, 1]).unwrap();
    // (12, 16): 12 + 6 = 18 -> 20, one page; (17, 24): 23 <= 24, nothing.
    assert_eq!(spec(12, 16, 6) + spec(17, 24, 6), 4);
    assert_eq!(
        new_tokens_required_next_decode(batch.reqs(), page_size, Some(6)),
        4
    );
    release_all_and_empty_out(batch.into_reqs(), cache);
}

// The count is a plain function of its arguments: a page size no pool has makes the total
// saturate (as an overflowing reservation does), not overflow (a debug panic).
#[test]
fn new_tokens_required_next_decode_saturates_instead_of_overflowing() {
    let reqs = [Req::new(1, tokens(0, 3)), Req::new(2, tokens(0, 3))];
    assert_eq!(
        new_tokens_required_next_decode(&reqs, usize::MAX, None),
        usize::MAX
    );
    assert_eq!(
        new_tokens_required_next_decode(&reqs, 4, Some(usize::MAX)),
        usize::MAX
    );
}

// "# Panics If `page_size` is 0": for any batch, the empty one too (it used to return 0 for
// an empty batch, so a caller passing 0 found out only once a request came).
#[test]
fn new_tokens_required_next_decode_panics_on_page_size_zero_for_any_batch() {
    let one = [Req::new(1, tokens(0, 3))];
    for spec_reserve in [None, Some(2)] {
        for reqs in [&one[..], &[]] {
            let count =
                std::panic::catch_unwind(|| new_tokens_required_next_decode(reqs, 0, spec_reserve));
            assert!(
                count.is_err(),
                "{} requests, {spec_reserve:?}: {count:?}",
                reqs.len()
            );
        }
    }
}

// sglang `check_decode_mem`: it evicts only the shortfall.
#[test]
fn check_decode_mem_evicts_only_the_shortfall() {
    let page_size = 4;
    let mut cache = cache(64, page_size, true);
    // Four cached prompts of two pages each: 32 evictable, 32 free.
    for i in 0..4 {
        let mut req = extend(vec![Req::new(i, tokens(100 * i as u32, 9))], &mut cache)
            .into_reqs()
            .pop()
            .unwrap();
        release_kv_cache(&mut req, &mut cache, true).unwrap();
    }
    assert_eq!(cache.tree().evictable_size(), 32);
    // Four new requests of 12 tokens need 48: the 16 missing are evicted, no more.
    let batch = extend(
        (10..14)
            .map(|i| Req::new(i, tokens(1000 * i as u32, 12)))
            .collect(),
        &mut cache,
    );
    assert_eq!(cache.available_size(), 0);
    assert_eq!(
        cache.tree().evictable_size(),
        16,
        "evicted exactly the shortfall"
    );
    cache.check(batch.reqs()).unwrap();
    let mut reqs = batch.into_reqs();
    for req in &mut reqs[..2] {
        release_kv_cache(req, &mut cache, true).unwrap();
    }
    assert_eq!(cache.tree().evictable_size(), 40);
    assert_eq!(cache.available_size(), 0);
    // The two left sit at a page boundary: the next step needs 8.
    assert_eq!(
        new_tokens_required_next_decode(&reqs[2..], page_size, None),
        8
    );
    assert!(check_decode_mem(&reqs[2..], &mut cache, None).unwrap());
    assert_eq!(cache.available_size(), 8, "only the shortfall was evicted");
    assert_eq!(cache.tree().evictable_size(), 32);
    assert!(check_decode_mem(&reqs[2..], &mut cache, None).unwrap());
    assert_eq!(
        cache.tree().evictable_size(),
        32,
        "nothing evicted when it fits"
    );
    cache.check(&reqs).unwrap();
    for req in &mut reqs[2..] {
        release_kv_cache(req, &mut cache, false).unwrap();
    }
    empty_out(cache);
}

// sglang `retract_decode`: fewest outputs first, longest prompt first among equals; retracted requests end
// with no row, committed = protected = 0, both clocks 0, retraction_count + 1; nothing is
// inserted into the tree.
#[test]
fn retraction_order_and_end_state() {
    let page_size = 4;
    // Prompts 6, 8, 4, 3 and outputs 2, 0, 0, 1 -> order: rid 2 (0 out, prompt 8), rid 3
    // (0, 4), rid 4 (1, 3), rid 1 (2, 6).
    let mut cache = cache(48, page_size, true);
    let reqs = vec![
        Req::new(1, tokens(0, 6)),
        Req::new(2, tokens(100, 8)),
        Req::new(3, tokens(200, 4)),
        Req::new(4, tokens(300, 3)),
    ];
    let mut batch = extend(reqs, &mut cache);
    // Decode rid 1 twice and rid 4 once so the output counts differ.
    for (rid, outputs) in [(1, 2), (4, 1)] {
        let mut one = ScheduleBatch::new(batch.take_if(|r| r.rid() == rid));
        for _ in 0..outputs {
            one.reqs_mut()[0].push_output(7);
            one = decode(one, &mut cache);
        }
        batch.extend_reqs(one.into_reqs());
    }
    let lens: Vec<(u64, usize, usize)> = batch
        .reqs()
        .iter()
        .map(|r| (r.rid(), r.output_ids().len(), r.origin_input_ids().len()))
        .collect();
    assert!(lens.contains(&(1, 2, 6)) && lens.contains(&(4, 1, 3)));
    for req in batch.reqs_mut() {
        req.push_output(8);
    }
    // Fill the pool so several retractions are needed.
    let free = cache.available_size();
    let filler = extend(vec![Req::new(99, tokens(5000, free))], &mut cache);
    assert_eq!(cache.available_size(), 0);
    let tree_total = cache.tree().radix().unwrap().total_size();
    // Lengths 8, 8, 4, 4 all open a page (16 needed): retracting rid 2 frees 8 (12 still
    // needed), rid 3 frees 4 more (8 needed, 12 free): two retractions.
    let outcome = retract_decode(&mut batch, &mut cache, None).unwrap();
    let order: Vec<u64> = outcome.retracted.iter().map(Req::rid).collect();
    assert_eq!(order, [2, 3]);
    assert_eq!(order[..], [2, 3, 4, 1][..order.len()]);
    assert!(!batch.is_empty() || outcome.aborted.len() == 1);
    assert_eq!(cache.tree().radix().unwrap().total_size(), tree_total);
    for req in &outcome.retracted {
        let kv = req.kv();
        assert!(!kv.holds_kv());
        assert_eq!(ladder(req), (0, 0, 0));
        assert_eq!((kv.extend_batch_idx(), kv.decode_batch_idx()), (0, 0));
        assert_eq!(req.retraction_count, 1);
        assert!(req.is_retracted);
        assert_eq!(req.last_node(), TreePos::ROOT);
    }
    let mut all: Vec<Req> = filler.into_reqs();
    all.extend(batch.into_reqs());
    cache.check(&all).unwrap();
    for req in &mut all {
        release_kv_cache(req, &mut cache, false).unwrap();
    }

    // Re-admitting a retracted request runs it again (sglang clears is_retracted at extend).
    let readmitted = extend(outcome.retracted, &mut cache);
    for req in readmitted.reqs() {
        assert!(!req.is_retracted);
        assert_eq!(req.retraction_count, 1);
        assert_eq!(req.kv().kv_committed_len(), req.fill_ids().len());
    }
    release_all_and_empty_out(readmitted.into_reqs(), cache);
}

// sglang `retract_decode`: keeps at least one; aborts the last one when even it does not fit.
#[test]
fn retraction_keeps_one_and_aborts_the_last_when_it_cannot_fit() {
    let page_size = 4;
    let mut cache = cache(32, page_size, false);
    // Two requests filling the pool, each at a page boundary: the next step needs two pages.
    let mut batch = extend(
        vec![Req::new(1, tokens(0, 16)), Req::new(2, tokens(100, 16))],
        &mut cache,
    );
    assert_eq!(cache.available_size(), 0);
    let outcome = retract_decode(&mut batch, &mut cache, None).unwrap();
    // Retracting one frees 16, enough for the other's page: one retracted, one kept.
    assert_eq!(outcome.retracted.len(), 1);
    assert!(outcome.aborted.is_empty());
    assert_eq!(batch.len(), 1);

    // A lone request that fits is kept, not retracted (regression: it used to be retracted,
    // leaving an empty batch).
    let outcome = retract_decode(&mut batch, &mut cache, None).unwrap();
    assert!(outcome.retracted.is_empty() && outcome.aborted.is_empty());
    assert_eq!(batch.len(), 1);

    // A lone request that cannot fit is aborted (released), not retracted.
    let filler = extend(vec![Req::new(9, tokens(900, 16))], &mut cache);
    assert_eq!(cache.available_size(), 0);
    let outcome = retract_decode(&mut batch, &mut cache, None).unwrap();
    assert!(
        outcome.retracted.is_empty(),
        "the last request is never retracted"
    );
    assert_eq!(outcome.aborted.len(), 1);
    let aborted = &outcome.aborted[0];
    assert!(!aborted.kv().holds_kv());
    assert_eq!(aborted.retraction_count, 0);
    assert!(batch.is_empty());
    release_all_and_empty_out(filler.into_reqs(), cache);
}

// A request that holds no KV fails the retraction before anything is released: the batch
// keeps every request in its order and the cache is untouched (it used to be released first,
// failing half-way and dropping the rest of the batch with their KV).
#[test]
fn retraction_refuses_a_request_without_kv_and_changes_nothing() {
    let page_size = 4;
    let mut cache = cache(32, page_size, false);
    let mut batch = extend(
        vec![Req::new(1, tokens(0, 16)), Req::new(2, tokens(100, 12))],
        &mut cache,
    );
    let filler = extend(vec![Req::new(9, tokens(900, 4))], &mut cache);
    assert_eq!(cache.available_size(), 0);
    // No outputs and the longest prompt: the first to retract.
    batch.extend_reqs([Req::new(3, tokens(200, 20))]);
    let before = state(&cache);
    let error = retract_decode(&mut batch, &mut cache, None).unwrap_err();
    assert!(matches!(error, KvError::NotHeld { rid: 3 }), "{error}");
    let rids: Vec<u64> = batch.reqs().iter().map(Req::rid).collect();
    assert_eq!(rids, [1, 2, 3]);
    assert_eq!(state(&cache), before);
    assert_eq!(ladder(&batch.reqs()[0]), (0, 16, 16));

    let mut all: Vec<Req> = batch.take_if(|req| req.kv().holds_kv());
    all.extend(filler.into_reqs());
    release_all_and_empty_out(all, cache);
}

// A retraction that removes requests clears the batch's `out_cache_loc` (it described the
// requests before); one that removes none keeps it.
#[test]
fn retraction_clears_out_cache_loc_only_when_it_removes_requests() {
    let page_size = 4;
    let mut cache = cache(40, page_size, false);
    let mut batch = extend(
        vec![Req::new(1, tokens(0, 15)), Req::new(2, tokens(100, 15))],
        &mut cache,
    );
    batch = decode(batch, &mut cache);
    assert_eq!(batch.out_cache_loc().len(), 2);
    // A batch of two always gives one up.
    let outcome = retract_decode(&mut batch, &mut cache, None).unwrap();
    assert_eq!(outcome.retracted.len(), 1);
    assert!(batch.out_cache_loc().is_empty());
    assert_eq!(batch.out_positions().count(), 0);
    // A lone request that fits is kept, and so is its `out_cache_loc`.
    batch = decode(batch, &mut cache);
    let out = batch.out_cache_loc().to_vec();
    assert_eq!(out.len(), 1);
    let outcome = retract_decode(&mut batch, &mut cache, None).unwrap();
    assert!(outcome.retracted.is_empty() && outcome.aborted.is_empty());
    assert_eq!(batch.out_cache_loc(), out);

    release_all_and_empty_out(batch.into_reqs(), cache);
}

// `out_cache_loc` and `out_positions` pair slots with requests by their place in the batch, and
// `reqs_mut` lets the requests be reordered: it clears them (a request used to be paired with
// another's positions after a swap).
#[test]
fn handing_out_the_requests_mutably_clears_the_last_allocations_slots() {
    let mut cache = cache(256, 4, false);
    let mut batch = extend(
        vec![Req::new(1, tokens(0, 3)), Req::new(2, tokens(100, 9))],
        &mut cache,
    );
    let positions: Vec<(u64, std::ops::Range<usize>)> = batch
        .out_positions()
        .map(|(req, range)| (req.rid(), range))
        .collect();
    assert_eq!(positions, [(1, 0..3), (2, 0..9)]);
    assert_eq!(batch.out_cache_loc().len(), 12);
    batch.reqs_mut().swap(0, 1);
    assert_eq!(batch.out_positions().count(), 0);
    assert!(batch.out_cache_loc().is_empty());
    // The next allocation describes the batch as it is then.
    let batch = decode(batch, &mut cache);
    let rids: Vec<u64> = batch.out_positions().map(|(req, _)| req.rid()).collect();
    assert_eq!(rids, [2, 1]);
    release_all_and_empty_out(batch.into_reqs(), cache);
}

// sglang `alloc_for_spec_decode`: the reservation never shrinks; zero need allocates nothing but still applies the max;
// row[cur:nxt] is filled in request order.
#[test]
fn speculative_reservation_never_shrinks_and_fills_in_request_order() {
    let page_size = 4;
    let mut cache = cache(256, page_size, false);
    let mut batch = extend(
        vec![Req::new(1, tokens(0, 5)), Req::new(2, tokens(100, 6))],
        &mut cache,
    );
    let before = cache.available_size();
    batch = reserve(batch, &mut cache, 10);
    // 5 + 10 -> 16, 6 + 10 -> 16.
    assert_eq!(ladder(&batch.reqs()[0]), (0, 5, 16));
    assert_eq!(ladder(&batch.reqs()[1]), (0, 6, 16));
    assert_eq!(before - cache.available_size(), (16 - 8) + (16 - 8));
    let first = row_of(&cache, &batch.reqs()[0]);
    let second = row_of(&cache, &batch.reqs()[1]);
    assert!(
        first[8..16].iter().max() < second[8..16].iter().min(),
        "the first request's top-up comes first from a fresh free list"
    );
    assert!(batch.out_cache_loc().is_empty());

    // A smaller reserve: zero need, nothing allocated, allocated stays at the max, clock ticks.
    let before = cache.available_size();
    let clocks: Vec<u64> = batch
        .reqs()
        .iter()
        .map(|r| r.kv().decode_batch_idx())
        .collect();
    batch = reserve(batch, &mut cache, 2);
    assert_eq!(cache.available_size(), before);
    assert_eq!(ladder(&batch.reqs()[0]), (0, 5, 16));
    assert_eq!(ladder(&batch.reqs()[1]), (0, 6, 16));
    assert_eq!(row_of(&cache, &batch.reqs()[0]), first);
    for (req, clock) in batch.reqs().iter().zip(clocks) {
        assert_eq!(req.kv().decode_batch_idx(), clock + 1);
    }
    release_all_and_empty_out(batch.into_reqs(), cache);
}

// An extend starts at the committed length: over a speculative reservation it would write new
// slots over the reserved ones, which nobody would hold any more. It is refused instead (it
// used to succeed and leak the reservation).
#[test]
fn an_extend_over_a_speculative_reservation_is_refused_and_changes_nothing() {
    let page_size = 4;
    let mut cache = cache(256, page_size, true);
    let batch = extend(vec![Req::new(1, tokens(0, 5))], &mut cache);
    let mut reqs = reserve(batch, &mut cache, 8).into_reqs();
    assert_eq!(ladder(&reqs[0]), (0, 5, 16));
    for token in 100..110 {
        reqs[0].push_output(token);
    }
    init_next_round_input(&mut reqs[0], &mut cache, usize::MAX).unwrap();
    let (before, row) = (state(&cache), row_of(&cache, &reqs[0]));
    let failure =
        alloc_for_extend(prepare_for_extend(ScheduleBatch::new(reqs)), &mut cache).unwrap_err();
    assert_eq!(
        failure.error,
        KvError::ReservationHeld {
            rid: 1,
            committed: 5,
            allocated: 16
        }
    );
    assert_eq!(state(&cache), before);
    let mut reqs = failure.batch.cancel().into_reqs();
    assert_eq!(ladder(&reqs[0]), (0, 5, 16));
    assert_eq!(row_of(&cache, &reqs[0]), row);
    release_kv_cache(&mut reqs[0], &mut cache, false).unwrap();
    empty_out(cache);
}

// The plain decode writes the new token at the allocated length and commits one more: over a
// speculative reservation that would commit positions no step wrote (and cache them as the
// prompt's KV at release). It is refused; once the reservation is all committed, a plain
// decode goes on where it ends.
#[test]
fn a_plain_decode_over_a_speculative_reservation_is_refused_and_changes_nothing() {
    let page_size = 4;
    let mut cache = cache(256, page_size, true);
    let batch = extend(vec![Req::new(1, tokens(0, 5))], &mut cache);
    let mut batch = reserve(batch, &mut cache, 8);
    commit_spec_tokens(&mut batch, &[2]).unwrap();
    assert_eq!(ladder(&batch.reqs()[0]), (0, 7, 16));
    let (before, row) = (state(&cache), row_of(&cache, &batch.reqs()[0]));
    let clock = batch.reqs()[0].kv().decode_batch_idx();
    let (batch, error) = prepare_for_decode(batch, &cache).unwrap_err();
    assert_eq!(
        error,
        KvError::ReservationHeld {
            rid: 1,
            committed: 7,
            allocated: 16
        }
    );
    assert_eq!(state(&cache), before);
    assert_eq!(ladder(&batch.reqs()[0]), (0, 7, 16));
    assert_eq!(row_of(&cache, &batch.reqs()[0]), row);
    assert_eq!(
        batch.reqs()[0].kv().decode_batch_idx(),
        clock,
        "no clock tick"
    );

    let mut batch = batch;
    commit_spec_tokens(&mut batch, &[9]).unwrap();
    assert_eq!(ladder(&batch.reqs()[0]), (0, 16, 16));
    let batch = decode(batch, &mut cache);
    assert_eq!(ladder(&batch.reqs()[0]), (0, 17, 17));
    assert_eq!(
        batch.out_cache_loc(),
        &row_of(&cache, &batch.reqs()[0])[16..17]
    );
    release_all_and_empty_out(batch.into_reqs(), cache);
}

// `prepare_for_decode` checks and ticks the clocks in one pass: a batch refused by a request
// in its middle has every clock turned back, those before the refused request included.
#[test]
fn a_decode_batch_refused_in_its_middle_keeps_every_clock() {
    let mut cache = cache(256, 4, true);
    let batch = extend(
        vec![Req::new(1, tokens(0, 5)), Req::new(2, tokens(50, 6))],
        &mut cache,
    );
    let mut reqs = decode(batch, &mut cache).into_reqs();
    // A request that holds no KV, between the two that do.
    reqs.insert(1, Req::new(3, tokens(90, 3)));
    let before = state(&cache);
    let (batch, error) = prepare_for_decode(ScheduleBatch::new(reqs), &cache).unwrap_err();
    assert_eq!(error, KvError::NotHeld { rid: 3 });
    assert_eq!(state(&cache), before);
    let clocks: Vec<(u64, u64)> = batch
        .reqs()
        .iter()
        .map(|r| (r.rid(), r.kv().decode_batch_idx()))
        .collect();
    assert_eq!(clocks, [(1, 1), (3, 0), (2, 1)], "no clock ticked");
    let mut batch = batch;
    let idle = batch.take_if(|r| r.rid() == 3);
    assert_eq!(idle.len(), 1);
    let batch = decode(batch, &mut cache);
    for req in batch.reqs() {
        assert_eq!(req.kv().decode_batch_idx(), 2);
    }
    release_all_and_empty_out(batch.into_reqs(), cache);
}

// sglang `alloc_for_spec_decode` and `cache_finished_req`: over-allocation is freed at release from ceil_align(committed).
#[test]
fn over_allocation_is_freed_from_the_committed_page_end() {
    let page_size = 4;
    let mut cache = cache(256, page_size, true);
    let mut batch = extend(vec![Req::new(1, tokens(0, 9))], &mut cache);
    batch = reserve(batch, &mut cache, 10);
    assert_eq!(ladder(&batch.reqs()[0]), (0, 9, 20));
    commit_spec_tokens(&mut batch, &[2]).unwrap();
    for _ in 0..2 {
        batch.reqs_mut()[0].push_output(5);
    }
    let row = row_of(&cache, &batch.reqs()[0]);
    let mut req = batch.into_reqs().pop().unwrap();
    let before = cache.available_size();
    release_kv_cache(&mut req, &mut cache, true).unwrap();
    // Tree takes [0, 8); [8, 11) goes with the tree's tail free (page 8..12); the
    // over-allocation [12, 20) is freed separately.
    assert_eq!(cache.tree().radix().unwrap().total_size(), 8);
    assert_eq!(cache.available_size() - before, 20 - 8);
    for position in [8, 12, 16] {
        let page = row[position] / page_size as u32;
        assert!(cache.allocator().is_page_free(page), "position {position}");
    }
    assert!(!cache.allocator().is_page_free(row[4] / page_size as u32));
    cache.check([&req]).unwrap();
    empty_out(cache);
}

// Edge case: a chunked request at page size > 1 whose prefix is longer than its protected
// length; the next chunk continues the partial page.
#[test]
fn chunked_prefix_longer_than_protected_continues_the_partial_page() {
    let page_size = 4;
    let mut cache = cache(256, page_size, true);
    let mut batch = extend_chunked(vec![Req::new(1, tokens(0, 30))], &mut cache, 10);
    cache_unfinished_req(&mut batch.reqs_mut()[0], &mut cache).unwrap();
    let req = &batch.reqs()[0];
    assert_eq!(ladder(req), (8, 10, 10));
    assert_eq!(req.prefix_len(), 10);
    assert!(req.prefix_len() > req.kv().cache_protected_len());
    cache.check(batch.reqs()).unwrap();
    let row = row_of(&cache, req);
    let mut reqs = batch.into_reqs();
    init_next_round_input(&mut reqs[0], &mut cache, 10).unwrap();
    assert_eq!(
        reqs[0].prefix_len(),
        10,
        "a continuing chunk keeps its prefix"
    );
    let before = cache.available_size();
    let batch = alloc_for_extend(prepare_for_extend(ScheduleBatch::new(reqs)), &mut cache)
        .map_err(|f| f.error)
        .unwrap();
    let req = &batch.reqs()[0];
    assert_eq!(ladder(req), (8, 20, 20));
    let new_row = row_of(&cache, req);
    assert_eq!(&new_row[..10], &row[..10]);
    assert_eq!(new_row[10], row[9] + 1, "fills the partial page first");
    assert_eq!(new_row[11], row[9] + 2);
    assert_eq!(
        before - cache.available_size(),
        ceil_align(20, 4) - ceil_align(10, 4)
    );
    assert_eq!(&new_row[10..20], batch.out_cache_loc());
    cache.check(batch.reqs()).unwrap();

    // Aborting mid-prefill frees [8, 20) and keeps the tree's [0, 8).
    let mut req = batch.into_reqs().pop().unwrap();
    let before = cache.available_size();
    release_kv_cache(&mut req, &mut cache, false).unwrap();
    assert_eq!(cache.available_size() - before, 12);
    assert_eq!(cache.tree().evictable_size(), 8);
    empty_out(cache);
}

// sglang's overlap schedule: a decode step commits a position whose token comes later, so the
// committed length can pass the tokens by one. Registering then keys only the tokens there are
// (it used to slice past them and panic).
#[test]
fn registering_pages_keys_only_tokens_that_exist() {
    let page_size = 4;
    let mut cache = cache(256, page_size, true);
    let batch = extend(vec![Req::new(1, tokens(0, 7))], &mut cache);
    let mut batch = decode(batch, &mut cache);
    let req = &mut batch.reqs_mut()[0];
    assert_eq!((req.kv().kv_committed_len(), req.fill_ids().len()), (8, 7));
    cache_unfinished_req(req, &mut cache).unwrap();
    assert_eq!(
        ladder(req),
        (4, 8, 8),
        "the second page has no eighth token yet"
    );
    assert_eq!(cache.tree().protected_size(), 4);
    req.push_output(7);
    cache_unfinished_req(req, &mut cache).unwrap();
    assert_eq!(ladder(req), (8, 8, 8));
    assert_eq!(cache.tree().protected_size(), 8);
    release_all_and_empty_out(batch.into_reqs(), cache);
}

// A request that matched a prefix holds its lock but no row: resetting it for retraction would
// drop its protected length and keep the lock, and its extend would then take the tree's pages
// as its own (and free them at release). The reset is refused until it is released.
#[test]
fn resetting_a_matched_request_for_retraction_is_refused() {
    let mut cache = cache(64, 4, true);
    let mut first = extend(vec![Req::new(1, tokens(0, 9))], &mut cache)
        .into_reqs()
        .pop()
        .unwrap();
    release_kv_cache(&mut first, &mut cache, true).unwrap();
    let mut req = Req::new(2, tokens(0, 12));
    init_next_round_input(&mut req, &mut cache, usize::MAX).unwrap();
    assert_eq!(req.kv().cache_protected_len(), 8);
    let record = req.kv().clone();
    assert_eq!(
        reset_for_retract(&mut req),
        Err(KvError::AlreadyHeld { rid: 2 })
    );
    assert_eq!(req.kv(), &record);
    assert!(!req.is_retracted);
    cache.check([&req]).unwrap();
    release_kv_cache(&mut req, &mut cache, false).unwrap();
    reset_for_retract(&mut req).unwrap();
    assert!(req.is_retracted);
    empty_out(cache);
}

// A cache is built around an empty prefix cache: the allocator cannot know which of its pages
// a tree filled elsewhere holds (one was accepted, and its pages counted as free and cached at
// once).
#[test]
fn a_cache_is_refused_a_prefix_cache_that_already_holds_pages() {
    let mut tree = RadixCache::new(4);
    tree.insert(&[1, 2, 3, 4], &[4, 5, 6, 7]).unwrap();
    let allocator = PagedAllocator::new(64, 4, false).unwrap();
    let rows = ReqToTokenPool::new(4, 32).unwrap();
    assert!(matches!(
        KvCache::new(allocator, rows, TreeCache::Radix(tree)),
        Err(KvError::PrefixCacheNotEmpty { cached: 4 })
    ));
}

// A cache is built around an allocator and a table with nothing taken: slots or rows taken
// before it existed belong to no request it knows (such parts were accepted, and the cache's
// first check reported them as leaked). Parts used and given back are accepted.
#[test]
fn a_cache_is_refused_an_allocator_or_table_already_in_use() {
    let fresh_rows = || ReqToTokenPool::new(4, 32).unwrap();
    let fresh_allocator = || PagedAllocator::new(64, 4, false).unwrap();

    let mut allocator = fresh_allocator();
    allocator.alloc(8, &mut Vec::new()).unwrap();
    let refused = KvCache::new(allocator, fresh_rows(), TreeCache::Disabled).unwrap_err();
    assert_eq!(
        refused,
        KvError::AllocatorInUse {
            taken: 8,
            capacity: 64,
            free_group_open: false
        }
    );
    assert!(refused.to_string().contains("8 of its 64 slots taken"));

    let mut allocator = fresh_allocator();
    allocator.free_group_begin().unwrap();
    assert_eq!(
        KvCache::new(allocator, fresh_rows(), TreeCache::Disabled).unwrap_err(),
        KvError::AllocatorInUse {
            taken: 0,
            capacity: 64,
            free_group_open: true
        }
    );

    let mut rows = fresh_rows();
    rows.alloc(3).unwrap();
    let refused = KvCache::new(fresh_allocator(), rows, TreeCache::Disabled).unwrap_err();
    assert_eq!(refused, KvError::RowsInUse { held: 3, rows: 4 });
    assert!(refused.to_string().contains("3 of its 4 rows held"));

    let mut allocator = fresh_allocator();
    let mut taken = Vec::new();
    allocator.alloc(8, &mut taken).unwrap();
    allocator.free(&taken).unwrap();
    let mut rows = fresh_rows();
    let row = rows.alloc(1).unwrap()[0];
    rows.free(row).unwrap();
    assert!(KvCache::new(allocator, rows, TreeCache::Disabled).is_ok());
}

// Edge case: released after matching but before allocation: only the lock is dropped.
#[test]
fn release_between_match_and_alloc_drops_only_the_lock() {
    let page_size = 4;
    let mut cache = cache(256, page_size, true);
    let mut first = extend(vec![Req::new(1, tokens(0, 13))], &mut cache)
        .into_reqs()
        .pop()
        .unwrap();
    release_kv_cache(&mut first, &mut cache, true).unwrap();
    assert_eq!(cache.tree().evictable_size(), 12);

    let mut req = Req::new(2, [tokens(0, 12), vec![77]].concat());
    init_next_round_input(&mut req, &mut cache, usize::MAX).unwrap();
    assert_eq!(req.kv().cache_protected_len(), 12);
    assert!(!req.kv().holds_kv());
    assert_eq!(cache.tree().protected_size(), 12);
    let (allocator, table, ..) = state(&cache);
    release_kv_cache(&mut req, &mut cache, true).unwrap();
    assert_eq!(cache.tree().protected_size(), 0);
    assert_eq!(cache.tree().evictable_size(), 12);
    assert_eq!(cache.allocator(), &allocator, "no slot moves");
    assert_eq!(cache.req_to_token(), &table, "no row moves");
    assert_eq!((req.kv().cache_protected_len(), req.prefix_len()), (0, 0));
    assert_eq!(req.last_node(), TreePos::ROOT);
    assert_eq!(
        release_kv_cache(&mut req, &mut cache, true),
        Err(KvError::NotHeld { rid: 2 }),
        "the lock is dropped once"
    );
    cache.check([&req]).unwrap();
    empty_out(cache);
}

// RowTooShort and NotHeld leave the state unchanged.
#[test]
fn row_too_short_and_not_held_change_nothing() {
    let page_size = 4;
    let width = 32;
    let mut cache = cache_with(256, page_size, true, 4, width);
    let mut cached = extend(vec![Req::new(1, tokens(0, 9))], &mut cache)
        .into_reqs()
        .pop()
        .unwrap();
    release_kv_cache(&mut cached, &mut cache, true).unwrap();

    // Extend past the row width, with a matched (locked) prefix in the batch.
    let mut reqs = vec![
        Req::new(2, [tokens(0, 8), vec![1, 2]].concat()),
        Req::new(3, tokens(500, width + 1)),
    ];
    for req in &mut reqs {
        init_next_round_input(req, &mut cache, usize::MAX).unwrap();
    }
    let before = state(&cache);
    let failure =
        alloc_for_extend(prepare_for_extend(ScheduleBatch::new(reqs)), &mut cache).unwrap_err();
    assert_eq!(
        failure.error,
        KvError::RowTooShort {
            rid: 3,
            needed: width + 1,
            width
        }
    );
    assert_eq!(state(&cache), before);
    let mut reqs = failure.batch.cancel().into_reqs();
    assert_eq!(ladder(&reqs[0]), (8, 0, 0));
    assert!(!reqs[0].kv().holds_kv());
    cache.check(&reqs).unwrap();
    release_kv_cache(&mut reqs[0], &mut cache, false).unwrap();
    assert_eq!(
        release_kv_cache(&mut reqs[1], &mut cache, false),
        Err(KvError::NotHeld { rid: 3 })
    );

    // Decode and speculative reserve at the row's end, behind a request that fits: the error
    // names the one that does not.
    let full = extend(
        vec![Req::new(6, tokens(800, 5)), Req::new(4, tokens(700, width))],
        &mut cache,
    );
    let before = state(&cache);
    let (full, error) = prepare_for_decode(full, &cache).unwrap_err();
    assert_eq!(
        error,
        KvError::RowTooShort {
            rid: 4,
            needed: width + 1,
            width
        }
    );
    let (full, error) = prepare_for_spec_decode(full, &cache, 2).unwrap_err();
    assert_eq!(
        error,
        KvError::RowTooShort {
            rid: 4,
            needed: width + 4,
            width
        }
    );
    assert_eq!(state(&cache), before);
    assert_eq!(ladder(&full.reqs()[0]), (0, 5, 5));
    assert_eq!(ladder(&full.reqs()[1]), (0, width, width));
    for req in full.reqs() {
        assert_eq!(req.kv().decode_batch_idx(), 0, "no clock ticks");
    }

    // Requests holding nothing: decode, reserve, commit, chunk insert and release refuse.
    let mut idle = ScheduleBatch::new(vec![Req::new(5, tokens(0, 3))]);
    idle = prepare_for_decode(idle, &cache).unwrap_err().0;
    let (mut idle, error) = prepare_for_spec_decode(idle, &cache, 2).unwrap_err();
    assert_eq!(error, KvError::NotHeld { rid: 5 });
    assert_eq!(
        commit_spec_tokens(&mut idle, &[1]),
        Err(KvError::NotHeld { rid: 5 })
    );
    commit_spec_tokens(&mut idle, &[0]).unwrap();
    assert_eq!(
        cache_unfinished_req(&mut idle.reqs_mut()[0], &mut cache),
        Err(KvError::NotHeld { rid: 5 })
    );
    assert_eq!(
        release_kv_cache(&mut idle.reqs_mut()[0], &mut cache, true),
        Err(KvError::NotHeld { rid: 5 })
    );
    assert_eq!(state(&cache), before);
    assert_eq!(ladder(&idle.reqs()[0]), (0, 0, 0));
    release_all_and_empty_out(full.into_reqs(), cache);
}

#[test]
fn a_speculative_reservation_and_its_commit_may_fill_the_row_exactly() {
    let width = 32;
    let mut cache = cache_with(256, 4, false, 4, width);
    let batch = extend(vec![Req::new(1, tokens(0, width - 4))], &mut cache);
    let (batch, error) = prepare_for_spec_decode(batch, &cache, 5).unwrap_err();
    assert_eq!(
        error,
        KvError::RowTooShort {
            rid: 1,
            needed: width + 4,
            width
        }
    );
    let mut batch = reserve(batch, &mut cache, 4);
    assert_eq!(ladder(&batch.reqs()[0]), (0, width - 4, width));
    // Every reserved token may be accepted, and not one more.
    assert_eq!(
        commit_spec_tokens(&mut batch, &[5]),
        Err(KvError::CommitBeyondAllocation {
            rid: 1,
            accepted: 5,
            would_be: width + 1,
            allocated: width
        })
    );
    commit_spec_tokens(&mut batch, &[4]).unwrap();
    assert_eq!(ladder(&batch.reqs()[0]), (0, width, width));
    cache.check(batch.reqs()).unwrap();
    release_all_and_empty_out(batch.into_reqs(), cache);
}

/// Extends `prompts` (rid, tokens) in one batch and returns the requests.
fn extend_prompts(cache: &mut Cache, prompts: &[(u64, Vec<u32>)]) -> Vec<Req> {
    let mut reqs: Vec<Req> = prompts
        .iter()
        .map(|(rid, tokens)| Req::new(*rid, tokens.clone()))
        .collect();
    for req in &mut reqs {
        init_next_round_input(req, cache, usize::MAX).unwrap();
    }
    alloc_for_extend(prepare_for_extend(ScheduleBatch::new(reqs)), cache)
        .map_err(|failure| failure.error)
        .unwrap()
        .into_reqs()
}

#[test]
fn the_checker_names_a_request_dropped_holding_kv() {
    let mut cache = cache(64, 4, false);
    let mut reqs = extend_prompts(
        &mut cache,
        &[(10, (0..10).collect()), (11, (0..5).collect())],
    );
    let leaked = reqs.remove(0);
    let row = leaked.held_row().unwrap();
    assert_eq!(cache.req_to_token().assigned_to(row), Some(10));
    drop(leaked);

    let violation = cache.check(&reqs).unwrap_err();
    assert_eq!(
        violation,
        Violation::UnclaimedRow {
            row,
            assigned_to: Some(10),
            unclaimed_pages: 3,
        },
        "rid 10 held a row and ceil(10 / 4) = 3 pages"
    );
    let message = violation.to_string();
    assert!(
        message.contains("assigned to request 10") && message.contains("release_kv_cache"),
        "{message}"
    );

    // The same request passed twice claims its row twice: named, with the request.
    let kept = &reqs[0];
    let kept_row = kept.held_row().unwrap();
    let twice = cache.check([kept, kept]).unwrap_err();
    assert_eq!(
        twice,
        Violation::RowClaimedTwice {
            row: kept_row,
            first: 11,
            second: 11,
        }
    );
    assert!(
        twice.to_string().contains("passed to the check twice"),
        "{twice}"
    );

    // Released requests give their assignment back with the row.
    release_kv_cache(&mut reqs[0], &mut cache, false).unwrap();
    assert_eq!(cache.req_to_token().assigned_to(kept_row), None);
}

/// A radix cache (pages of 4) holding the first 8 tokens of the returned 12-token prompt,
/// cached by rid 1, which was released; no request holds anything.
fn cache_with_eight_tokens_cached() -> (Cache, Vec<u32>) {
    let mut cache = cache(64, 4, true);
    let prompt: Vec<u32> = (0..12).collect();
    let mut first = extend_prompts(&mut cache, &[(1, prompt[..8].to_vec())]);
    release_kv_cache(&mut first[0], &mut cache, true).unwrap();
    cache.check(std::iter::empty()).unwrap();
    assert_eq!(cache.tree().radix().unwrap().total_size(), 8);
    (cache, prompt)
}

#[test]
fn the_checker_counts_only_a_dropped_requests_own_pages_as_unclaimed() {
    // Rid 1's two pages go to the prefix cache; rid 2 matches them and extends one page of its
    // own, then is dropped: that page is unclaimed, the cached two are the tree's.
    let (mut cache, prompt) = cache_with_eight_tokens_cached();
    let mut second = extend_prompts(&mut cache, &[(2, prompt)]);
    assert_eq!(second[0].kv().cache_protected_len(), 8);
    let row = second[0].held_row().unwrap();
    drop(second.pop());

    assert_eq!(
        cache.check(std::iter::empty()),
        Err(Violation::UnclaimedRow {
            row,
            assigned_to: Some(2),
            unclaimed_pages: 1,
        })
    );
}

#[test]
fn the_checker_finds_the_lock_of_a_request_dropped_after_its_match() {
    // Rid 2 matches rid 1's cached pages (locking them) and is dropped before its extend: it
    // holds no row, only the lock, which keeps the prefix unevictable.
    let (mut cache, prompt) = cache_with_eight_tokens_cached();
    let mut matched = Req::new(2, prompt);
    init_next_round_input(&mut matched, &mut cache, usize::MAX).unwrap();
    let node = matched.last_node().node;
    cache.check([&matched]).unwrap();
    drop(matched);

    let violation = cache.check(std::iter::empty()).unwrap_err();
    assert_eq!(
        violation,
        Violation::LockCount {
            node,
            locks: 1,
            held: 0,
        }
    );
    assert!(
        violation.to_string().contains("release_kv_cache"),
        "{violation}"
    );
    assert_eq!(
        cache.tree().protected_size(),
        8,
        "the leaked lock protects 8 tokens"
    );
}

#[test]
fn reclaim_gives_back_a_dropped_requests_row_and_pages_and_nothing_of_the_live_ones() {
    let mut cache = cache(64, 4, false);
    let reqs = extend_prompts(
        &mut cache,
        &[(10, (0..10).collect()), (11, (0..5).collect())],
    );
    let mut batch = decode(ScheduleBatch::new(reqs), &mut cache);
    let mut reqs = batch.into_reqs();
    let leaked = reqs.remove(0);
    let row = leaked.held_row().unwrap();
    let mut pages: Vec<u32> = row_of(&cache, &leaked)[..11]
        .iter()
        .map(|&s| s / 4)
        .collect();
    pages.dedup();
    let live_row = row_of(&cache, &reqs[0]);
    let available = cache.available_size();
    drop(leaked);

    let old_id = cache.id();
    let reclaimed = reclaim_leaks(&mut cache, &mut reqs).unwrap();
    assert_eq!(reclaimed.rows, vec![(row, Some(10))]);
    assert_eq!(reclaimed.pages, pages, "rid 10's 11 tokens on 3 pages");
    assert!(reclaimed.locks.is_empty());
    assert_eq!(cache.available_size(), available + 12);
    assert!(!cache.req_to_token().is_held(row));
    assert_eq!(cache.req_to_token().assigned_to(row), None);
    cache.check(&reqs).unwrap();
    assert_eq!(
        row_of(&cache, &reqs[0]),
        live_row,
        "the live request's row is untouched"
    );
    assert_ne!(cache.id(), old_id, "the cache is renamed");
    assert_eq!(
        reqs[0].kv().kv_cache(),
        Some(cache.id()),
        "and the live request rebound"
    );

    // The live request goes on and is released as usual; the pool is whole again.
    batch = decode(ScheduleBatch::new(reqs), &mut cache);
    release_all_and_empty_out(batch.into_reqs(), cache);
}

#[test]
fn reclaim_releases_the_lock_of_a_request_dropped_after_its_match() {
    let (mut cache, prompt) = cache_with_eight_tokens_cached();
    let mut matched = Req::new(2, prompt);
    init_next_round_input(&mut matched, &mut cache, usize::MAX).unwrap();
    let node = matched.last_node().node;
    drop(matched);
    assert_eq!(cache.tree().protected_size(), 8);

    let reclaimed = reclaim_leaks(&mut cache, []).unwrap();
    assert_eq!(reclaimed.locks, vec![(node, 1)]);
    assert!(reclaimed.rows.is_empty() && reclaimed.pages.is_empty());
    assert!(!reclaimed.is_empty(), "a lock alone is a leak");
    assert_eq!(
        reclaimed.to_string(),
        "reclaimed 0 rows, 0 pages, 1 prefix lock"
    );
    assert_eq!(cache.tree().protected_size(), 0);
    assert_eq!(
        cache.tree().evictable_size(),
        8,
        "the prefix is evictable again"
    );
    empty_out(cache);
}

#[test]
fn reclaim_keeps_the_cached_prefix_and_the_live_sharers_lock() {
    // Rids 2 and 3 both match rid 1's cached 8 tokens and extend a page of their own; rid 2 is
    // dropped. Its own page and row come back, the cached prefix stays, locked by rid 3.
    let (mut cache, prompt) = cache_with_eight_tokens_cached();
    let mut reqs = extend_prompts(&mut cache, &[(2, prompt.clone()), (3, prompt)]);
    let node = reqs[0].last_node().node;
    assert_eq!(reqs[1].last_node().node, node);
    let dropped_page = row_of(&cache, &reqs[0])[8] / 4;
    let dropped_row = reqs[0].held_row().unwrap();
    drop(reqs.remove(0));

    let reclaimed = reclaim_leaks(&mut cache, &mut reqs).unwrap();
    assert_eq!(reclaimed.rows, vec![(dropped_row, Some(2))]);
    assert_eq!(reclaimed.pages, vec![dropped_page]);
    assert_eq!(
        reclaimed.locks,
        vec![(node, 1)],
        "one of the node's two locks"
    );
    assert_eq!(
        cache.tree().protected_size(),
        8,
        "rid 3 still locks the prefix"
    );
    assert_eq!(cache.tree().radix().unwrap().total_size(), 8);
    cache.check(&reqs).unwrap();
    release_all_and_empty_out(reqs, cache);
}

#[test]
fn reclaim_with_nothing_leaked_changes_nothing() {
    let (mut cache, prompt) = cache_with_eight_tokens_cached();
    let mut reqs = extend_prompts(&mut cache, &[(2, prompt)]);
    let (before, id) = (state(&cache), cache.id());
    assert!(reclaim_leaks(&mut cache, &mut reqs).unwrap().is_empty());
    assert_eq!(state(&cache), before);
    assert_eq!(cache.id(), id, "nothing reclaimed, nothing renamed");
    release_all_and_empty_out(reqs, cache);
}

#[test]
fn a_request_left_out_of_a_reclaim_is_refused_and_changes_nothing() {
    // Rid 10 is left out of the reclaim though it still exists: its row and pages are given
    // back, and every call that could touch them (or another request's, once they are reused)
    // refuses it.
    let mut cache = cache(64, 4, true);
    let mut reqs = extend_prompts(
        &mut cache,
        &[(10, (0..10).collect()), (11, (0..5).collect())],
    );
    let old_id = cache.id();
    let reclaimed = reclaim_leaks(&mut cache, &mut reqs[1..]).unwrap();
    assert_eq!(reclaimed.rows.len(), 1);
    let mut stale = reqs.remove(0);
    let record = stale.kv().clone();
    assert_eq!(record.kv_cache(), Some(old_id));
    let before = state(&cache);

    let refused = KvError::Reclaimed { rid: 10 };
    assert_eq!(
        release_kv_cache(&mut stale, &mut cache, true),
        Err(refused.clone())
    );
    assert_eq!(
        cache_unfinished_req(&mut stale, &mut cache),
        Err(refused.clone())
    );
    assert_eq!(
        init_next_round_input(&mut stale, &mut cache, usize::MAX),
        Err(refused.clone())
    );
    let Err((batch, error)) = prepare_for_decode(ScheduleBatch::new(vec![stale]), &cache) else {
        panic!("a decode of the left-out request is refused");
    };
    assert_eq!(error, refused);
    assert!(
        error.to_string().contains("left out of reclaim_leaks"),
        "{error}"
    );
    let stale = batch.into_reqs().pop().unwrap();
    assert_eq!(state(&cache), before);
    assert_eq!(stale.kv().kv_cache(), record.kv_cache());

    // Passed to the next reclaim, it is named, and nothing is reclaimed.
    let mut all = vec![stale];
    all.append(&mut reqs);
    assert_eq!(
        reclaim_leaks(&mut cache, &mut all),
        Err(ReclaimError::Violation(Violation::CacheRecord {
            rid: 10,
            holds: true,
            recorded: Some(old_id),
        }))
    );
    assert_eq!(state(&cache), before);
    drop(all.remove(0));
    release_all_and_empty_out(all, cache);
}

#[test]
fn reclaim_refuses_an_open_free_group_and_changes_nothing() {
    let mut cache = cache(64, 4, false);
    let mut reqs = extend_prompts(
        &mut cache,
        &[(10, (0..10).collect()), (11, (0..5).collect())],
    );
    let (before, id) = (state(&cache), cache.id());
    // Inside a free group frees are deferred and counts in flux.
    cache.free_group_begin().unwrap();
    let refused = reclaim_leaks(&mut cache, &mut reqs[..1]).unwrap_err();
    assert_eq!(refused, ReclaimError::Violation(Violation::OpenFreeGroup));
    assert!(
        refused.to_string().starts_with("nothing reclaimed"),
        "{refused}"
    );
    cache.free_group_end().unwrap();
    assert_eq!(state(&cache), before);
    assert_eq!(cache.id(), id);
    release_all_and_empty_out(reqs, cache);
}

/// A radix cache of 32 slots (pages of 4) holding three released 8-token prompts: 24 tokens
/// cached and evictable, 8 slots free.
fn cache_with_three_prompts_cached() -> (Cache, Vec<Req>) {
    let mut cache = cache(32, 4, true);
    let prompts = (0..3)
        .map(|rid| Req::new(rid, tokens(100 * rid as u32, 8)))
        .collect();
    let mut released = extend(prompts, &mut cache).into_reqs();
    for req in &mut released {
        release_kv_cache(req, &mut cache, true).unwrap();
    }
    assert_eq!(
        (cache.available_size(), cache.tree().evictable_size()),
        (8, 24)
    );
    (cache, released)
}

// Inside a free group an eviction frees nothing until the group ends: a call that needs one is
// refused before it evicts, with the counts; one that fits in the free slots goes through.
#[test]
fn room_that_only_eviction_can_make_is_refused_inside_a_free_group() {
    let (mut cache, _) = cache_with_three_prompts_cached();
    let refused = KvError::FreeGroupOpen {
        requested: 16,
        available: 8,
        evictable: 24,
    };
    cache.free_group_begin().unwrap();
    let before = state(&cache);
    assert_eq!(cache.evict_shortfall(16), Err(refused.clone()));
    assert_eq!(
        cache.evict_shortfall(8),
        Ok(0),
        "no shortfall: nothing to refuse"
    );
    let mut req = Req::new(7, tokens(700, 16));
    init_next_round_input(&mut req, &mut cache, usize::MAX).unwrap();
    let failure = alloc_for_extend(
        prepare_for_extend(ScheduleBatch::new(vec![req])),
        &mut cache,
    )
    .unwrap_err();
    assert_eq!(failure.error, refused);
    assert_eq!(state(&cache), before, "nothing evicted, nothing deferred");
    assert!(
        failure
            .error
            .to_string()
            .contains("end the free group first")
    );
    let mut req = failure.batch.cancel().into_reqs().pop().unwrap();
    assert_eq!(ladder(&req), (0, 0, 0));

    // Eight slots fit in what is free: allocation inside the group goes on as before.
    let small = extend(vec![Req::new(8, tokens(800, 8))], &mut cache);
    assert_eq!(cache.available_size(), 0);
    cache.free_group_end().unwrap();

    // Once the group is closed the refused extend evicts what it lacks and goes through.
    let batch = alloc_for_extend(
        prepare_for_extend(ScheduleBatch::new(vec![req])),
        &mut cache,
    )
    .map_err(|failure| failure.error)
    .unwrap();
    req = batch.into_reqs().pop().unwrap();
    assert_eq!(ladder(&req), (0, 16, 16));
    let mut all = small.into_reqs();
    all.push(req);
    release_all_and_empty_out(all, cache);
}

#[test]
fn retraction_inside_a_free_group_is_refused_and_changes_nothing() {
    let page_size = 4;
    let mut cache = cache(32, page_size, false);
    let mut batch = extend(
        vec![Req::new(1, tokens(0, 16)), Req::new(2, tokens(100, 16))],
        &mut cache,
    );
    assert_eq!(cache.available_size(), 0);
    cache.free_group_begin().unwrap();
    let before = state(&cache);
    assert_eq!(
        cache.evict_shortfall(8),
        Ok(0),
        "nothing evictable: nothing to refuse"
    );
    let error = retract_decode(&mut batch, &mut cache, None).unwrap_err();
    assert_eq!(
        error,
        KvError::FreeGroupOpen {
            requested: 8,
            available: 0,
            evictable: 0,
        }
    );
    assert_eq!(state(&cache), before);
    let rids: Vec<u64> = batch.reqs().iter().map(Req::rid).collect();
    assert_eq!(rids, [1, 2]);
    cache.free_group_end().unwrap();

    let outcome = retract_decode(&mut batch, &mut cache, None).unwrap();
    assert_eq!(outcome.retracted.len(), 1);
    let mut all = batch.into_reqs();
    all.extend(
        outcome
            .retracted
            .into_iter()
            .filter(|req| req.kv().holds_kv()),
    );
    release_all_and_empty_out(all, cache);
}

// Counts near `usize::MAX` (a corrupt sampler output, a bad configuration) are refused with
// typed errors, not overflowed: a wrapped commit would move the committed length backwards.
#[test]
fn huge_reservations_and_commits_are_refused_not_overflowed() {
    let page_size = 4;
    let width = 32;
    let mut cache = cache_with(256, page_size, false, 4, width);
    let mut batch = extend(vec![Req::new(1, tokens(0, 6))], &mut cache);
    let before = state(&cache);

    let error = commit_spec_tokens(&mut batch, &[usize::MAX]).unwrap_err();
    assert!(
        matches!(
            error,
            KvError::CommitBeyondAllocation {
                rid: 1,
                accepted: usize::MAX,
                ..
            }
        ),
        "{error}"
    );
    assert_eq!(ladder(&batch.reqs()[0]), (0, 6, 6));

    for reserve in [usize::MAX, usize::MAX - 6, usize::MAX - 8] {
        let needed = new_tokens_required_next_decode(batch.reqs(), page_size, Some(reserve));
        assert!(needed >= usize::MAX - width, "saturates: {needed}");
        let (back, error) = prepare_for_spec_decode(batch, &cache, reserve).unwrap_err();
        assert!(
            matches!(error, KvError::RowTooShort { rid: 1, needed, width: 32 } if needed > width),
            "{error}"
        );
        batch = back;
        assert!(!check_decode_mem(batch.reqs(), &mut cache, Some(reserve)).unwrap());
    }
    assert_eq!(state(&cache), before);
    assert_eq!(ladder(&batch.reqs()[0]), (0, 6, 6));
    release_all_and_empty_out(batch.into_reqs(), cache);
}

#[test]
fn an_empty_prompt_is_a_typed_error_or_a_named_panic() {
    assert!(matches!(
        Req::try_new(3, Vec::new()),
        Err(KvError::EmptyPrompt { rid: 3 })
    ));
    let req = Req::try_new(4, vec![7]).unwrap();
    assert_eq!((req.rid(), req.fill_ids()), (4, &[7][..]));
    let panic = std::panic::catch_unwind(|| Req::new(5, Vec::new())).unwrap_err();
    let message = panic.downcast_ref::<String>().expect("a formatted message");
    assert_eq!(
        message,
        "request 5: the prompt is empty; a request needs at least one token"
    );
}

// `KvCache::new`: "their page sizes must agree ([`KvError::PageSizeMismatch`])".
#[test]
fn a_cache_is_refused_a_prefix_cache_of_another_page_size() {
    let allocator = PagedAllocator::new(64, 4, false).unwrap();
    let rows = ReqToTokenPool::new(4, 32).unwrap();
    let error = KvCache::new(allocator, rows, TreeCache::Radix(RadixCache::new(2))).unwrap_err();
    assert_eq!(
        error,
        KvError::PageSizeMismatch {
            allocator: 4,
            cache: 2
        }
    );
}

// `KvAllocator::free_group_begin` / `free_group_end` through `KvCache`: a second begin fails
// with `NestedFreeGroup` and keeps the open group; an end without a group is `NotInFreeGroup`.
#[test]
fn a_nested_free_group_is_refused_and_keeps_the_open_one() {
    let mut cache = cache(64, 4, false);
    assert_eq!(
        cache.free_group_end(),
        Err(KvError::Alloc(AllocError::NotInFreeGroup))
    );
    let mut batch = extend(vec![Req::new(1, (0..8).collect())], &mut cache);
    cache.free_group_begin().unwrap();
    release_held(batch.reqs_mut(), &mut cache);
    assert_eq!(cache.allocator().deferred_count(), 2);
    assert_eq!(
        cache.free_group_begin(),
        Err(KvError::Alloc(AllocError::NestedFreeGroup {
            deferred_pages: 2
        }))
    );
    assert!(
        cache.allocator().in_free_group(),
        "the open group stays open"
    );
    assert_eq!(cache.allocator().deferred_count(), 2);
    cache.free_group_end().unwrap();
    assert_eq!(cache.available_size(), 64);
}

// `KvCache::evict_shortfall`: refused with `FreeGroupOpen` only "when slots are short and the
// cache holds evictable entries"; otherwise it evicts what it can, which inside a group is
// nothing.
#[test]
fn evict_shortfall_in_a_free_group_is_refused_only_when_it_would_have_to_evict() {
    let mut cache = cache(32, 4, true);
    let mut batch = extend(vec![Req::new(1, (0..9).collect())], &mut cache);
    release_kv_cache(&mut batch.reqs_mut()[0], &mut cache, true).unwrap();
    assert_eq!(
        (cache.available_size(), cache.tree().evictable_size()),
        (24, 8)
    );
    cache.free_group_begin().unwrap();
    assert_eq!(cache.evict_shortfall(24), Ok(0), "no shortfall");
    assert_eq!(
        cache.evict_shortfall(25),
        Err(KvError::FreeGroupOpen {
            requested: 25,
            available: 24,
            evictable: 8
        })
    );
    assert_eq!(cache.tree().evictable_size(), 8, "nothing evicted");
    cache.free_group_end().unwrap();
    assert_eq!(cache.evict_shortfall(25), Ok(4 * 2));
    // Nothing evictable: inside a group a shortfall evicts nothing, and is no error.
    cache.free_group_begin().unwrap();
    assert_eq!(cache.evict_shortfall(64), Ok(0));
    cache.free_group_end().unwrap();
}

// `commit_spec_tokens`: "All or nothing: fails when ... a request given a non-zero count holds
// no KV ([`KvError::NotHeld`])" - and the requests before it commit nothing either.
#[test]
fn a_commit_for_a_request_without_kv_commits_nothing() {
    let mut cache = cache(64, 4, false);
    let batch = extend(vec![Req::new(1, (0..6).collect())], &mut cache);
    let prepared = prepare_for_spec_decode(batch, &cache, 4)
        .map_err(|(_, error)| error)
        .unwrap();
    let mut batch = alloc_for_spec_decode(prepared, &mut cache)
        .map_err(|failure| failure.error)
        .unwrap();
    batch.extend_reqs([Req::new(2, vec![1, 2, 3])]);
    assert_eq!(
        commit_spec_tokens(&mut batch, &[2, 1]),
        Err(KvError::NotHeld { rid: 2 })
    );
    assert_eq!(batch.reqs()[0].kv().kv_committed_len(), 6);
    commit_spec_tokens(&mut batch, &[2, 0]).unwrap();
    assert_eq!(batch.reqs()[0].kv().kv_committed_len(), 8);
    release_held(batch.reqs_mut(), &mut cache);
    cache.check(batch.reqs()).unwrap();
}

// `init_next_round_input`: `max_extend` caps the chunk; a cap of 0 still extends one token
// (every step computes at least one).
#[test]
fn a_chunk_cap_of_zero_extends_one_token() {
    let mut cache = cache(64, 4, false);
    let mut req = Req::new(1, (0..6).collect());
    init_next_round_input(&mut req, &mut cache, 0).unwrap();
    assert_eq!(req.extend_end(), 1);
    init_next_round_input(&mut req, &mut cache, 3).unwrap();
    assert_eq!(req.extend_end(), 3);
}
