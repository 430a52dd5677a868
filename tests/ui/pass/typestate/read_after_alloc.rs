//! After `alloc_for_extend` the batch is ready again and the settled ladder is readable.

use kvown::alloc::PagedAllocator;
use kvown::batch::Req;
use kvown::batch::{ScheduleBatch, alloc_for_extend, prepare_for_extend};
use kvown::cache::{KvCache, TreeCache};
use kvown::slots::ReqToTokenPool;

#[test]
fn compiles_and_runs() {
    let allocator = PagedAllocator::new(256, 4, false).unwrap();
    let pool = ReqToTokenPool::new(4, 64).unwrap();
    let mut cache = KvCache::new(allocator, pool, TreeCache::Disabled).unwrap();
    let prepared = prepare_for_extend(ScheduleBatch::new(vec![Req::new(1, vec![1, 2, 3])]));
    let batch = alloc_for_extend(prepared, &mut cache).unwrap();
    let kv = batch.reqs()[0].kv();
    assert_eq!((kv.kv_committed_len(), kv.kv_allocated_len()), (3, 3));
    assert_eq!(kv.extend_batch_idx(), 1);
}
