//! Speculative decoding (sglang spec v2): reserve draft slots ahead of the committed length,
//! then commit the accepted run.

use kvown_macros::owner;

use super::{AllocFailure, Ready, ScheduleBatch, SpecPrepared};
use crate::alloc::{ExtendShape, KvAllocator};
use crate::cache::{ExtendRow, KvCache, TableMirror};
use crate::error::KvError;

/// Ticks each request's decode clock and fixes its reservation target
/// `max(allocated, ceil_align(committed + reserve, page_size))` (it never shrinks), where
/// `reserve` is the double-buffered tokens per step (`2 × tokens_per_step`). Owns
/// `decode_batch_idx` on the speculative path; commits nothing.
///
/// Fails (changing nothing, no clock ticked) when a request holds no KV ([`KvError::NotHeld`]),
/// holds it in another cache ([`KvError::OtherCache`]), or its target passes its row
/// ([`KvError::RowTooShort`]).
///
/// # Examples
///
/// ```
/// # use kvown_runtime::batch::*;
/// # use kvown_runtime::{alloc::PagedAllocator, cache::{KvCache, TreeCache}};
/// # use kvown_runtime::slots::ReqToTokenPool;
/// # let allocator = PagedAllocator::new(64, 4, false)?;
/// # let mut cache = KvCache::new(allocator, ReqToTokenPool::new(4, 32)?, TreeCache::Disabled)?;
/// # let prepared = prepare_for_extend(ScheduleBatch::new(vec![Req::new(1, vec![7; 6])]));
/// # let mut batch = alloc_for_extend(prepared, &mut cache).map_err(|failure| failure.error)?;
/// // Reserve 4 draft positions past the 6 committed: up to ceil_align(10, 4) = 12.
/// let prepared = prepare_for_spec_decode(batch, &cache, 4).map_err(|(_, error)| error)?;
/// let batch = alloc_for_spec_decode(prepared, &mut cache).map_err(|failure| failure.error)?;
/// assert_eq!(batch.reqs()[0].kv().kv_allocated_len(), 12);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[owner]
pub fn prepare_for_spec_decode<A: KvAllocator, M: TableMirror>(
    mut batch: ScheduleBatch<Ready>,
    cache: &KvCache<A, M>,
    reserve: usize,
) -> Result<ScheduleBatch<SpecPrepared>, (ScheduleBatch<Ready>, KvError)> {
    let width = cache.req_to_token.max_context_len();
    let page_size = cache.page_size();
    let mut shapes = Vec::with_capacity(batch.reqs.len());
    for req in &batch.reqs {
        let kv = req.kv();
        let row = match cache.held_row(req) {
            Ok(row) => row,
            Err(error) => return Err((batch, error)),
        };
        let current = kv.kv_allocated_len();
        let target = reservation_target(current, kv.kv_committed_len(), reserve, page_size);
        if target > width {
            let error = KvError::RowTooShort {
                rid: req.rid(),
                needed: target,
                width,
            };
            return Err((batch, error));
        }
        let last_loc = match cache.req_to_token.row(row) {
            Ok(row) => current.checked_sub(1).map(|last| row[last]),
            Err(error) => return Err((batch, error.into())),
        };
        shapes.push(ExtendShape {
            prefix_len: current,
            seq_len: target,
            last_loc,
        });
    }
    for req in &mut batch.reqs {
        *req.kv_mut().decode_batch_idx_mut(owner) += 1;
    }
    Ok(batch.into_state(SpecPrepared {
        shapes,
        cache: cache.id(),
    }))
}

/// A speculative request's reservation target, `max(allocated, ceil_align(committed + reserve,
/// page_size))`, or `usize::MAX` when that overflows (no row is that wide).
pub(crate) fn reservation_target(
    allocated: usize,
    committed: usize,
    reserve: usize,
    page_size: usize,
) -> usize {
    committed
        .checked_add(reserve)
        .and_then(|wanted| wanted.checked_next_multiple_of(page_size))
        .map_or(usize::MAX, |aligned| aligned.max(allocated))
}

/// Tops each request's allocation up to its reservation target: slots for `[allocated,
/// target)` written into its row, `kv_allocated_len = target`. Leaves `kv_committed_len`
/// alone and `out_cache_loc` empty (draft and verify read their slots from the table). The
/// cache's [`TableMirror`] is told the rows' writes. Transactional like
/// `alloc_for_extend`; a batch prepared with another cache fails with
/// [`KvError::PreparedForOtherCache`].
///
/// # Examples
///
/// ```
/// # use kvown_runtime::batch::*;
/// # use kvown_runtime::{alloc::PagedAllocator, cache::{KvCache, TreeCache}};
/// # use kvown_runtime::slots::ReqToTokenPool;
/// # let allocator = PagedAllocator::new(64, 4, false)?;
/// # let mut cache = KvCache::new(allocator, ReqToTokenPool::new(4, 32)?, TreeCache::Disabled)?;
/// # let prepared = prepare_for_extend(ScheduleBatch::new(vec![Req::new(1, vec![7; 6])]));
/// # let mut batch = alloc_for_extend(prepared, &mut cache).map_err(|failure| failure.error)?;
/// let prepared = prepare_for_spec_decode(batch, &cache, 4).map_err(|(_, error)| error)?;
/// let batch = alloc_for_spec_decode(prepared, &mut cache).map_err(|failure| failure.error)?;
/// let kv = batch.reqs()[0].kv();
/// assert_eq!((kv.kv_committed_len(), kv.kv_allocated_len()), (6, 12), "reserved, not committed");
/// assert!(batch.out_cache_loc().is_empty(), "drafts read their slots from the table");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[owner]
pub fn alloc_for_spec_decode<A: KvAllocator, M: TableMirror>(
    mut batch: ScheduleBatch<SpecPrepared>,
    cache: &mut KvCache<A, M>,
) -> Result<ScheduleBatch<Ready>, AllocFailure<SpecPrepared>> {
    if batch.state.cache != cache.id() {
        let error = KvError::PreparedForOtherCache {
            prepared: batch.state.cache,
            used: cache.id(),
        };
        return Err(batch.fail(error));
    }
    let shapes = &batch.state.shapes;
    let tokens_needed = shapes
        .iter()
        .map(|shape| cache.pages_span(shape.prefix_len, shape.seq_len))
        .sum();
    let new_tokens = shapes.iter().map(|s| s.seq_len - s.prefix_len).sum();
    // sglang's `alloc_for_spec_decode` allocates through the extend's path and its demand.
    let demand = cache.extend_demand(new_tokens, shapes.len());
    if let Err(error) = cache.reserve(tokens_needed, demand) {
        return Err(batch.fail(error));
    }
    let mut slots = Vec::new();
    if let Err(error) = cache
        .allocator
        .alloc_extend(&batch.state.shapes, &mut slots)
    {
        return Err(batch.fail(error.into()));
    }
    let rows = batch.reqs.iter().map(|req| ExtendRow {
        row: req
            .kv()
            .req_pool_idx()
            .expect("checked by prepare_for_spec_decode"),
        prefix: &[],
    });
    cache.mirror.extend(&batch.state.shapes, rows, &slots);
    let mut offset = 0;
    for (req, shape) in batch.reqs.iter_mut().zip(&batch.state.shapes) {
        let row = req
            .kv()
            .req_pool_idx()
            .expect("checked by prepare_for_spec_decode");
        let grown = shape.seq_len - shape.prefix_len;
        cache
            .req_to_token
            .row_mut(row)
            .expect("the row is held by this request")[shape.prefix_len..shape.seq_len]
            .copy_from_slice(&slots[offset..offset + grown]);
        offset += grown;
        req.kv_mut().set_kv_allocated_len(owner, shape.seq_len);
    }
    batch.forget_out_cache_loc();
    Ok(batch.into_state(Ready))
}

/// Commits each request's accepted run after verification (sglang `_resolve_spec_v2_tokens`):
/// `kv_committed_len += accepted[i]` (accepted drafts plus the bonus token). Owns
/// `kv_committed_len` on the speculative path. Skip finished or retracted requests by passing
/// 0 for them.
///
/// All or nothing: fails when `accepted` does not match the batch
/// ([`KvError::BatchLengthMismatch`]), a request given a non-zero count holds no KV
/// ([`KvError::NotHeld`]), or a commit would pass the allocated length
/// ([`KvError::CommitBeyondAllocation`]).
///
/// # Examples
///
/// ```
/// # use kvown_runtime::batch::*;
/// # use kvown_runtime::{alloc::PagedAllocator, cache::{KvCache, TreeCache}};
/// # use kvown_runtime::slots::ReqToTokenPool;
/// # let allocator = PagedAllocator::new(64, 4, false)?;
/// # let mut cache = KvCache::new(allocator, ReqToTokenPool::new(4, 32)?, TreeCache::Disabled)?;
/// # let prepared = prepare_for_extend(ScheduleBatch::new(vec![Req::new(1, vec![7; 6])]));
/// # let mut batch = alloc_for_extend(prepared, &mut cache).map_err(|failure| failure.error)?;
/// let prepared = prepare_for_spec_decode(batch, &cache, 4).map_err(|(_, error)| error)?;
/// let mut batch = alloc_for_spec_decode(prepared, &mut cache).map_err(|failure| failure.error)?;
/// commit_spec_tokens(&mut batch, &[3])?; // two drafts accepted, plus the bonus token
/// assert_eq!(batch.reqs()[0].kv().kv_committed_len(), 9);
/// assert!(commit_spec_tokens(&mut batch, &[1, 1]).is_err(), "one count per request");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[owner]
pub fn commit_spec_tokens(
    batch: &mut ScheduleBatch<Ready>,
    accepted: &[usize],
) -> Result<(), KvError> {
    if accepted.len() != batch.reqs.len() {
        return Err(KvError::BatchLengthMismatch {
            expected: batch.reqs.len(),
            got: accepted.len(),
        });
    }
    for (req, &count) in batch.reqs.iter().zip(accepted) {
        let kv = req.kv();
        if count == 0 {
            continue;
        }
        req.held_row()?;
        // Saturating: an overflowing count passes any allocation, and is refused below.
        let would_be = kv.kv_committed_len().saturating_add(count);
        if would_be > kv.kv_allocated_len() {
            return Err(KvError::CommitBeyondAllocation {
                rid: req.rid(),
                accepted: count,
                would_be,
                allocated: kv.kv_allocated_len(),
            });
        }
    }
    for (req, &count) in batch.reqs.iter_mut().zip(accepted) {
        *req.kv_mut().kv_committed_len_mut(owner) += count;
    }
    Ok(())
}
