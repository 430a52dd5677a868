//! Decode: `prepare_for_decode` -> `alloc_for_decode`, one new token per request.

use kvown_macros::owner;

use super::{AllocFailure, DecodePrepared, LastAllocation, Ready, ScheduleBatch};
use crate::alloc::{DecodeShape, KvAllocator};
use crate::cache::KvCache;
use crate::error::KvError;
use crate::request::Req;
use crate::slots::ReqToTokenPool;

/// Ticks each request's decode clock and fixes its next position (`kv_allocated_len`), reading
/// the slot of its last token from the request-to-token table. Owns `decode_batch_idx`.
///
/// Fails (changing nothing) when a request holds no KV or its row is full.
#[owner]
pub fn prepare_for_decode<A: KvAllocator>(
    mut batch: ScheduleBatch<Ready>,
    cache: &KvCache<A>,
) -> Result<ScheduleBatch<DecodePrepared>, (ScheduleBatch<Ready>, KvError)> {
    let mut shapes = Vec::with_capacity(batch.reqs.len());
    let opening = match decode_shapes(
        &batch.reqs,
        &cache.req_to_token,
        cache.page_size(),
        &mut shapes,
    ) {
        Ok(opening) => opening,
        Err(error) => return Err((batch, error)),
    };
    for req in &mut batch.reqs {
        *req.kv_mut().decode_batch_idx_mut(owner) += 1;
    }
    let tokens_needed = opening * cache.page_size();
    Ok(batch.into_state(DecodePrepared {
        shapes,
        tokens_needed,
    }))
}

/// Allocates one slot per request (a new page only when the new token opens one), writes it
/// at the request's old length in its row, and settles `kv_allocated_len += 1` and
/// `kv_committed_len += 1` (sglang #37085). The allocator is told the rows
/// ([`KvAllocator::alloc_decode_rows`]). Transactional like `alloc_for_extend`.
#[owner]
pub fn alloc_for_decode<A: KvAllocator>(
    mut batch: ScheduleBatch<DecodePrepared>,
    cache: &mut KvCache<A>,
) -> Result<ScheduleBatch<Ready>, AllocFailure<DecodePrepared>> {
    if let Err(error) = cache.reserve(batch.state.tokens_needed) {
        return Err(batch.fail(error));
    }
    batch.out_cache_loc.clear();
    let rows = batch.reqs.iter().map(|req| {
        req.kv()
            .req_pool_idx()
            .expect("checked by prepare_for_decode")
    });
    if let Err(error) =
        cache
            .allocator
            .alloc_decode_rows(&batch.state.shapes, rows, &mut batch.out_cache_loc)
    {
        return Err(batch.fail(error.into()));
    }
    let table = &mut cache.req_to_token;
    for (req, &slot) in batch.reqs.iter_mut().zip(&batch.out_cache_loc) {
        let kv = req.kv_mut();
        let row = kv.req_pool_idx().expect("checked by prepare_for_decode");
        table.set_held(row, kv.kv_allocated_len(), slot);
        *kv.kv_allocated_len_mut(owner) += 1;
        *kv.kv_committed_len_mut(owner) += 1;
    }
    batch.last_allocation = LastAllocation::Decode;
    Ok(batch.into_state(Ready))
}

/// One decode shape per request: post-step length and the slot of the last stored token.
/// Returns how many of the new tokens open a page (all of them for page size 1): the pages the
/// step takes. One branch-light pass for the valid batch; the first invalid request's typed
/// error comes from [`first_decode_error`]. Not generic over the allocator, so it is compiled
/// (and the table reads inlined) here.
fn decode_shapes(
    reqs: &[Req],
    table: &ReqToTokenPool,
    page_size: usize,
    shapes: &mut Vec<DecodeShape>,
) -> Result<usize, KvError> {
    let width = table.max_context_len();
    let page_mask = page_size.is_power_of_two().then(|| page_size - 1);
    let mut valid = true;
    let mut opening = 0;
    shapes.resize(reqs.len(), DecodeShape::default());
    for (shape, req) in shapes.iter_mut().zip(reqs) {
        let kv = req.kv();
        let seq_len = kv.kv_allocated_len();
        // The new token goes to position `seq_len`, which must exist: `1 <= seq_len < width`.
        let last_loc = match kv.req_pool_idx() {
            Some(row) if seq_len.wrapping_sub(1) < width.saturating_sub(1) => {
                table.slot(row, seq_len - 1)
            }
            _ => None,
        };
        valid &= last_loc.is_some();
        *shape = DecodeShape {
            seq_len: seq_len + 1,
            last_loc: last_loc.unwrap_or(0),
        };
        // A mask, not a division, for powers of two.
        opening += usize::from(match page_mask {
            Some(mask) => seq_len & mask == 0,
            None => seq_len % page_size == 0,
        });
    }
    if !valid {
        return Err(first_decode_error(reqs, table));
    }
    Ok(opening)
}

/// The typed error of the first request `decode_shapes` rejects.
#[cold]
#[inline(never)]
fn first_decode_error(reqs: &[Req], table: &ReqToTokenPool) -> KvError {
    let width = table.max_context_len();
    for req in reqs {
        let seq_len = req.kv().kv_allocated_len();
        let row = match req.held_row() {
            Ok(row) => row,
            Err(error) => return error,
        };
        if seq_len == 0 || seq_len >= width {
            return KvError::RowTooShort {
                rid: req.rid(),
                needed: seq_len + 1,
                width,
            };
        }
        if let Err(error) = table.row(row) {
            return error.into();
        }
    }
    unreachable!("decode_shapes rejected a batch whose every request is valid")
}
