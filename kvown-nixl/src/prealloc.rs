//! The decode node's rule for a request whose K/V a prefill node holds: preallocate now, wait,
//! or reject ([`prealloc_or_wait`]).

use kvown_runtime::alloc::KvAllocator;
use kvown_runtime::batch::{Req, TransferTicket, prealloc_for_transfer, release_kv_cache};
use kvown_runtime::cache::KvCache;
use kvown_runtime::error::KvError;
use kvown_runtime::radix::TreePos;

/// What to do with a request the prefill node computed.
#[derive(Debug)]
pub enum Prealloc {
    /// Its row and slots are preallocated: post its transfer.
    Ready(TransferTicket),
    /// Slots or rows are short now but the request fits this node once running requests
    /// release theirs: keep it queued (the prefill node keeps its K/V) and try again after the
    /// next release. It holds nothing here; match its prefix again before the retry.
    Wait {
        /// The request, holding nothing.
        req: Req,
        /// The shortage.
        error: KvError,
    },
    /// It can never be preallocated here (it needs more slots than the pool has, a longer row,
    /// or it belongs elsewhere): drop it and tell the prefill node to let its K/V go.
    Reject {
        /// The request, holding nothing.
        req: Req,
        /// Why.
        error: KvError,
    },
}

/// Preallocates `req` (matched on `cache` by `init_next_round_input`) for its transfer, or
/// says whether it should wait or be rejected. A shortage waits when the request needs no
/// more slots than the allocator has in all (`OutOfMemory`, `FreeGroupOpen`) or rows are short
/// (`OutOfRows`); anything else rejects. A refused request gives back the prefix lock its match
/// took, so a waiting request pins no cache entry.
pub fn prealloc_or_wait<A: KvAllocator>(req: Req, cache: &mut KvCache<A>) -> Prealloc {
    let failure = match prealloc_for_transfer(req, cache) {
        Ok(ticket) => return Prealloc::Ready(ticket),
        Err(failure) => *failure,
    };
    let (mut req, error) = (failure.req, failure.error);
    if !req.kv().holds_kv() && req.last_node() != TreePos::ROOT {
        // The prefix lock of this cache's match: releasing it cannot fail for a request that
        // holds no row. If it did, the request is rejected with that error instead.
        if let Err(unlock) = release_kv_cache(&mut req, cache, false) {
            return Prealloc::Reject { req, error: unlock };
        }
    }
    let capacity = cache.allocator().capacity();
    let curable = match &error {
        KvError::OutOfMemory { requested, .. } | KvError::FreeGroupOpen { requested, .. } => {
            *requested <= capacity
        }
        KvError::OutOfRows { .. } => true,
        _ => false,
    };
    match curable {
        true => Prealloc::Wait { req, error },
        false => Prealloc::Reject { req, error },
    }
}
