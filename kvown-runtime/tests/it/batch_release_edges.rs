//! Release, the checker and reclaim (sglang `release_kv_cache`, `cache_finished_req`): what a
//! release frees, the checker naming what a dropped request leaked, `reclaim_leaks` giving it
//! back, caches refused the parts they cannot own, and free groups.

use crate::common::batch_setup as setup;

use kvown_runtime::alloc::{AllocError, KvAllocator, PagedAllocator, SlotCalls, ceil_align};
use kvown_runtime::batch::{
    Req, ScheduleBatch, cache_unfinished_req, init_next_round_input, prepare_for_decode,
    release_kv_cache,
};
use kvown_runtime::cache::{KvCache, TreeCache};
use kvown_runtime::check::{ReclaimError, Violation, reclaim_leaks};
use kvown_runtime::error::KvError;
use kvown_runtime::error::PageSizeMismatch;
use kvown_runtime::radix::{Insert, RadixCache, RadixConfig};
use kvown_runtime::slots::ReqToTokenPool;

use setup::{
    cache, cache_with_eight_tokens_cached, decode, empty_out, extend, extend_prompts, ladder,
    release_all_and_empty_out, release_held, row_of, state, tokens,
};

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
    assert_eq!(cache.tree().radix().unwrap().sizes().total(), 8);
    let before = cache.available_size();
    release_kv_cache(&mut reqs[1], &mut cache, true).unwrap();
    // Its [0, 8) duplicates the tree: freed with the tail.
    assert_eq!(cache.available_size() - before, 12);
    assert_eq!(cache.tree().radix().unwrap().sizes().total(), 8);
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
    assert_eq!(cache.tree().radix().unwrap().sizes().total(), 8);
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
    let mut group = cache.free_group().unwrap();
    let refused = reclaim_leaks(&mut group, &mut reqs[..1]).unwrap_err();
    assert_eq!(refused, ReclaimError::Violation(Violation::OpenFreeGroup));
    assert!(
        refused.to_string().starts_with("nothing reclaimed"),
        "{refused}"
    );
    group.commit();
    assert_eq!(state(&cache), before);
    assert_eq!(cache.id(), id);
    release_all_and_empty_out(reqs, cache);
}

// A cache is built around an empty prefix cache: the allocator cannot know which of its pages
// a tree filled elsewhere holds (one was accepted, and its pages counted as free and cached at
// once).
#[test]
fn a_cache_is_refused_a_prefix_cache_that_already_holds_pages() {
    let mut tree = RadixCache::new(RadixConfig::new(4)).unwrap();
    tree.insert(Insert::new(&[1, 2, 3, 4], &[4, 5, 6, 7]))
        .unwrap();
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

    // A group whose guard was forgotten stays open.
    let mut allocator = fresh_allocator();
    std::mem::forget(allocator.free_group().unwrap());
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

// `KvCache::new`: "their page sizes must agree ([`KvError::PageSizeMismatch`])".
#[test]
fn a_cache_is_refused_a_prefix_cache_of_another_page_size() {
    let allocator = PagedAllocator::new(64, 4, false).unwrap();
    let rows = ReqToTokenPool::new(4, 32).unwrap();
    let error = KvCache::new(
        allocator,
        rows,
        TreeCache::Radix(RadixCache::new(RadixConfig::new(2)).unwrap()),
    )
    .unwrap_err();
    assert_eq!(
        error,
        KvError::PageSizeMismatch(PageSizeMismatch {
            allocator: 4,
            cache: 2
        })
    );
}

// `KvCache::free_group`: a second group, opened through the first's guard, fails with
// `NestedFreeGroup` and keeps the open group (an end without a group cannot be written).
#[test]
fn a_nested_free_group_is_refused_and_keeps_the_open_one() {
    let mut cache = cache(64, 4, false);
    let mut batch = extend(vec![Req::new(1, (0..8).collect())], &mut cache);
    let mut group = cache.free_group().unwrap();
    release_held(batch.reqs_mut(), &mut group);
    assert_eq!(group.allocator().deferred_count(), 2);
    assert_eq!(
        group.free_group().map(drop),
        Err(KvError::Alloc(AllocError::NestedFreeGroup {
            deferred_pages: 2
        }))
    );
    assert!(group.in_free_group(), "the open group stays open");
    assert!(group.allocator().in_free_group());
    assert_eq!(group.allocator().deferred_count(), 2);
    group.commit();
    assert!(!cache.in_free_group());
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
    let mut group = cache.free_group().unwrap();
    assert_eq!(group.evict_shortfall(24), Ok(0), "no shortfall");
    assert_eq!(
        group.evict_shortfall(25),
        Err(KvError::FreeGroupOpen {
            requested: 25,
            available: 24,
            evictable: 8
        })
    );
    assert_eq!(group.tree().evictable_size(), 8, "nothing evicted");
    group.commit();
    assert_eq!(cache.evict_shortfall(25), Ok(4 * 2));
    // Nothing evictable: inside a group a shortfall evicts nothing, and is no error.
    let mut group = cache.free_group().unwrap();
    assert_eq!(group.evict_shortfall(64), Ok(0));
    group.commit();
}

// sglang `_insert_cache(split_prompt=True)`: a registration whose key runs past the prompt's
// whole pages ends a node at the prompt too, so that eviction can take the outputs and keep the
// prompt. Prompt [5, 6], two decoded tokens [7, 8], then the whole key registered: the tree holds
// [5, 6] and [7, 8] apart, and evicting one token takes the two outputs only.
#[test]
fn a_registration_past_the_prompt_ends_a_node_at_the_prompt() {
    let mut cache = cache(64, 1, true);
    let mut batch = extend(vec![Req::new(1, vec![5, 6])], &mut cache);
    for token in [7, 8] {
        batch.reqs_mut()[0].push_output(token);
        batch = decode(batch, &mut cache);
    }
    let mut reqs = batch.into_reqs();
    cache_unfinished_req(&mut reqs[0], &mut cache).unwrap();
    assert_eq!(reqs[0].kv().cache_protected_len(), 4);
    release_kv_cache(&mut reqs[0], &mut cache, false).unwrap();
    assert_eq!(cache.tree().evictable_size(), 4);
    assert_eq!(cache.evict_shortfall(cache.available_size() + 1), Ok(2));
    assert_eq!(
        cache.tree().evictable_size(),
        2,
        "the prompt [5, 6] stays cached"
    );
    empty_out(cache);
}
