//! Decode: `prepare_for_decode` -> `alloc_for_decode`, one new token per request.

use kvown_macros::owner;

use super::{AllocFailure, DecodePrepared, LastAllocation, Ready, ScheduleBatch};
use crate::alloc::{
    AllocError, DecodeRequest, DecodeRequests, DecodeShape, KvAllocator, KvSlot, Sealed,
};
use crate::batch::{Req, ReqKvInfo};
use crate::cache::{DecodeDone, DecodeStep, KvCache, TableMirror};
use crate::error::KvError;
use crate::ids::CacheId;

/// Checks that each request's next position (`kv_allocated_len`) exists in its row, ticks its
/// decode clock and counts the pages the step takes, in one pass over the requests. Owns
/// `decode_batch_idx`.
///
/// Fails, changing nothing (the pass ticks every clock, and a refused batch has them turned
/// back), when a request holds no KV, holds it in another cache, holds a speculative
/// reservation ([`KvError::ReservationHeld`]: its committed length is short of its allocated
/// one), or its row is full.
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
/// batch.reqs_mut()[0].push_output(8); // the sampled token, whose KV the step stores
/// let prepared = prepare_for_decode(batch, &cache).map_err(|(_, error)| error)?;
/// let batch = alloc_for_decode(prepared, &mut cache).map_err(|failure| failure.error)?;
/// assert_eq!(batch.reqs()[0].kv().kv_committed_len(), 7);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[owner]
pub fn prepare_for_decode<A: KvAllocator, M: TableMirror>(
    mut batch: ScheduleBatch<Ready>,
    cache: &KvCache<A, M>,
) -> Result<ScheduleBatch<DecodePrepared>, (ScheduleBatch<Ready>, KvError)> {
    // Ticking in the checking pass spares a second pass over the requests (W2: about 2% of a
    // step); a refused batch is rare, and turning its clocks back costs that pass instead.
    let valid = check_and_tick(&mut batch.reqs, cache, |kv| {
        *kv.decode_batch_idx_mut(owner) += 1;
    });
    let opening = match valid {
        Ok(opening) => opening,
        Err((ticked, error)) => {
            for req in &mut batch.reqs[..ticked] {
                *req.kv_mut().decode_batch_idx_mut(owner) -= 1;
            }
            return Err((batch, error));
        }
    };
    Ok(batch.into_state(DecodePrepared {
        new_pages: opening,
        cache: cache.id(),
    }))
}

/// Allocates one slot per request (a new page only when the new token opens one; evicting as
/// [`KvCache::eviction_rules`] say, by default what the free slots lack of a page per request,
/// [`EvictionDemand::Sglang`](crate::cache::EvictionDemand::Sglang)), writes it at the
/// request's old length in its row, and settles `kv_allocated_len += 1` and
/// `kv_committed_len += 1` (sglang #37085). The allocator reads each
/// request's last slot from its row and writes the new one as it goes, in one pass that trusts
/// what `prepare_for_decode` checked ([`DecodeRequests::checked_new_pages`]); the cache's
/// [`TableMirror`] runs that pass and sees each write in it ([`TableMirror::decode`]). Transactional like `alloc_for_extend`; a batch prepared
/// with another cache fails with [`KvError::PreparedForOtherCache`].
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
/// batch.reqs_mut()[0].push_output(8);
/// let prepared = prepare_for_decode(batch, &cache).map_err(|(_, error)| error)?;
/// let batch = alloc_for_decode(prepared, &mut cache).map_err(|failure| failure.error)?;
/// let row = batch.reqs()[0].held_row()?;
/// assert_eq!(cache.req_to_token().row(row)?[6], batch.out_cache_loc()[0], "position 6's slot");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[owner]
pub fn alloc_for_decode<A: KvAllocator, M: TableMirror>(
    mut batch: ScheduleBatch<DecodePrepared>,
    cache: &mut KvCache<A, M>,
) -> Result<ScheduleBatch<Ready>, AllocFailure<DecodePrepared>> {
    if batch.state.cache != cache.id() {
        let error = KvError::PreparedForOtherCache {
            prepared: batch.state.cache,
            used: cache.id(),
        };
        return Err(batch.fail(error));
    }
    let new_pages = batch.state.new_pages;
    // sglang's demand: a page per request (`alloc_paged_token_slots_decode`), a slot per
    // request at page size 1 (`alloc_token_slots`).
    let demand = batch.reqs.len().saturating_mul(cache.page_size());
    if let Err(error) = cache.reserve(new_pages * cache.page_size(), demand) {
        return Err(batch.fail(error));
    }
    // The allocator appends to a cleared `out_cache_loc`; forgotten with it, the last
    // allocation's positions are not paired with its slots if the allocator refuses.
    batch.forget_out_cache_loc();
    // `prepare_for_decode` checked every request: it holds a row of this cache (its own: a
    // request is not `Clone`), and its next position exists. The batch stayed sealed since.
    let table = cache.req_to_token.entries_mut();
    let step = CheckedStep {
        allocator: &mut cache.allocator,
        rows: CheckedRows {
            reqs: &mut batch.reqs,
            entries: table.entries,
            width: table.width,
            new_pages,
            settle: |kv: &mut ReqKvInfo| {
                *kv.kv_allocated_len_mut(owner) += 1;
                *kv.kv_committed_len_mut(owner) += 1;
            },
        },
        out: &mut batch.out_cache_loc,
    };
    // The mirror runs the allocator's pass, seeing each write as it is made.
    if let Err(error) = cache.mirror.decode(step) {
        return Err(batch.fail(error.into()));
    }
    batch.last_allocation = LastAllocation::Decode;
    Ok(batch.into_state(Ready))
}

/// One decode step over the requests `prepare_for_decode` checked, for the cache's
/// [`TableMirror`] to run: the allocator's pass over `rows`, appending to `out`.
struct CheckedStep<'a, A, F> {
    allocator: &'a mut A,
    rows: CheckedRows<'a, F>,
    out: &'a mut Vec<KvSlot>,
}

impl<A, F> Sealed for CheckedStep<'_, A, F> {}

impl<'a, A: KvAllocator, F: FnMut(&mut ReqKvInfo)> DecodeStep<'a> for CheckedStep<'a, A, F> {
    fn writes(&self) -> usize {
        self.rows.reqs.len()
    }

    fn index_bound(&self) -> usize {
        self.rows.entries.len()
    }

    #[inline(always)]
    fn run(self, record: impl FnMut(usize, usize)) -> Result<DecodeDone<'a>, AllocError> {
        let rows = Recorded {
            rows: self.rows,
            record,
        };
        self.allocator.alloc_decode(rows, self.out)?;
        let out: &'a Vec<KvSlot> = self.out;
        Ok(DecodeDone::new(out))
    }
}

/// The requests of a decode batch that `prepare_for_decode` checked: their records, the
/// table's entries, and `settle`, which settles a request's record once its new slot is
/// written.
struct CheckedRows<'a, F> {
    reqs: &'a mut [Req],
    /// The table's entries, row by row.
    entries: &'a mut [KvSlot],
    /// Positions per row.
    width: usize,
    /// Pages the batch opens, as `prepare_for_decode` counted them.
    new_pages: usize,
    settle: F,
}

impl<F> CheckedRows<'_, F> {
    /// The flat index of the position `req`'s new token goes to.
    #[inline(always)]
    fn position(&self, req: &Req) -> usize {
        let kv = req.kv();
        kv.req_pool_idx().unwrap_or(0) * self.width + kv.kv_allocated_len()
    }
}

/// [`CheckedRows`] as the allocator reads them: each request's shape from its row (its last
/// slot at `kv_allocated_len - 1`), and its new slot written to the row, its record settled
/// and the request and the write's flat index told to `record`, as the allocator hands it
/// out.
struct Recorded<'a, F, R> {
    rows: CheckedRows<'a, F>,
    record: R,
}

impl<F: FnMut(&mut ReqKvInfo), R: FnMut(usize, usize)> Sealed for Recorded<'_, F, R> {}

impl<F: FnMut(&mut ReqKvInfo), R: FnMut(usize, usize)> DecodeRequests for Recorded<'_, F, R> {
    fn len(&self) -> usize {
        self.rows.reqs.len()
    }

    fn shape(&self, request: usize) -> DecodeShape {
        let rows = &self.rows;
        let req = &rows.reqs[request];
        DecodeShape {
            seq_len: req.kv().kv_allocated_len() + 1,
            last_loc: rows.entries[rows.position(req) - 1],
        }
    }

    fn checked_new_pages(&self) -> Option<usize> {
        Some(self.rows.new_pages)
    }

    #[inline(always)]
    fn assign(
        &mut self,
        out: &mut [KvSlot],
        mut slot_for: impl FnMut(DecodeRequest<'_>) -> KvSlot,
    ) {
        let rows = &mut self.rows;
        for (request, (slot, req)) in out.iter_mut().zip(rows.reqs.iter_mut()).enumerate() {
            let len = req.kv().kv_allocated_len();
            let position = req.kv().req_pool_idx().unwrap_or(0) * rows.width + len;
            *slot = slot_for(DecodeRequest::new(len, rows.entries, position));
            rows.entries[position] = *slot;
            (rows.settle)(req.kv_mut());
            (self.record)(request, position);
        }
    }
}

/// Checks in one pass that every request holds a row of this cache whose next position exists
/// and equals its committed length, calls `tick` on each request's record in the same pass, and
/// returns how many of the new tokens open a page (all of them for page size 1): the pages the
/// step takes. At the first invalid request the pass stops: the error is how many requests it
/// ticked, and the first invalid request's typed error from [`first_decode_error`].
fn check_and_tick<A: KvAllocator, M: TableMirror>(
    reqs: &mut [Req],
    cache: &KvCache<A, M>,
    mut tick: impl FnMut(&mut ReqKvInfo),
) -> Result<usize, (usize, KvError)> {
    let page_size = cache.page_size();
    let rule = DecodeRule::of(cache);
    let page_mask = page_size.is_power_of_two().then(|| page_size - 1);
    let mut opening = 0;
    let admitted = reqs.iter_mut().all(|req| {
        let kv = req.kv_mut();
        if !rule.admits(kv) {
            return false;
        }
        tick(kv);
        let seq_len = kv.kv_allocated_len();
        // A mask, not a division, for powers of two.
        opening += usize::from(match page_mask {
            Some(mask) => seq_len & mask == 0,
            None => seq_len.is_multiple_of(page_size),
        });
        true
    });
    if !admitted {
        // The pass keeps no count of the requests it ticked: those before the first refused.
        let ticked = reqs.iter().take_while(|req| rule.admits(req.kv())).count();
        return Err((ticked, first_decode_error(reqs, cache)));
    }
    Ok(opening)
}

/// What `prepare_for_decode` asks of each request of a cache: its new token's position
/// (`kv_allocated_len`) exists in a row it holds of this cache, and equals its committed
/// length (no speculative reservation in between).
#[derive(Clone, Copy)]
struct DecodeRule {
    own: Option<CacheId>,
    width: usize,
    rows: usize,
}

impl DecodeRule {
    fn of<A: KvAllocator, M: TableMirror>(cache: &KvCache<A, M>) -> Self {
        DecodeRule {
            own: Some(cache.id()),
            width: cache.req_to_token.max_context_len(),
            rows: cache.req_to_token.size(),
        }
    }

    /// Whether `kv` may decode: `1 <= seq_len < width`, its row in range (rows are
    /// `1..=rows`), its committed length `seq_len`, and its cache this one.
    #[inline(always)]
    fn admits(self, kv: &ReqKvInfo) -> bool {
        let seq_len = kv.kv_allocated_len();
        seq_len.wrapping_sub(1) < self.width.saturating_sub(1)
            && kv.req_pool_idx().is_some_and(|row| row <= self.rows)
            && kv.kv_committed_len() == seq_len
            && kv.kv_cache() == self.own
    }
}

/// The typed error of the first request `check_and_tick` rejects.
#[cold]
#[inline(never)]
fn first_decode_error<A: KvAllocator, M: TableMirror>(
    reqs: &[Req],
    cache: &KvCache<A, M>,
) -> KvError {
    let table = &cache.req_to_token;
    let width = table.max_context_len();
    for req in reqs {
        let seq_len = req.kv().kv_allocated_len();
        let row = match cache.held_row(req) {
            Ok(row) => row,
            Err(error) => return error,
        };
        let committed = req.kv().kv_committed_len();
        if committed != seq_len {
            return KvError::ReservationHeld {
                rid: req.rid(),
                committed,
                allocated: seq_len,
            };
        }
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
    unreachable!("check_and_tick rejected a batch whose every request is valid")
}
