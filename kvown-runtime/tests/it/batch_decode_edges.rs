//! Decode and retraction edge cases (sglang `alloc_for_decode`, `check_decode_mem`,
//! `retract_decode`): the decode rule in the row, the next step's memory formula, retraction
//! order and end state, and refusals that change nothing.

use crate::common::batch_setup as setup;

use kvown_runtime::alloc::{KvSlot, ceil_align};
use kvown_runtime::batch::{
    Req, ScheduleBatch, alloc_for_extend, check_decode_mem, commit_spec_tokens,
    init_next_round_input, new_tokens_required_next_decode, prepare_for_decode, prepare_for_extend,
    release_kv_cache, reset_for_retract, retract_decode,
};
use kvown_runtime::cache::{EvictionDemand, EvictionRules};
use kvown_runtime::error::KvError;
use kvown_runtime::radix::TreePos;

use setup::{
    cache, cache_with_three_prompts_cached, decode, empty_out, extend, ladder,
    release_all_and_empty_out, reserve, row_of, state, tokens,
};

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

// sglang `check_decode_mem`: it evicts only the shortfall. (The extends here evict only theirs
// too, `EvictionDemand::Shortfall`, so that the shortfall is the test's to choose.)
#[test]
fn check_decode_mem_evicts_only_the_shortfall() {
    let page_size = 4;
    let mut cache = cache(64, page_size, true);
    cache.set_eviction_rules(EvictionRules {
        demand: EvictionDemand::Shortfall,
        ..EvictionRules::default()
    });
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
    let tree_total = cache.tree().radix().unwrap().sizes().total();
    // Lengths 8, 8, 4, 4 all open a page (16 needed): retracting rid 2 frees 8 (12 still
    // needed), rid 3 frees 4 more (8 needed, 12 free): two retractions.
    let outcome = retract_decode(&mut batch, &mut cache, None).unwrap();
    let order: Vec<u64> = outcome.retracted.iter().map(Req::rid).collect();
    assert_eq!(order, [2, 3]);
    assert_eq!(order[..], [2, 3, 4, 1][..order.len()]);
    assert!(!batch.is_empty() || outcome.aborted.len() == 1);
    assert_eq!(cache.tree().radix().unwrap().sizes().total(), tree_total);
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
    let mut group = cache.free_group().unwrap();
    let before = state(&group);
    assert_eq!(group.evict_shortfall(16), Err(refused.clone()));
    assert_eq!(
        group.evict_shortfall(8),
        Ok(0),
        "no shortfall: nothing to refuse"
    );
    let mut req = Req::new(7, tokens(700, 16));
    init_next_round_input(&mut req, &mut group, usize::MAX).unwrap();
    let failure = alloc_for_extend(
        prepare_for_extend(ScheduleBatch::new(vec![req])),
        &mut group,
    )
    .unwrap_err();
    assert_eq!(failure.error, refused);
    assert_eq!(state(&group), before, "nothing evicted, nothing deferred");
    assert!(failure.error.to_string().contains("commit the free group"));
    let mut req = failure.batch.cancel().into_reqs().pop().unwrap();
    assert_eq!(ladder(&req), (0, 0, 0));

    // Eight slots fit in what is free: allocation inside the group goes on as before.
    let small = extend(vec![Req::new(8, tokens(800, 8))], &mut group);
    assert_eq!(group.available_size(), 0);
    group.commit();

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
    let mut group = cache.free_group().unwrap();
    let before = state(&group);
    assert_eq!(
        group.evict_shortfall(8),
        Ok(0),
        "nothing evictable: nothing to refuse"
    );
    let error = retract_decode(&mut batch, &mut group, None).unwrap_err();
    assert_eq!(
        error,
        KvError::FreeGroupOpen {
            requested: 8,
            available: 0,
            evictable: 0,
        }
    );
    assert_eq!(state(&group), before);
    let rids: Vec<u64> = batch.reqs().iter().map(Req::rid).collect();
    assert_eq!(rids, [1, 2]);
    group.commit();

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
