//! Setup shared by the batch-flow edge-case tests (`batch_*_edges`): caches, the
//! batch steps run to success, and the state a refused call must leave as it was. Each test
//! module uses a part of it.

use kvown_runtime::alloc::{KvAllocator, KvSlot, PagedAllocator};
use kvown_runtime::batch::{
    Req, ScheduleBatch, alloc_for_decode, alloc_for_extend, alloc_for_spec_decode,
    init_next_round_input, prepare_for_decode, prepare_for_extend, prepare_for_spec_decode,
    release_kv_cache,
};
use kvown_runtime::cache::{KvCache, TreeCache};
use kvown_runtime::radix::{RadixCache, RadixConfig};
use kvown_runtime::slots::ReqToTokenPool;

pub type Cache = KvCache<PagedAllocator>;

pub fn cache(pool_tokens: usize, page_size: usize, radix: bool) -> Cache {
    cache_with(pool_tokens, page_size, radix, 8, 256)
}

pub fn cache_with(
    pool_tokens: usize,

    page_size: usize,
    radix: bool,
    rows: usize,
    width: usize,
) -> Cache {
    let allocator = PagedAllocator::new(pool_tokens, page_size, false).unwrap();
    let tree = if radix {
        TreeCache::Radix(RadixCache::new(RadixConfig::new(page_size)).unwrap())
    } else {
        TreeCache::Disabled
    };
    KvCache::new(allocator, ReqToTokenPool::new(rows, width).unwrap(), tree).unwrap()
}
pub fn extend_chunked(reqs: Vec<Req>, cache: &mut Cache, chunk: usize) -> ScheduleBatch {
    let mut reqs = reqs;
    for req in &mut reqs {
        init_next_round_input(req, cache, chunk).unwrap();
    }
    alloc_for_extend(prepare_for_extend(ScheduleBatch::new(reqs)), cache)
        .map_err(|f| f.error)
        .unwrap()
}

pub fn extend(reqs: Vec<Req>, cache: &mut Cache) -> ScheduleBatch {
    extend_chunked(reqs, cache, usize::MAX)
}

pub fn decode(batch: ScheduleBatch, cache: &mut Cache) -> ScheduleBatch {
    let prepared = prepare_for_decode(batch, cache)
        .map_err(|(_, e)| e)
        .unwrap();
    alloc_for_decode(prepared, cache)
        .map_err(|f| f.error)
        .unwrap()
}

pub fn reserve(batch: ScheduleBatch, cache: &mut Cache, reserve: usize) -> ScheduleBatch {
    let prepared = prepare_for_spec_decode(batch, cache, reserve)
        .map_err(|(_, e)| e)
        .unwrap();
    alloc_for_spec_decode(prepared, cache)
        .map_err(|f| f.error)
        .unwrap()
}

pub fn row_of(cache: &Cache, req: &Req) -> Vec<KvSlot> {
    cache
        .req_to_token()
        .row(req.kv().req_pool_idx().unwrap())
        .unwrap()
        .to_vec()
}

pub fn ladder(req: &Req) -> (usize, usize, usize) {
    let kv = req.kv();
    (
        kv.cache_protected_len(),
        kv.kv_committed_len(),
        kv.kv_allocated_len(),
    )
}

pub fn tokens(base: u32, len: usize) -> Vec<u32> {
    (base..base + len as u32).collect()
}

/// Allocator, table and tree sizes: what an error must leave untouched.
pub fn state(cache: &Cache) -> (PagedAllocator, ReqToTokenPool, usize, usize, usize) {
    let tree = cache.tree();
    (
        cache.allocator().clone(),
        cache.req_to_token().clone(),
        tree.evictable_size(),
        tree.protected_size(),
        tree.radix().map_or(0, |radix| radix.sizes().total()),
    )
}

/// Releases every request that holds KV, without caching it.
pub fn release_held(reqs: &mut [Req], cache: &mut Cache) {
    for req in reqs.iter_mut().filter(|req| req.kv().holds_kv()) {
        release_kv_cache(req, cache, false).unwrap();
    }
}

pub fn empty_out(mut cache: Cache) {
    cache.check(std::iter::empty()).unwrap();
    assert_eq!(cache.tree().protected_size(), 0);
    let capacity = cache.allocator().capacity();
    cache.evict_shortfall(capacity + 1).unwrap();
    assert_eq!(cache.available_size(), capacity);
}

/// Checks `cache` with every request that holds KV in it (`all`), releases them, and
/// [`empty_out`]s it.
pub fn release_all_and_empty_out(mut all: Vec<Req>, mut cache: Cache) {
    cache.check(&all).unwrap();
    for req in &mut all {
        release_kv_cache(req, &mut cache, false).unwrap();
    }
    empty_out(cache);
}

/// Extends `prompts` (rid, tokens) in one batch and returns the requests.
pub fn extend_prompts(cache: &mut Cache, prompts: &[(u64, Vec<u32>)]) -> Vec<Req> {
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

/// A radix cache (pages of 4) holding the first 8 tokens of the returned 12-token prompt,
/// cached by rid 1, which was released; no request holds anything.
pub fn cache_with_eight_tokens_cached() -> (Cache, Vec<u32>) {
    let mut cache = cache(64, 4, true);
    let prompt: Vec<u32> = (0..12).collect();
    let mut first = extend_prompts(&mut cache, &[(1, prompt[..8].to_vec())]);
    release_kv_cache(&mut first[0], &mut cache, true).unwrap();
    cache.check(std::iter::empty()).unwrap();
    assert_eq!(cache.tree().radix().unwrap().sizes().total(), 8);
    (cache, prompt)
}

/// A radix cache of 32 slots (pages of 4) holding three released 8-token prompts: 24 tokens
/// cached and evictable, 8 slots free.
pub fn cache_with_three_prompts_cached() -> (Cache, Vec<Req>) {
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
