//! Beyond sglang: between `prepare_for_extend` and `alloc_for_extend` the batch is a
//! `ScheduleBatch<ExtendPrepared>`, which exposes no request, so nothing can read a committed
//! length between the old write point (prepare) and the new one (alloc).

use kvown::batch::{ScheduleBatch, prepare_for_extend};
use kvown::batch::Req;

fn main() {
    let prepared = prepare_for_extend(ScheduleBatch::new(vec![Req::new(1, vec![1, 2, 3])]));
    let _stale = prepared.reqs()[0].kv().kv_committed_len();
}
