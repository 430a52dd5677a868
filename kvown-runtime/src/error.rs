//! [`KvError`]: why a batch-flow call was rejected. A call that returns one changed nothing,
//! except where the call documents otherwise (see [`KvError`]).

use crate::alloc::AllocError;
use crate::ids::CacheId;
use crate::radix::RadixError;
pub use crate::shared_error::{OutOfMemory, PageOutOfRange, PageSizeMismatch};
use crate::slots::SlotError;

/// Why an operation of the batch flow failed. The operation changed nothing: no slot, row,
/// length or lock is taken or released by a call that returns one of these, with two
/// exceptions its caller is told of: an `alloc_for_*` whose allocator refuses the slots
/// ([`KvError::Alloc`]) after the batch flow evicted for them keeps that eviction
/// (the evicted entries were unlocked cache), and
/// [`retract_decode`](crate::batch::retract_decode), failing on a broken invariant after it
/// began releasing, keeps the releases it made (and says which requests they were).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KvError {
    /// Not enough KV slots even after evicting every unlocked prefix-cache entry, or an
    /// allocator refused the slots the batch flow made room for (`evictable` 0): every
    /// out-of-memory of the batch flow, the allocator's included, is this one.
    #[error(transparent)]
    OutOfMemory(OutOfMemory),
    /// Room for `requested` slots must come from frees (evicting the prefix cache, or a
    /// retraction's releases), but a free group is open: what it frees stays deferred, and
    /// unavailable, until the group commits.
    #[error(
        "cannot make room inside a free group: requested {requested} slots, {available} free \
         and {evictable} evictable, but frees stay deferred until the group commits; commit \
         the free group (drop its guard) first"
    )]
    FreeGroupOpen {
        /// Slots the call needs in new pages.
        requested: usize,
        /// Slots free now.
        available: usize,
        /// Slots the prefix cache could free by eviction once the group ends.
        evictable: usize,
    },
    /// A request was made with an empty prompt: every request needs one token to compute.
    #[error("request {rid}: the prompt is empty; a request needs at least one token")]
    EmptyPrompt {
        /// The request.
        rid: u64,
    },
    /// Not enough request rows in the request-to-token table.
    #[error(
        "out of request rows: requested {requested}, {available} free; lower the number of \
         running requests or enlarge the request pool"
    )]
    OutOfRows {
        /// Rows the batch needs.
        requested: usize,
        /// Rows free now.
        available: usize,
    },
    /// A request would grow past the width of its request-to-token row.
    #[error(
        "request {rid} needs {needed} token positions but rows hold {width}; cap the request's \
         length or build the pool with a larger max context length"
    )]
    RowTooShort {
        /// The request.
        rid: u64,
        /// Positions it needs.
        needed: usize,
        /// Positions a row holds.
        width: usize,
    },
    /// An operation that needs the request's KV was called on a request that holds none.
    #[error(
        "request {rid} holds no KV (no request row): it was never allocated or already released"
    )]
    NotHeld {
        /// The request.
        rid: u64,
    },
    /// The request still holds KV or a prefix lock where the operation needs a released one.
    #[error("request {rid} still holds KV or a prefix lock; release it (release_kv_cache) first")]
    AlreadyHeld {
        /// The request.
        rid: u64,
    },
    /// The request holds a prefix lock, a row or slots in another cache.
    #[error(
        "request {rid} holds KV in cache {bound}, not in cache {used}: a request's row, slots \
         and prefix lock belong to the cache that gave them until it is released there"
    )]
    OtherCache {
        /// The request.
        rid: u64,
        /// The cache it holds KV in.
        bound: CacheId,
        /// The cache it was passed with.
        used: CacheId,
    },
    /// The request was left out of a [`reclaim_leaks`](crate::check::reclaim_leaks), which
    /// took it for leaked and gave its row, slots and prefix lock back.
    #[error(
        "request {rid} was left out of reclaim_leaks, which gave its row, slots and prefix lock \
         back (they may belong to other requests now); drop it, or pass every live request to \
         reclaim_leaks"
    )]
    Reclaimed {
        /// The request.
        rid: u64,
    },
    /// A batch prepared with one cache was passed to `alloc_for_*` with another (or prepared
    /// before a [`reclaim_leaks`](crate::check::reclaim_leaks), which renames the cache).
    #[error(
        "the batch was prepared for cache {prepared} but allocated in cache {used}; prepare \
         and allocate a batch with the same cache"
    )]
    PreparedForOtherCache {
        /// The cache `prepare_for_*` checked the batch against.
        prepared: CacheId,
        /// The cache passed to `alloc_for_*`.
        used: CacheId,
    },
    /// A speculative commit would make committed exceed allocated.
    #[error(
        "request {rid}: committing {accepted} accepted tokens would reach {would_be} committed \
         tokens, beyond the {allocated} allocated; reserve with alloc_for_spec_decode first"
    )]
    CommitBeyondAllocation {
        /// The request.
        rid: u64,
        /// Tokens to commit.
        accepted: usize,
        /// Committed length after the commit.
        would_be: usize,
        /// Allocated length.
        allocated: usize,
    },
    /// The non-speculative extend and decode continue a request from its committed length, so
    /// it must own no slots past it: a speculative reservation would be written over and leak
    /// (extend), or the new token would land past positions committed without KV (decode).
    #[error(
        "request {rid} holds a speculative reservation (committed {committed}, allocated \
         {allocated}); the non-speculative extend and decode continue from the committed \
         length: keep decoding it speculatively (alloc_for_spec_decode), or release it"
    )]
    ReservationHeld {
        /// The request.
        rid: u64,
        /// Its committed length, where the extend would start.
        committed: usize,
        /// Its allocated length.
        allocated: usize,
    },
    /// A cache is built around an empty prefix cache.
    #[error(
        "the prefix cache already holds {cached} tokens, whose pages the allocator does not \
         know as cached; build the KvCache with an empty RadixCache and fill it through the \
         batch flow"
    )]
    PrefixCacheNotEmpty {
        /// Tokens the prefix cache holds.
        cached: usize,
    },
    /// A cache is built around an allocator that has slots taken or a free group open.
    #[error(
        "the allocator has {taken} of its {capacity} slots taken{}, by no request of the new \
         cache; build the KvCache with an allocator whose slots are all free",
        if *free_group_open { " and a free group open" } else { "" }
    )]
    AllocatorInUse {
        /// Slots not available (allocated, or freed into a free group that is still open).
        taken: usize,
        /// The allocator's capacity in slots.
        capacity: usize,
        /// Whether a free group was open.
        free_group_open: bool,
    },
    /// A cache is built around a request-to-token table with rows held.
    #[error(
        "the request-to-token table has {held} of its {rows} rows held, by no request of the \
         new cache; build the KvCache with a fresh table (or `clear` it first)"
    )]
    RowsInUse {
        /// Rows held.
        held: usize,
        /// Rows in the table (row 0, the padding row, not counted).
        rows: usize,
    },
    /// A per-request argument list does not match the batch.
    #[error("expected one entry per request ({expected}), got {got}")]
    BatchLengthMismatch {
        /// Requests in the batch.
        expected: usize,
        /// Entries given.
        got: usize,
    },
    /// The allocator and the prefix cache disagree on the page size (the prefix cache's own
    /// refusal included).
    #[error(transparent)]
    PageSizeMismatch(PageSizeMismatch),
    /// The slot allocator rejected a call (an internal inconsistency when reached here); its
    /// out-of-memory is [`KvError::OutOfMemory`].
    #[error(transparent)]
    Alloc(AllocError),
    /// The request pool rejected a call.
    #[error(transparent)]
    Slot(#[from] SlotError),
    /// The prefix cache rejected a call; its page-size refusal is [`KvError::PageSizeMismatch`].
    #[error(transparent)]
    Radix(RadixError),
}

/// The shared refusals go to their one variant, whichever layer made them.
impl From<AllocError> for KvError {
    fn from(error: AllocError) -> Self {
        match error {
            AllocError::OutOfMemory(memory) => KvError::OutOfMemory(memory),
            error => KvError::Alloc(error),
        }
    }
}

/// The shared refusals go to their one variant, whichever layer made them.
impl From<RadixError> for KvError {
    fn from(error: RadixError) -> Self {
        match error {
            RadixError::PageSizeMismatch(mismatch) => KvError::PageSizeMismatch(mismatch),
            error => KvError::Radix(error),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shared_refusal_from_a_wrapped_layer_is_its_one_variant() {
        let memory = OutOfMemory {
            requested: 8,
            available: 4,
            evictable: 0,
        };
        assert_eq!(
            KvError::from(AllocError::OutOfMemory(memory)),
            KvError::OutOfMemory(memory)
        );
        let mismatch = PageSizeMismatch {
            allocator: 4,
            cache: 16,
        };
        assert_eq!(
            KvError::from(RadixError::PageSizeMismatch(mismatch)),
            KvError::PageSizeMismatch(mismatch)
        );
        let rest = AllocError::UnalignedAlloc {
            num_tokens: 3,
            page_size: 4,
        };
        assert_eq!(KvError::from(rest.clone()), KvError::Alloc(rest));
    }
}
