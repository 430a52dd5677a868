//! The batch flow (sglang `ScheduleBatch` and `allocation.py`): prepare, allocate, commit,
//! retract and release, with the window between prepare and allocate as a type.
//!
//! A [`ScheduleBatch<Ready>`] exposes its requests. `prepare_for_*` consumes it and returns a
//! batch in a prepared state, which exposes no request at all: nothing can read a committed or
//! allocated length between the old and the new write point (the argument sglang #37085 relied
//! on, enforced here). `alloc_for_*` turns it back into a ready batch, or fails changing
//! nothing and hands the prepared batch back.

mod admit;
mod decode;
mod extend;
mod register;
mod release;
mod request;
mod retract;
mod spec;
mod transfer;

pub use admit::init_next_round_input;
pub use decode::{alloc_for_decode, prepare_for_decode};
pub use extend::{alloc_for_extend, prepare_for_extend};
pub(crate) use register::cache_finished_req;
pub use register::cache_unfinished_req;
pub use release::{release_kv_cache, reset_for_retract};
pub use request::*;
pub use retract::{
    RetractOutcome, check_decode_mem, new_tokens_required_next_decode, retract_decode,
};
pub use spec::{alloc_for_spec_decode, commit_spec_tokens, prepare_for_spec_decode};
pub use transfer::{
    CancelFailure, PreallocFailure, TransferTicket, cancel_transfer, commit_transfer,
    prealloc_for_transfer, transfer_fill_len,
};

use std::ops::Range;

use crate::alloc::{ExtendShape, KvSlot};
use crate::error::KvError;
use crate::ids::CacheId;

/// State of a batch whose requests can be read and whose last allocation is settled.
#[derive(Debug, Default)]
pub struct Ready;

/// State after `prepare_for_extend`: the extend shapes are fixed, requests are hidden. (It
/// takes no cache: `alloc_for_extend` checks each request's cache.)
#[derive(Debug)]
pub struct ExtendPrepared {
    shapes: Vec<ExtendShape>,
}

/// State after `prepare_for_decode`: one new token per request, requests are hidden.
#[derive(Debug)]
pub struct DecodePrepared {
    /// Pages the step takes: one for each new token that opens a page.
    new_pages: usize,
    /// The cache the batch was checked against.
    cache: CacheId,
}

/// State after `prepare_for_spec_decode`: each request's reservation target, requests hidden.
#[derive(Debug)]
pub struct SpecPrepared {
    /// `prefix_len` = current allocated length, `seq_len` = reservation target.
    shapes: Vec<ExtendShape>,
    /// The cache the batch was checked against.
    cache: CacheId,
}

/// Which allocation filled a batch's `out_cache_loc`.
#[derive(Debug)]
enum LastAllocation {
    /// None, or the batch changed since.
    Nothing,
    /// An extend: request `i` got positions `[prefix_len, seq_len)` of its shape.
    Extend(Vec<ExtendShape>),
    /// A decode: each request got its last allocated position.
    Decode,
}

/// A batch of requests in state `S` ([`Ready`] or one of the prepared states).
///
/// # Examples
///
/// ```
/// use kvown_runtime::batch::{Req, ScheduleBatch, alloc_for_extend, prepare_for_extend};
/// # use kvown_runtime::{alloc::PagedAllocator, cache::{KvCache, TreeCache}};
/// # use kvown_runtime::slots::ReqToTokenPool;
/// # let allocator = PagedAllocator::new(64, 4, false)?;
/// # let mut cache = KvCache::new(allocator, ReqToTokenPool::new(4, 32)?, TreeCache::Disabled)?;
///
/// let mut batch = ScheduleBatch::new(vec![Req::new(1, vec![7; 3])]);
/// batch.extend_reqs([Req::new(2, vec![8; 2])]);
/// assert_eq!((batch.len(), batch.is_empty()), (2, false));
/// let batch = prepare_for_extend(batch).cancel(); // abandoned: ready again
/// let mut batch = alloc_for_extend(prepare_for_extend(batch), &mut cache).map_err(|f| f.error)?;
/// assert_eq!(batch.out_cache_loc().len(), 5, "3 + 2 new tokens");
/// let positions: Vec<_> = batch.out_positions().map(|(req, range)| (req.rid(), range)).collect();
/// assert_eq!(positions, [(1, 0..3), (2, 0..2)]);
/// batch.reqs_mut()[0].push_output(9); // the requests may change: out_cache_loc is cleared
/// assert!(batch.out_cache_loc().is_empty());
/// let finished = batch.take_if(|req| req.rid() == 2);
/// assert_eq!((finished.len(), batch.reqs().len()), (1, 1));
/// let (reqs, buffer) = batch.into_parts();
/// let batch = ScheduleBatch::with_buffer(reqs, buffer); // reuses out_cache_loc's storage
/// assert_eq!(batch.into_reqs()[0].rid(), 1);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct ScheduleBatch<S = Ready> {
    reqs: Vec<Req>,
    out_cache_loc: Vec<KvSlot>,
    /// What `out_cache_loc` holds, to give each slot its position.
    last_allocation: LastAllocation,
    state: S,
}

/// A failed allocation: the error, and the prepared batch unchanged (retry it, or
/// [`ScheduleBatch::cancel`] it).
#[derive(Debug)]
pub struct AllocFailure<S> {
    /// Why the allocation failed.
    pub error: KvError,
    /// The batch, exactly as prepared (boxed: the failure path is cold, the `Ok` path is not),
    /// except after the allocator itself refused the slots of an extend or a decode: then the
    /// last allocation's `out_cache_loc` (and with it `out_positions`) is forgotten, as the
    /// batch flow cleared it for the allocator to fill. A refused speculative reservation,
    /// which fills no `out_cache_loc`, keeps it.
    pub batch: Box<ScheduleBatch<S>>,
}

impl<S> ScheduleBatch<S> {
    /// Number of requests.
    pub fn len(&self) -> usize {
        self.reqs.len()
    }

    /// Whether the batch has no request.
    pub fn is_empty(&self) -> bool {
        self.reqs.is_empty()
    }

    fn into_state<T>(self, state: T) -> ScheduleBatch<T> {
        ScheduleBatch {
            reqs: self.reqs,
            out_cache_loc: self.out_cache_loc,
            last_allocation: self.last_allocation,
            state,
        }
    }

    fn forget_out_cache_loc(&mut self) {
        self.out_cache_loc.clear();
        self.last_allocation = LastAllocation::Nothing;
    }

    fn fail(self, error: KvError) -> AllocFailure<S> {
        AllocFailure {
            error,
            batch: Box::new(self),
        }
    }
}

impl ScheduleBatch<Ready> {
    /// A ready batch of `reqs`.
    pub fn new(reqs: Vec<Req>) -> Self {
        ScheduleBatch {
            reqs,
            out_cache_loc: Vec::new(),
            last_allocation: LastAllocation::Nothing,
            state: Ready,
        }
    }

    /// The requests.
    pub fn reqs(&self) -> &[Req] {
        &self.reqs
    }

    /// The requests, mutable (their KV records stay owned by the batch flow). They may be
    /// reordered through it, so the last allocation's `out_cache_loc` and `out_positions`, which
    /// pair slots with requests by their place in the batch, are cleared: read them first.
    pub fn reqs_mut(&mut self) -> &mut [Req] {
        self.forget_out_cache_loc();
        &mut self.reqs
    }

    /// The KV slots of the last allocation's new tokens, in request order (sglang
    /// `out_cache_loc`; empty after a speculative reservation, which writes only the table, and
    /// after the requests changed or were handed out mutably).
    pub fn out_cache_loc(&self) -> &[KvSlot] {
        &self.out_cache_loc
    }

    /// For each request, the positions of its row that [`ScheduleBatch::out_cache_loc`] backs,
    /// in order: `out_cache_loc` is the concatenation of the slots of these ranges.
    pub fn out_positions(&self) -> impl Iterator<Item = (&Req, Range<usize>)> + '_ {
        self.reqs
            .iter()
            .enumerate()
            .filter_map(move |(i, req)| match &self.last_allocation {
                LastAllocation::Nothing => None,
                LastAllocation::Extend(shapes) => {
                    Some((req, shapes[i].prefix_len..shapes[i].seq_len))
                }
                LastAllocation::Decode => {
                    let end = req.kv().kv_allocated_len();
                    Some((req, end - 1..end))
                }
            })
    }

    /// Adds requests (e.g. merges a finished extend batch into the running batch). The last
    /// allocation's `out_cache_loc` no longer describes the batch and is cleared.
    pub fn extend_reqs(&mut self, reqs: impl IntoIterator<Item = Req>) {
        self.reqs.extend(reqs);
        self.forget_out_cache_loc();
    }

    /// Removes and returns the requests for which `finished` is true, keeping the order of
    /// the rest (sglang `filter_batch`; it frees nothing and clears `out_cache_loc`).
    ///
    /// `finished` is called once per request, in order. A few finished requests (the usual
    /// step) are taken out one by one, each with one bulk move of the requests behind it; many
    /// are taken in one pass that moves each kept request on its own.
    pub fn take_if(&mut self, mut finished: impl FnMut(&Req) -> bool) -> Vec<Req> {
        /// Above this many, one bulk move per finished request costs more than one pass.
        const BULK_MOVES_UP_TO: usize = 8;
        self.forget_out_cache_loc();
        let hits: Vec<usize> = (0..self.reqs.len())
            .filter(|&i| finished(&self.reqs[i]))
            .collect();
        if hits.len() > BULK_MOVES_UP_TO {
            let mut index = 0;
            let mut next_hit = hits.iter().copied().peekable();
            return self
                .reqs
                .extract_if(.., |_| {
                    let hit = next_hit.next_if_eq(&index).is_some();
                    index += 1;
                    hit
                })
                .collect();
        }
        let mut taken: Vec<Req> = hits.iter().rev().map(|&i| self.reqs.remove(i)).collect();
        taken.reverse();
        taken
    }

    /// A ready batch of `reqs` whose `out_cache_loc` keeps `buffer`'s storage (its contents are
    /// dropped): pass the buffer of a batch you are done with ([`ScheduleBatch::into_parts`]),
    /// so that an extend of many tokens does not allocate a fresh `out_cache_loc`, which for a
    /// large batch means fresh pages from the kernel and their page faults, on every step.
    pub fn with_buffer(reqs: Vec<Req>, mut buffer: Vec<KvSlot>) -> Self {
        buffer.clear();
        ScheduleBatch {
            out_cache_loc: buffer,
            ..Self::new(reqs)
        }
    }

    /// The requests, consuming the batch.
    pub fn into_reqs(self) -> Vec<Req> {
        self.reqs
    }

    /// The requests and the `out_cache_loc` storage (for [`ScheduleBatch::with_buffer`]),
    /// consuming the batch.
    pub fn into_parts(self) -> (Vec<Req>, Vec<KvSlot>) {
        (self.reqs, self.out_cache_loc)
    }
}

/// The prepared states: a batch between `prepare_for_*` and `alloc_for_*`.
pub trait Prepared: sealed::Sealed {}

mod sealed {
    pub trait Sealed {}
    impl Sealed for super::ExtendPrepared {}
    impl Sealed for super::DecodePrepared {}
    impl Sealed for super::SpecPrepared {}
}

impl Prepared for ExtendPrepared {}
impl Prepared for DecodePrepared {}
impl Prepared for SpecPrepared {}

impl<S: Prepared> ScheduleBatch<S> {
    /// Abandons the prepared step and returns the batch ready again. The iteration clocks
    /// keep the tick of the abandoned prepare; nothing else was changed by it.
    pub fn cancel(self) -> ScheduleBatch<Ready> {
        self.into_state(Ready)
    }
}
