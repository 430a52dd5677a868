//! Speculative decode edge cases (sglang `alloc_for_spec_decode`, the commit of accepted tokens):
//! reservations that never shrink, over-allocation freed at release, rows filled exactly, and
//! sizes refused rather than overflowed.

use crate::common::batch_setup as setup;

use kvown_runtime::batch::{
    Req, alloc_for_spec_decode, check_decode_mem, commit_spec_tokens,
    new_tokens_required_next_decode, prepare_for_spec_decode, release_kv_cache,
};
use kvown_runtime::error::KvError;

use setup::{
    cache, cache_with, empty_out, extend, ladder, release_all_and_empty_out, release_held, reserve,
    row_of, state, tokens,
};

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
    assert_eq!(cache.tree().radix().unwrap().sizes().total(), 8);
    assert_eq!(cache.available_size() - before, 20 - 8);
    for position in [8, 12, 16] {
        let page = row[position] / page_size as u32;
        assert!(cache.allocator().is_page_free(page), "position {position}");
    }
    assert!(!cache.allocator().is_page_free(row[4] / page_size as u32));
    cache.check([&req]).unwrap();
    empty_out(cache);
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
