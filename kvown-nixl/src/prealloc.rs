//! The decode node's rule for a request whose K/V a prefill node holds: preallocate now, wait,
//! or reject ([`prealloc_or_wait`]).

use kvown_runtime::alloc::KvAllocator;
use kvown_runtime::batch::{Req, TransferTicket, prealloc_for_transfer, release_kv_cache};
use kvown_runtime::cache::{KvCache, TableMirror};
use kvown_runtime::error::KvError;
use kvown_runtime::error::OutOfMemory;
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
pub fn prealloc_or_wait<A: KvAllocator, M: TableMirror>(
    req: Req,
    cache: &mut KvCache<A, M>,
) -> Prealloc {
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
        KvError::OutOfMemory(OutOfMemory { requested, .. })
        | KvError::FreeGroupOpen { requested, .. } => *requested <= capacity,
        KvError::OutOfRows { .. } => true,
        _ => false,
    };
    match curable {
        true => Prealloc::Wait { req, error },
        false => Prealloc::Reject { req, error },
    }
}

#[cfg(test)]
mod tests {
    use kvown_runtime::alloc::PagedAllocator;
    use kvown_runtime::batch::{cancel_transfer, init_next_round_input};
    use kvown_runtime::cache::{KvCache, TreeCache};
    use kvown_runtime::radix::{RadixCache, RadixConfig};
    use kvown_runtime::slots::ReqToTokenPool;

    use super::*;

    /// A decode node of `pages` pages of 4 slots and two rows of 64 positions.
    fn node(pages: usize) -> KvCache<PagedAllocator> {
        let allocator = PagedAllocator::new(pages * 4, 4, true).unwrap();
        let table = ReqToTokenPool::new(2, 64).unwrap();
        KvCache::new(
            allocator,
            table,
            TreeCache::Radix(RadixCache::new(RadixConfig::new(4)).unwrap()),
        )
        .unwrap()
    }

    /// Request `rid` of `len` prompt tokens and its first output, matched on `cache`.
    fn computed(rid: u64, len: u32, cache: &mut KvCache<PagedAllocator>) -> Req {
        let mut req = Req::new(rid, (0..len).map(|t| t + 100 * rid as u32).collect());
        req.push_output(7);
        init_next_round_input(&mut req, cache, usize::MAX).unwrap();
        req
    }

    #[test]
    fn a_shortage_the_pool_can_cure_waits_and_one_it_cannot_is_rejected() {
        let mut cache = node(4);
        let req = computed(1, 10, &mut cache);
        let Prealloc::Ready(ticket) = prealloc_or_wait(req, &mut cache) else {
            panic!("10 slots fit 16");
        };
        // 12 more slots do not fit beside the ticket's 12, but fit the pool of 16.
        let req = computed(2, 10, &mut cache);
        let Prealloc::Wait {
            req: mut waiting,
            error,
        } = prealloc_or_wait(req, &mut cache)
        else {
            panic!("a curable shortage waits");
        };
        assert!(matches!(error, KvError::OutOfMemory(_)), "{error}");
        assert!(!waiting.kv().holds_kv() && waiting.last_node() == TreePos::ROOT);
        cache.check([ticket.req()]).unwrap();
        // 40 slots never fit a pool of 16.
        let huge = computed(3, 40, &mut cache);
        let Prealloc::Reject { req, error } = prealloc_or_wait(huge, &mut cache) else {
            panic!("a request past the pool is rejected");
        };
        assert!(
            matches!(error, KvError::OutOfMemory(OutOfMemory { requested, .. }) if requested > 16)
        );
        assert!(!req.kv().holds_kv());
        // The waiting request, matched again, fits once the first is gone.
        cancel_transfer(ticket, &mut cache).unwrap();
        init_next_round_input(&mut waiting, &mut cache, usize::MAX).unwrap();
        assert!(matches!(
            prealloc_or_wait(waiting, &mut cache),
            Prealloc::Ready(_)
        ));
    }

    #[test]
    fn a_row_too_short_is_rejected() {
        let mut cache = node(64);
        let req = computed(1, 70, &mut cache);
        let Prealloc::Reject { error, .. } = prealloc_or_wait(req, &mut cache) else {
            panic!("70 positions do not fit a row of 64");
        };
        assert!(matches!(error, KvError::RowTooShort { .. }), "{error}");
        cache.check([]).unwrap();
    }
}
