//! Extend (prefill): `prepare_for_extend` -> `alloc_for_extend`.

use kvown_macros::owner;

use super::{AllocFailure, ExtendPrepared, LastAllocation, Ready, ScheduleBatch};
use crate::alloc::{ExtendShape, KvAllocator};
use crate::cache::{ExtendRow, KvCache, TableMirror};
use crate::error::KvError;
use crate::slots::ReqRow;

/// Fixes each request's extend `[prefix_len, extend_end)` (set by `init_next_round_input`) and
/// ticks its extend clock, unless a request holds a speculative reservation, which
/// `alloc_for_extend` refuses ([`KvError::ReservationHeld`]): a refused batch ticks no clock.
/// Owns `extend_batch_idx`.
///
/// The prefix of a request without KV is its matched prefix (`prefix_indices`); a request
/// that holds KV (a chunked prefill continuing) extends from its committed length, whose last
/// slot `alloc_for_extend` reads from its row.
///
/// # Examples
///
/// ```
/// # use kvown_runtime::batch::{Req, ScheduleBatch, alloc_for_extend, prepare_for_extend};
/// # use kvown_runtime::{alloc::PagedAllocator, cache::{KvCache, TreeCache}};
/// # use kvown_runtime::slots::ReqToTokenPool;
/// # let allocator = PagedAllocator::new(64, 4, false)?;
/// # let mut cache = KvCache::new(allocator, ReqToTokenPool::new(4, 32)?, TreeCache::Disabled)?;
/// let prepared = prepare_for_extend(ScheduleBatch::new(vec![Req::new(1, vec![7; 6])]));
/// // The prepared batch hides its requests until the allocation settles.
/// let batch = alloc_for_extend(prepared, &mut cache).map_err(|failure| failure.error)?;
/// assert_eq!(batch.reqs()[0].kv().kv_allocated_len(), 6);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[owner]
pub fn prepare_for_extend(mut batch: ScheduleBatch<Ready>) -> ScheduleBatch<ExtendPrepared> {
    let mut shapes = Vec::with_capacity(batch.reqs.len());
    let refused = batch.reqs.iter().any(|req| req.kv().holds_reservation());
    for req in &mut batch.reqs {
        shapes.push(ExtendShape {
            prefix_len: req.prefix_len(),
            seq_len: req.extend_end.max(req.prefix_len()),
            last_loc: match req.kv().holds_kv() {
                true => None,
                false => req.prefix_indices.last().copied(),
            },
        });
        if !refused {
            *req.kv_mut().extend_batch_idx_mut(owner) += 1;
        }
    }
    batch.into_state(ExtendPrepared { shapes })
}

/// Allocates the extend: request rows for requests without one, KV slots for every new token
/// (evicting from the prefix cache as [`KvCache::eviction_rules`] say: by default what the free
/// slots lack of the new tokens plus a page per request at page sizes above 1,
/// [`EvictionDemand::Sglang`](crate::cache::EvictionDemand::Sglang)), the request-to-token
/// rows (a new row's `[0, prefix)` <- matched prefix slots; `[prefix, seq)` <- new slots), and
/// settles
/// `kv_allocated_len = kv_committed_len = seq_len` ("allocation is commitment", sglang #37085).
/// The cache's [`TableMirror`] is told each request's row writes, the prefix copied into a
/// new row included ([`TableMirror::extend`]).
///
/// Transactional: on error nothing was taken or written, and the prepared batch is handed
/// back. Nothing was evicted either, except when the allocator itself refuses the slots after
/// the batch flow evicted for them (a device out of memory; the host allocators
/// never do): the unlocked prefix-cache entries evicted then stay evicted. A request holding
/// KV in another cache fails with [`KvError::OtherCache`], one holding a speculative
/// reservation with [`KvError::ReservationHeld`].
///
/// # Examples
///
/// ```
/// # use kvown_runtime::batch::{Req, ScheduleBatch, alloc_for_extend, prepare_for_extend};
/// # use kvown_runtime::{alloc::PagedAllocator, cache::{KvCache, TreeCache}};
/// # use kvown_runtime::slots::ReqToTokenPool;
/// # let allocator = PagedAllocator::new(64, 4, false)?;
/// # let mut cache = KvCache::new(allocator, ReqToTokenPool::new(4, 32)?, TreeCache::Disabled)?;
/// let prepared = prepare_for_extend(ScheduleBatch::new(vec![Req::new(1, vec![7; 6])]));
/// let batch = alloc_for_extend(prepared, &mut cache).map_err(|failure| failure.error)?;
/// assert_eq!(batch.out_cache_loc().len(), 6);
/// assert_eq!(cache.available_size(), 64 - 8, "two pages");
/// let too_long = prepare_for_extend(ScheduleBatch::new(vec![Req::new(2, vec![7; 65])]));
/// let failure = alloc_for_extend(too_long, &mut cache).unwrap_err();
/// assert_eq!(failure.batch.cancel().len(), 1, "the batch comes back; nothing changed");
/// assert_eq!(cache.available_size(), 64 - 8);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[owner]
pub fn alloc_for_extend<A: KvAllocator, M: TableMirror>(
    mut batch: ScheduleBatch<ExtendPrepared>,
    cache: &mut KvCache<A, M>,
) -> Result<ScheduleBatch<Ready>, AllocFailure<ExtendPrepared>> {
    let width = cache.req_to_token.max_context_len();
    let mut rows_needed = 0;
    let mut tokens_needed = 0;
    let mut new_tokens = 0usize;
    for (req, shape) in batch.reqs.iter().zip(&mut batch.state.shapes) {
        if let Err(error) = cache.ensure_own(req) {
            return Err(batch.fail(error));
        }
        let (committed, allocated) = (req.kv().kv_committed_len(), req.kv().kv_allocated_len());
        if req.kv().holds_reservation() {
            let error = KvError::ReservationHeld {
                rid: req.rid(),
                committed,
                allocated,
            };
            return Err(batch.fail(error));
        }
        if let Some(row) = req.kv().req_pool_idx() {
            shape.last_loc = match shape.prefix_len {
                0 => None,
                len => Some(cache.req_to_token.row(row).expect("a held row")[len - 1]),
            };
        }
        if shape.seq_len > width {
            let error = KvError::RowTooShort {
                rid: req.rid(),
                needed: shape.seq_len,
                width,
            };
            return Err(batch.fail(error));
        }
        rows_needed += usize::from(!req.kv().holds_kv());
        tokens_needed += cache.pages_span(shape.prefix_len, shape.seq_len);
        new_tokens += shape.seq_len - shape.prefix_len;
    }
    let rows_available = cache.req_to_token.available_size();
    if rows_needed > rows_available {
        let error = KvError::OutOfRows {
            requested: rows_needed,
            available: rows_available,
        };
        return Err(batch.fail(error));
    }
    let demand = cache.extend_demand(new_tokens, batch.reqs.len());
    if let Err(error) = cache.reserve(tokens_needed, demand) {
        return Err(batch.fail(error));
    }
    // The new rows are taken only once the slots are: a refused allocation leaves the row pool
    // as it was, generations included.
    let new_rows = match cache.req_to_token.next_rows(rows_needed) {
        Ok(rows) => rows,
        Err(error) => return Err(batch.fail(error.into())),
    };
    // Each request's row: its own, or the next new one, in batch order.
    let mut new_rows = new_rows.iter().copied();
    let req_rows: Vec<ReqRow> = batch
        .reqs
        .iter()
        .map(|req| {
            req.kv().req_pool_idx().unwrap_or_else(|| {
                new_rows
                    .next()
                    .expect("one new row per request without one")
            })
        })
        .collect();
    // The allocator appends to a cleared `out_cache_loc`; forgotten with it, the last
    // allocation's positions are not paired with its slots if the allocator refuses.
    batch.forget_out_cache_loc();
    if let Err(error) = cache
        .allocator
        .alloc_extend(&batch.state.shapes, &mut batch.out_cache_loc)
    {
        return Err(batch.fail(error.into()));
    }
    // A new row takes its matched prefix with the new slots.
    let extend_rows = batch
        .reqs
        .iter()
        .zip(&req_rows)
        .map(|(req, &row)| ExtendRow {
            row,
            prefix: match req.kv().holds_kv() {
                true => &[],
                false => &req.prefix_indices[..],
            },
        });
    cache
        .mirror
        .extend(&batch.state.shapes, extend_rows, &batch.out_cache_loc);
    cache
        .req_to_token
        .alloc(rows_needed)
        .expect("the rows counted above are free");

    let mut offset = 0;
    for ((req, shape), &row) in batch
        .reqs
        .iter_mut()
        .zip(&batch.state.shapes)
        .zip(&req_rows)
    {
        let fresh = !req.kv().holds_kv();
        if fresh {
            cache.req_to_token.record_assignment(row, req.rid());
            let kv = req.kv_mut();
            kv.set_req_pool_idx(owner, Some(row));
            kv.set_kv_cache(owner, Some(cache.id()));
        }
        let extend_len = shape.seq_len - shape.prefix_len;
        let table = cache
            .req_to_token
            .row_mut(row)
            .expect("the row is held by this request");
        if fresh {
            table[..shape.prefix_len].copy_from_slice(&req.prefix_indices);
            req.prefix_indices.clear();
        }
        table[shape.prefix_len..shape.seq_len]
            .copy_from_slice(&batch.out_cache_loc[offset..offset + extend_len]);
        offset += extend_len;
        let kv = req.kv_mut();
        kv.set_kv_allocated_len(owner, shape.seq_len);
        kv.set_kv_committed_len(owner, shape.seq_len);
        // Re-admitted: running again (sglang `prepare_for_extend` clears `is_retracted`).
        req.is_retracted = false;
    }
    batch.last_allocation = LastAllocation::Extend(std::mem::take(&mut batch.state.shapes));
    Ok(batch.into_state(Ready))
}
