//! Claims of the public items' doc comments that no other test proved: each test names the
//! item whose documentation it checks and asserts exactly what that documentation promises.

#[path = "common/faulty.rs"]
#[allow(dead_code, reason = "the tests here arm extend faults only")]
mod faulty;

use faulty::{ExtendFault, Faults, Faulty};
use kvown_runtime::alloc::{AllocError, KvAllocator, KvSlot, PagedAllocator};
use kvown_runtime::batch::{
    ScheduleBatch, alloc_for_decode, alloc_for_extend, alloc_for_spec_decode, commit_spec_tokens,
    prepare_for_decode, prepare_for_extend, prepare_for_spec_decode, release_kv_cache,
};
use kvown_runtime::cache::{KvCache, TreeCache};
use kvown_runtime::error::KvError;
use kvown_runtime::kv::{HostKvPool, KvData, KvLayout, KvPool, KvPoolError, KvSlice};
use kvown_runtime::radix::RadixCache;
use kvown_runtime::request::Req;
use kvown_runtime::slots::ReqToTokenPool;
use kvown_runtime::tree_cache::init_next_round_input;

type Cache = KvCache<PagedAllocator>;

fn cache(pool_tokens: usize, page_size: usize, radix: bool) -> Cache {
    let allocator = PagedAllocator::new(pool_tokens, page_size, false).unwrap();
    let tree = if radix {
        TreeCache::Radix(RadixCache::new(page_size))
    } else {
        TreeCache::Disabled
    };
    KvCache::new(allocator, ReqToTokenPool::new(8, 64).unwrap(), tree).unwrap()
}

fn extend<A: KvAllocator>(mut reqs: Vec<Req>, cache: &mut KvCache<A>) -> ScheduleBatch {
    for req in &mut reqs {
        init_next_round_input(req, cache, usize::MAX).unwrap();
    }
    alloc_for_extend(prepare_for_extend(ScheduleBatch::new(reqs)), cache)
        .map_err(|failure| failure.error)
        .unwrap()
}

fn release_all<A: KvAllocator>(reqs: &mut [Req], cache: &mut KvCache<A>) {
    for req in reqs.iter_mut().filter(|req| req.kv().holds_kv()) {
        release_kv_cache(req, cache, false).unwrap();
    }
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
    release_all(batch.reqs_mut(), &mut cache);
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
    release_all(batch.reqs_mut(), &mut cache);
    cache.check(batch.reqs()).unwrap();
}

// `AllocFailure::batch`: "exactly as prepared, except after the allocator itself refused the
// slots: then the last allocation's `out_cache_loc` ... is forgotten". The speculative
// reservation writes no `out_cache_loc`, and one the allocator refuses keeps the batch's.
#[test]
fn a_refused_speculative_reservation_keeps_the_last_out_cache_loc() {
    let faults = Faults::default();
    let allocator = Faulty {
        inner: PagedAllocator::new(64, 4, false).unwrap(),
        faults: faults.clone(),
    };
    let rows = ReqToTokenPool::new(8, 64).unwrap();
    let mut cache = KvCache::new(allocator, rows, TreeCache::Disabled).unwrap();
    let batch = extend(vec![Req::new(1, (0..8).collect())], &mut cache);
    let prepared = prepare_for_decode(batch, &cache)
        .map_err(|(_, error)| error)
        .unwrap();
    let batch = alloc_for_decode(prepared, &mut cache)
        .map_err(|failure| failure.error)
        .unwrap();
    let decoded = batch.out_cache_loc().to_vec();
    assert_eq!(decoded.len(), 1);
    let prepared = prepare_for_spec_decode(batch, &cache, 4)
        .map_err(|(_, error)| error)
        .unwrap();
    faults.fault_next_extend(ExtendFault::Refuse);
    let failure = alloc_for_spec_decode(prepared, &mut cache).unwrap_err();
    assert!(matches!(
        failure.error,
        KvError::Alloc(AllocError::OutOfMemory { .. })
    ));
    let mut batch = failure.batch.cancel();
    assert_eq!(batch.out_cache_loc(), decoded);
    let positions: Vec<_> = batch
        .out_positions()
        .map(|(req, range)| (req.rid(), range.start, range.end))
        .collect();
    assert_eq!(positions, [(1, 8, 9)]);
    release_all(batch.reqs_mut(), &mut cache);
}

// `PageAllocator`: with LIFO reuse, "a group end" puts the pages of `free_segment(s)` first, in
// call order, then those of `free`, sorted ascending (`deferred_pages`).
#[test]
fn a_group_end_keeps_segment_order_and_sorts_only_plain_frees() {
    let mut allocator = PagedAllocator::new(24, 4, false).unwrap();
    let mut slots = Vec::new();
    allocator.alloc(24, &mut slots).unwrap(); // pages 1..=6, slot 4p.. for page p
    let page = |p: u32| (4 * p..4 * p + 4).collect::<Vec<_>>();
    allocator.free_group_begin().unwrap();
    allocator.free(&[page(6), page(3)].concat()).unwrap();
    let row: Vec<u32> = [page(5), page(2)].concat();
    allocator.free_segment(&row, 0).unwrap();
    assert_eq!(allocator.deferred_pages(), [5, 2, 6, 3]);
    allocator.free_group_end().unwrap();
    assert_eq!(allocator.free_pages().collect::<Vec<_>>(), [5, 2, 3, 6]);
}

// `HostKvPool::new`: "Fails with [`KvPoolError::HostOutOfMemory`] when the system allocator
// refuses a buffer". A K buffer of 2^60 bytes is past any address space a host maps.
#[test]
fn a_host_pool_larger_than_memory_is_a_typed_error() {
    let head_dim = 1 << 57;
    let layout = KvLayout::new(1, 1, head_dim, 1, 1).unwrap();
    let error = HostKvPool::<f32>::new(layout).unwrap_err();
    assert!(
        matches!(
            error,
            KvPoolError::HostOutOfMemory { buffer_bytes, pool_bytes }
                if buffer_bytes == 2 * head_dim * 4 && pool_bytes == 2 * 2 * head_dim * 4
        ),
        "{error:?}"
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

/// A 2-layer f32 pool of 3 pages of 4 slots (page 0 the padding), each K and V row one
/// element: `K[layer][slot] = 100 * layer + slot`, `V = -K`.
fn numbered_pool() -> HostKvPool<f32> {
    let mut pool = HostKvPool::<f32>::new(KvLayout::new(2, 1, 1, 8, 4).unwrap()).unwrap();
    let slots: Vec<KvSlot> = (0..12).collect();
    for layer in 0..2 {
        let k: Vec<f32> = slots.iter().map(|&s| (100 * layer + s) as f32).collect();
        let v: Vec<f32> = k.iter().map(|x| -x).collect();
        pool.store_kv(layer as usize, &slots, KvSlice::F32(&k), KvSlice::F32(&v))
            .unwrap();
    }
    pool
}

fn k_rows(pool: &HostKvPool<f32>, layer: usize) -> Vec<f32> {
    let (k, _) = pool.load_kv(layer, &(0..12).collect::<Vec<_>>()).unwrap();
    let KvData::F32(k) = k else {
        unreachable!("an f32 pool loads f32 rows")
    };
    k
}

// `KvPool::store_kv`: "A repeated slot ... the host writes the last of its rows".
#[test]
fn the_host_pool_keeps_the_last_row_stored_to_a_repeated_slot() {
    let mut pool = numbered_pool();
    pool.store_kv(
        1,
        &[0, 5, 0],
        KvSlice::F32(&[1.0, 2.0, 3.0]),
        KvSlice::F32(&[-1.0, -2.0, -3.0]),
    )
    .unwrap();
    let (k, v) = pool.load_kv(1, &[0, 5]).unwrap();
    assert_eq!(k, KvData::F32(vec![3.0, 2.0]));
    assert_eq!(v, KvData::F32(vec![-3.0, -2.0]));
}

// `KvPool::copy_pages`: whole pages `src[i]` -> `dst[i]` in every layer, all read before any
// is written (so two pages can be swapped).
#[test]
fn copy_pages_copies_whole_pages_in_every_layer_and_may_swap_them() {
    let mut pool = numbered_pool();
    pool.copy_pages(&[1, 2], &[2, 1]).unwrap();
    for layer in 0..2 {
        let base = (100 * layer) as f32;
        let expected: Vec<f32> = [0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7]
            .iter()
            .map(|&s| base + s as f32)
            .collect();
        assert_eq!(k_rows(&pool, layer), expected, "layer {layer}");
        let (_, v) = pool.load_kv(layer, &[4, 8]).unwrap();
        assert_eq!(v, KvData::F32(vec![-(base + 8.0), -(base + 4.0)]));
    }
}
