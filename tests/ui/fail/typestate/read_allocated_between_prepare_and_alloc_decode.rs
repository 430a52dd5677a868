//! The decode window is a type too: a `ScheduleBatch<DecodePrepared>` hides its requests.

use kvown::alloc::PagedAllocator;
use kvown::batch::{ScheduleBatch, alloc_for_extend, prepare_for_decode, prepare_for_extend};
use kvown::cache::{KvCache, TreeCache};
use kvown::batch::Req;
use kvown::slots::ReqToTokenPool;

fn main() {
    let allocator = PagedAllocator::new(256, 4, false).unwrap();
    let pool = ReqToTokenPool::new(4, 64).unwrap();
    let mut cache = KvCache::new(allocator, pool, TreeCache::Disabled).unwrap();
    let batch = ScheduleBatch::new(vec![Req::new(1, vec![1, 2, 3])]);
    let batch = alloc_for_extend(prepare_for_extend(batch), &mut cache).unwrap();
    let prepared = prepare_for_decode(batch, &cache).unwrap();
    let _stale = prepared.reqs_mut()[0].kv().kv_allocated_len();
}
