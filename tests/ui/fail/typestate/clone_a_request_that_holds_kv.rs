//! A request owns its request-to-token row and its prefix-cache lock, so it is not `Clone`:
//! no two requests can decode into one row, or free it and unlock its path twice.

use kvown::alloc::PagedAllocator;
use kvown::batch::{ScheduleBatch, alloc_for_extend, prepare_for_extend};
use kvown::cache::{KvCache, TreeCache};
use kvown::batch::Req;
use kvown::slots::ReqToTokenPool;

fn main() {
    let allocator = PagedAllocator::new(256, 4, false).unwrap();
    let pool = ReqToTokenPool::new(4, 64).unwrap();
    let mut cache = KvCache::new(allocator, pool, TreeCache::Disabled).unwrap();
    let batch = ScheduleBatch::new(vec![Req::new(1, vec![1, 2, 3])]);
    let batch = alloc_for_extend(prepare_for_extend(batch), &mut cache).unwrap();
    let reqs = batch.into_reqs();
    let _twin = reqs[0].clone();
}
