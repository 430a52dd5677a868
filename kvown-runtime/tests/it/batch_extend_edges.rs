//! Extend and admission edge cases (sglang `write_cache_indices`, `alloc_for_extend`,
//! `init_next_round_input`, `cache_unfinished_req`): row contents after an extend, chunked
//! prefill at page size > 1, release between match and allocation, and refusals that change
//! nothing.

use crate::common::batch_setup as setup;

use kvown_runtime::alloc::ceil_align;
use kvown_runtime::batch::{
    Req, ScheduleBatch, alloc_for_extend, cache_unfinished_req, commit_spec_tokens,
    init_next_round_input, prepare_for_decode, prepare_for_extend, prepare_for_spec_decode,
    release_kv_cache,
};
use kvown_runtime::cache::{EvictionDemand, EvictionRules};
use kvown_runtime::error::KvError;
use kvown_runtime::radix::TreePos;

use setup::{
    cache, cache_with, decode, empty_out, extend, extend_chunked, ladder,
    release_all_and_empty_out, reserve, row_of, state, tokens,
};

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

// sglang `alloc_paged_token_slots_extend` evicts for `extend_num_tokens + len(reqs) * page_size`
// (`evict_to_free_tokens`: what the free slots lack of it), the case issue 42 found: page 16, a
// pool of 48 tokens. A 17-token request finishes and leaves one cached page (page 1, its tail
// page 2 freed); then an 18-token extend: it needs two pages, 32 slots are free, but sglang's
// demand of 34 evicts the cached page, so the extend takes pages 1 and 2. Evicting only the
// shortfall (`EvictionDemand::Shortfall`) evicts nothing and takes pages 2 and 3.
#[test]
fn an_extend_evicts_what_the_free_slots_lack_of_sglangs_demand() {
    for (demand, first_slot, evictable) in [
        (EvictionDemand::Sglang, 16, 0),
        (EvictionDemand::Shortfall, 32, 16),
    ] {
        let mut cache = cache(48, 16, true);
        cache.set_eviction_rules(EvictionRules {
            demand,
            ..EvictionRules::default()
        });
        let mut first = extend(vec![Req::new(1, tokens(0, 17))], &mut cache).into_reqs();
        release_kv_cache(&mut first[0], &mut cache, true).unwrap();
        assert_eq!(cache.tree().evictable_size(), 16);
        let batch = extend(vec![Req::new(2, tokens(100, 18))], &mut cache);
        let expected: Vec<u32> = (first_slot..first_slot + 18).collect();
        assert_eq!(batch.out_cache_loc(), expected, "{demand:?}");
        assert_eq!(cache.tree().evictable_size(), evictable, "{demand:?}");
        cache.check(batch.reqs()).unwrap();
        release_all_and_empty_out(batch.into_reqs(), cache);
    }
}

// sglang `alloc_paged_token_slots_decode` evicts for a page per request: two requests at page
// size 4 whose next tokens open no page still evict what the free slots lack of 8.
#[test]
fn a_decode_evicts_what_the_free_slots_lack_of_a_page_per_request() {
    for (demand, evictable) in [(EvictionDemand::Sglang, 0), (EvictionDemand::Shortfall, 4)] {
        // Four pages: a 5-token prompt leaves its first page cached; two 3-token requests take
        // a page each (extended evicting only their shortfall), so one page is free.
        let mut cache = cache(16, 4, true);
        let rules = |demand| EvictionRules {
            demand,
            ..EvictionRules::default()
        };
        cache.set_eviction_rules(rules(EvictionDemand::Shortfall));
        let mut cached = extend(vec![Req::new(1, tokens(0, 5))], &mut cache).into_reqs();
        release_kv_cache(&mut cached[0], &mut cache, true).unwrap();
        let batch = extend(
            vec![Req::new(2, tokens(100, 3)), Req::new(3, tokens(200, 3))],
            &mut cache,
        );
        assert_eq!(
            (cache.available_size(), cache.tree().evictable_size()),
            (4, 4)
        );
        cache.set_eviction_rules(rules(demand));
        // Both new tokens continue their page: no page is needed, yet the demand is 8.
        let batch = decode(batch, &mut cache);
        assert_eq!(cache.tree().evictable_size(), evictable, "{demand:?}");
        cache.check(batch.reqs()).unwrap();
        release_all_and_empty_out(batch.into_reqs(), cache);
    }
}
