//! Decode: `prepare_for_decode` -> `alloc_for_decode`, one new token per request.

use kvown_macros::owner;

use super::{AllocFailure, DecodePrepared, Ready, ScheduleBatch};
use crate::alloc::{DecodeShape, KvAllocator};
use crate::cache::KvCache;
use crate::error::KvError;

/// Ticks each request's decode clock and fixes its next position (`kv_allocated_len`), reading
/// the slot of its last token from the request-to-token table. Owns `decode_batch_idx`.
///
/// Fails (changing nothing) when a request holds no KV or its row is full.
#[owner]
pub fn prepare_for_decode<A: KvAllocator>(
    mut batch: ScheduleBatch<Ready>,
    cache: &KvCache<A>,
) -> Result<ScheduleBatch<DecodePrepared>, (ScheduleBatch<Ready>, KvError)> {
    let width = cache.req_to_token.max_context_len();
    let mut shapes = Vec::with_capacity(batch.reqs.len());
    for req in &batch.reqs {
        let kv = req.kv();
        let Some(row) = kv.req_pool_idx() else {
            let error = KvError::NotHeld { rid: req.rid() };
            return Err((batch, error));
        };
        let seq_len = kv.kv_allocated_len();
        if seq_len + 1 > width || seq_len == 0 {
            let error = KvError::RowTooShort {
                rid: req.rid(),
                needed: seq_len + 1,
                width,
            };
            return Err((batch, error));
        }
        let last_loc = cache.req_to_token.row(row).map_err(KvError::from);
        let last_loc = match last_loc {
            Ok(row) => row[seq_len - 1],
            Err(error) => return Err((batch, error)),
        };
        shapes.push(DecodeShape {
            seq_len: seq_len + 1,
            last_loc,
        });
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
    let page_size = cache.page_size();
    let tokens_needed = batch
        .state
        .shapes
        .iter()
        .filter(|shape| page_size == 1 || shape.seq_len % page_size == 1)
        .count()
        * page_size;
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
    for ((req, shape), &slot) in batch
        .reqs
        .iter_mut()
        .zip(&batch.state.shapes)
        .zip(&batch.out_cache_loc)
    {
        let row = req
            .kv()
            .req_pool_idx()
            .expect("checked by prepare_for_decode");
        cache
            .req_to_token
            .row_mut(row)
            .expect("the row is held by this request")[shape.seq_len - 1] = slot;
        let kv = req.kv_mut();
        *kv.kv_allocated_len_mut(owner) += 1;
        *kv.kv_committed_len_mut(owner) += 1;
    }
    Ok(batch.into_state(Ready))
}
