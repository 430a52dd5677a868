//! Decode: `prepare_for_decode` -> `alloc_for_decode`, one new token per request.

use kvown_macros::owner;

use super::{AllocFailure, DecodePrepared, LastAllocation, Ready, ScheduleBatch};
use crate::alloc::{DecodeShape, KvAllocator, KvSlot};
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
    if let Err(error) = decode_shapes(&batch.reqs, &cache.req_to_token, &mut shapes) {
        return Err((batch, error));
    }
    for req in &mut batch.reqs {
        *req.kv_mut().decode_batch_idx_mut(owner) += 1;
    }
    Ok(batch.into_state(DecodePrepared { shapes }))
}

/// Allocates one slot per request (a new page only when the new token opens one), writes it
/// at the request's old length in its row, and settles `kv_allocated_len += 1` and
/// `kv_committed_len += 1` (sglang #37085). Transactional like `alloc_for_extend`.
#[owner]
pub fn alloc_for_decode<A: KvAllocator>(
    mut batch: ScheduleBatch<DecodePrepared>,
    cache: &mut KvCache<A>,
) -> Result<ScheduleBatch<Ready>, AllocFailure<DecodePrepared>> {
    let tokens_needed = decode_tokens_needed(&batch.state.shapes, cache.page_size());
    if let Err(error) = cache.reserve(tokens_needed) {
        return Err(batch.fail(error));
    }
    batch.out_cache_loc.clear();
    if let Err(error) = cache
        .allocator
        .alloc_decode(&batch.state.shapes, &mut batch.out_cache_loc)
    {
        return Err(batch.fail(error.into()));
    }
    write_decode_slots(
        &batch.reqs,
        &batch.state.shapes,
        &batch.out_cache_loc,
        &mut cache.req_to_token,
    );
    for req in &mut batch.reqs {
        let kv = req.kv_mut();
        *kv.kv_allocated_len_mut(owner) += 1;
        *kv.kv_committed_len_mut(owner) += 1;
    }
    batch.last_allocation = LastAllocation::Decode;
    Ok(batch.into_state(Ready))
}

/// Slots a decode step takes: one page per request whose new token opens a page (its
/// post-step `seq_len` is `1 mod page_size`). A mask, not a division, for power-of-two pages.
#[inline]
fn decode_tokens_needed(shapes: &[DecodeShape], page_size: usize) -> usize {
    if page_size == 1 {
        return shapes.len();
    }
    let opening = if page_size.is_power_of_two() {
        let mask = page_size - 1;
        shapes
            .iter()
            .filter(|shape| shape.seq_len & mask == 1)
            .count()
    } else {
        shapes
            .iter()
            .filter(|shape| shape.seq_len % page_size == 1)
            .count()
    };
    opening * page_size
}

/// One decode shape per request: post-step length and the slot of the last stored token.
/// Not generic over the allocator, so it is compiled (and the table reads inlined) here.
fn decode_shapes(
    reqs: &[Req],
    table: &ReqToTokenPool,
    shapes: &mut Vec<DecodeShape>,
) -> Result<(), KvError> {
    let width = table.max_context_len();
    for req in reqs {
        let kv = req.kv();
        let row = req.held_row()?;
        let seq_len = kv.kv_allocated_len();
        if seq_len == 0 || seq_len >= width {
            return Err(KvError::RowTooShort {
                rid: req.rid(),
                needed: seq_len + 1,
                width,
            });
        }
        let last_loc = table.row(row)?[seq_len - 1];
        shapes.push(DecodeShape {
            seq_len: seq_len + 1,
            last_loc,
        });
    }
    Ok(())
}

/// Writes each request's new slot at its old length (`seq_len - 1`) in its row.
fn write_decode_slots(
    reqs: &[Req],
    shapes: &[DecodeShape],
    slots: &[KvSlot],
    table: &mut ReqToTokenPool,
) {
    for ((req, shape), &slot) in reqs.iter().zip(shapes).zip(slots) {
        let row = req
            .kv()
            .req_pool_idx()
            .expect("checked by prepare_for_decode");
        table.row_mut(row).expect("the row is held by this request")[shape.seq_len - 1] = slot;
    }
}
