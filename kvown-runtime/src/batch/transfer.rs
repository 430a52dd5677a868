//! Decode-side preallocation for prefill/decode disaggregation (sglang
//! `disaggregation/decode.py`, `DecodePreallocQueue._pre_alloc`, and `mem_cache/allocation.py`,
//! `alloc_for_decode_prealloc`): a request whose prompt a prefill node computes gets its row and
//! slots on the decode node first, the K/V moves into those slots ([`crate::kv::KvTransfer`]),
//! and only then is its length committed and the request decoded.
//!
//! ```text
//! init_next_round_input (match the decode node's prefix cache)
//!   -> prealloc_for_transfer: row, slots for [prefix, fill); allocated = fill, committed = prefix
//!   -> KvTransfer::submit(prefill slots, ticket.destination()) ... poll
//!   -> commit_transfer (committed = fill), join the running decode batch
//!   or cancel_transfer (a failed or cancelled transfer): everything back
//! ```
//!
//! The commit waits for the transfer, so a request whose K/V is in flight never shows committed
//! K/V that is not there: the prefix cache cannot take it, and `prepare_for_decode` refuses it
//! ([`KvError::ReservationHeld`]). (sglang's `_pre_alloc` commits earlier: `docs/design.md`.)

use std::ops::Range;

use kvown_macros::owner;

use crate::alloc::{ExtendShape, KvAllocator, KvSlot};
use crate::batch::Req;
use crate::batch::release_kv_cache;
use crate::cache::{ExtendRow, KvCache, TableMirror};
use crate::error::KvError;

/// A request whose row and slots are preallocated and whose K/V is in flight: it can only be
/// committed ([`commit_transfer`]) or cancelled ([`cancel_transfer`]).
///
/// # Examples
///
/// ```
/// use kvown_runtime::batch::{Req, commit_transfer, prealloc_for_transfer};
/// # use kvown_runtime::{alloc::PagedAllocator, cache::{KvCache, TreeCache}};
/// # use kvown_runtime::slots::ReqToTokenPool;
/// # let allocator = PagedAllocator::new(64, 4, false)?;
/// # let mut cache = KvCache::new(allocator, ReqToTokenPool::new(4, 32)?, TreeCache::Disabled)?;
///
/// let mut req = Req::new(1, vec![7; 6]);
/// req.push_output(9); // the prefill node's first token
/// let ticket = prealloc_for_transfer(req, &mut cache).map_err(|failure| failure.error)?;
/// assert_eq!(ticket.positions(), 0..6, "nothing matched on this node: the whole prompt");
/// assert_eq!(ticket.destination().len(), 6);
/// assert_eq!(ticket.req().kv().kv_committed_len(), 0, "not before the K/V arrives");
/// // ... KvTransfer::submit(source slots, ticket.destination()), then poll ...
/// let req = commit_transfer(ticket);
/// assert_eq!(req.kv().kv_committed_len(), 6);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct TransferTicket {
    req: Req,
    destination: Vec<KvSlot>,
    positions: Range<usize>,
}

impl TransferTicket {
    /// The request (its row, its ladder).
    pub fn req(&self) -> &Req {
        &self.req
    }

    /// The slots the K/V goes to, one per position of [`TransferTicket::positions`].
    pub fn destination(&self) -> &[KvSlot] {
        &self.destination
    }

    /// The positions the sender moves: from the decode node's matched prefix to the fill
    /// length.
    pub fn positions(&self) -> Range<usize> {
        self.positions.clone()
    }
}

/// A refused preallocation: the request, as it was, and why.
#[derive(Debug)]
pub struct PreallocFailure {
    /// The request, unchanged (it may still hold the lock on its matched prefix).
    pub req: Req,
    /// Why it was refused.
    pub error: KvError,
}

/// A refused cancellation (the ticket names a request of another cache): the ticket, as it
/// was, and why.
#[derive(Debug)]
pub struct CancelFailure {
    /// The ticket, unchanged.
    pub ticket: TransferTicket,
    /// Why it was refused.
    pub error: KvError,
}

/// The tokens whose K/V the prefill node computed: every token but the last, whose K/V the
/// first decode step computes (sglang `_pre_alloc_fill_len`: the prompt plus the outputs but
/// one).
///
/// # Examples
///
/// ```
/// # use kvown_runtime::batch::{Req, transfer_fill_len};
/// let mut req = Req::new(1, vec![7; 6]);
/// assert_eq!(transfer_fill_len(&req), 6);
/// req.push_output(9); // its K/V comes from the first decode step
/// req.push_output(10);
/// assert_eq!(transfer_fill_len(&req), 7);
/// ```
pub fn transfer_fill_len(req: &Req) -> usize {
    req.origin_input_ids().len() + req.output_ids().len().saturating_sub(1)
}

/// Preallocates a request's row and slots on this (decode) node for K/V that a prefill node
/// computed (sglang `alloc_for_decode_prealloc` and `_pre_alloc`): its matched prefix (from
/// `init_next_round_input` on this cache) is copied into a new row, positions
/// `[prefix, fill)` get new slots (evicting only the shortfall from the prefix cache), and
/// the ladder becomes `allocated = fill`, `committed = prefix`. Returns the ticket with the
/// destination slots. Owns those writes.
///
/// Fails, changing nothing and handing the request back, when it already holds KV
/// ([`KvError::AlreadyHeld`]) or holds a prefix in another cache, when its row would not hold
/// the fill length and the next token ([`KvError::RowTooShort`]), or when rows or slots run
/// out.
///
/// # Examples
///
/// ```
/// # use kvown_runtime::batch::{Req, prealloc_for_transfer};
/// # use kvown_runtime::{alloc::PagedAllocator, cache::{KvCache, TreeCache}};
/// # use kvown_runtime::slots::ReqToTokenPool;
/// # let allocator = PagedAllocator::new(64, 4, false)?;
/// # let mut cache = KvCache::new(allocator, ReqToTokenPool::new(4, 32)?, TreeCache::Disabled)?;
/// let ticket = prealloc_for_transfer(Req::new(1, vec![7; 6]), &mut cache).map_err(|f| f.error)?;
/// assert_eq!(cache.available_size(), 64 - 8, "two pages for six positions");
/// let too_long = prealloc_for_transfer(Req::new(2, vec![7; 40]), &mut cache).unwrap_err();
/// assert_eq!(too_long.req.rid(), 2, "handed back unchanged");
/// assert_eq!(ticket.destination().len(), 6);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[owner]
pub fn prealloc_for_transfer<A: KvAllocator, M: TableMirror>(
    mut req: Req,
    cache: &mut KvCache<A, M>,
) -> Result<TransferTicket, Box<PreallocFailure>> {
    let refuse = |req, error| Err(Box::new(PreallocFailure { req, error }));
    if let Err(error) = cache.ensure_own(&req) {
        return refuse(req, error);
    }
    if req.kv().holds_kv() {
        let rid = req.rid();
        return refuse(req, KvError::AlreadyHeld { rid });
    }
    let prefix_len = req.prefix_indices.len();
    let fill_len = transfer_fill_len(&req).max(prefix_len);
    let width = cache.req_to_token.max_context_len();
    if fill_len >= width {
        let error = KvError::RowTooShort {
            rid: req.rid(),
            needed: fill_len + 1,
            width,
        };
        return refuse(req, error);
    }
    let available = cache.req_to_token.available_size();
    if available == 0 {
        let error = KvError::OutOfRows {
            requested: 1,
            available,
        };
        return refuse(req, error);
    }
    let needed = cache.pages_span(prefix_len, fill_len);
    if let Err(error) = cache.reserve(needed, needed) {
        return refuse(req, error);
    }
    let row = match cache.req_to_token.next_rows(1) {
        Ok(rows) => rows[0],
        Err(error) => return refuse(req, error.into()),
    };
    let shape = ExtendShape {
        prefix_len,
        seq_len: fill_len,
        last_loc: req.prefix_indices.last().copied(),
    };
    let mut destination = Vec::new();
    if let Err(error) = cache.allocator.alloc_extend(&[shape], &mut destination) {
        return refuse(req, error.into());
    }
    let rows = std::iter::once(ExtendRow {
        row,
        prefix: &req.prefix_indices,
    });
    cache.mirror.extend(&[shape], rows, &destination);
    cache
        .req_to_token
        .alloc(1)
        .expect("the row counted above is free");
    cache.req_to_token.record_assignment(row, req.rid());
    let table = cache
        .req_to_token
        .row_mut(row)
        .expect("the row was just taken");
    table[..prefix_len].copy_from_slice(&req.prefix_indices);
    table[prefix_len..fill_len].copy_from_slice(&destination);
    req.prefix_indices.clear();
    req.extend_end = fill_len;
    let id = cache.id();
    let kv = req.kv_mut();
    kv.set_req_pool_idx(owner, Some(row));
    kv.set_kv_cache(owner, Some(id));
    kv.set_kv_allocated_len(owner, fill_len);
    kv.set_kv_committed_len(owner, prefix_len);
    Ok(TransferTicket {
        req,
        destination,
        positions: prefix_len..fill_len,
    })
}

/// Commits a request whose transfer completed (sglang `DecodeTransferQueue` committing a
/// finished transfer): `committed = allocated`, so it can join the running decode batch.
/// Owns that write.
///
/// # Examples
///
/// ```
/// # use kvown_runtime::batch::{Req, ScheduleBatch, commit_transfer, prealloc_for_transfer};
/// # use kvown_runtime::{alloc::PagedAllocator, cache::{KvCache, TreeCache}};
/// # use kvown_runtime::slots::ReqToTokenPool;
/// # let allocator = PagedAllocator::new(64, 4, false)?;
/// # let mut cache = KvCache::new(allocator, ReqToTokenPool::new(4, 32)?, TreeCache::Disabled)?;
/// let ticket = prealloc_for_transfer(Req::new(1, vec![7; 6]), &mut cache).map_err(|f| f.error)?;
/// let req = commit_transfer(ticket); // the transfer completed
/// assert_eq!(req.kv().kv_committed_len(), 6);
/// let running = ScheduleBatch::new(vec![req]); // decodes from here
/// cache.check(running.reqs())?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[owner]
pub fn commit_transfer(ticket: TransferTicket) -> Req {
    let mut req = ticket.req;
    let allocated = req.kv().kv_allocated_len();
    req.kv_mut().set_kv_committed_len(owner, allocated);
    req
}

/// Gives back everything a request whose transfer failed or was cancelled holds: its slots,
/// its row and its prefix lock ([`release_kv_cache`] without inserting: the K/V never
/// arrived). The request comes back holding nothing, to be retried or dropped.
///
/// # Examples
///
/// ```
/// # use kvown_runtime::batch::{Req, cancel_transfer, prealloc_for_transfer};
/// # use kvown_runtime::{alloc::PagedAllocator, cache::{KvCache, TreeCache}};
/// # use kvown_runtime::slots::ReqToTokenPool;
/// # let allocator = PagedAllocator::new(64, 4, false)?;
/// # let mut cache = KvCache::new(allocator, ReqToTokenPool::new(4, 32)?, TreeCache::Disabled)?;
/// let ticket = prealloc_for_transfer(Req::new(1, vec![7; 6]), &mut cache).map_err(|f| f.error)?;
/// let req = cancel_transfer(ticket, &mut cache).map_err(|failure| failure.error)?;
/// assert!(!req.kv().holds_kv());
/// assert_eq!(cache.available_size(), 64, "everything back");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn cancel_transfer<A: KvAllocator, M: TableMirror>(
    ticket: TransferTicket,
    cache: &mut KvCache<A, M>,
) -> Result<Req, Box<CancelFailure>> {
    let mut req = ticket.req;
    match release_kv_cache(&mut req, cache, false) {
        Ok(()) => Ok(req),
        Err(error) => {
            let ticket = TransferTicket {
                req,
                destination: ticket.destination,
                positions: ticket.positions,
            };
            Err(Box::new(CancelFailure { ticket, error }))
        }
    }
}
