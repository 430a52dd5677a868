//! Errors of the KV slot allocators: rejected calls ([`AllocError`]) and broken invariants
//! found by `check()` ([`InvariantViolation`]).

use super::{KvSlot, PageId, PageState};
use crate::shared_error::{OutOfMemory, PageOutOfRange};

/// Why an allocator call was rejected. The allocator is unchanged after any of these.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AllocError {
    /// Not enough free slots: the caller adds the prefix cache's evictable size to
    /// `available` and evicts the difference.
    #[error(transparent)]
    OutOfMemory(OutOfMemory),
    /// `alloc` takes whole pages only.
    #[error(
        "cannot allocate {num_tokens} slots: not a multiple of the page size {page_size} \
         (round up with ceil_align)"
    )]
    UnalignedAlloc {
        /// The size passed to `alloc`.
        num_tokens: usize,
        /// The allocator's page size.
        page_size: usize,
    },
    /// A slot beyond the last page.
    #[error("slot {slot} is out of range: this allocator's slots end before {slot_end}")]
    SlotOutOfRange {
        /// The offending slot.
        slot: KvSlot,
        /// One past the largest valid slot.
        slot_end: u64,
    },
    /// `free_page_ids` named a page that no allocation hands out: page 0 (padding) or one beyond
    /// the last page.
    #[error(
        "page {} is not an allocatable page: pages are 1..{} (page 0 is padding)",
        .0.page,
        .0.pages
    )]
    PageOutOfRange(PageOutOfRange),
    /// A slot of page 0, the padding page, which is never allocated.
    #[error(
        "slot {slot} lies in the reserved padding page (slots 0..{page_size}) and is never allocated"
    )]
    ReservedSlot {
        /// The offending slot.
        slot: KvSlot,
        /// The allocator's page size.
        page_size: usize,
    },
    /// The page is already free, released or deferred in the current free group.
    #[error("double free: page {page} (slot {slot}) is already {state:?}")]
    DoubleFree {
        /// The slot that named the page.
        slot: KvSlot,
        /// The page.
        page: PageId,
        /// The page's state: `Free`, `Released` or `Deferred`.
        state: PageState,
    },
    /// The page has not been handed out since the allocator was created or cleared.
    #[error(
        "slot {slot} (page {page}) is not allocated: it was never handed out since the last clear"
    )]
    NotAllocated {
        /// The slot that named the page.
        slot: KvSlot,
        /// The page.
        page: PageId,
    },
    /// `free_segment` got slots whose pages do not follow the row layout.
    #[error(
        "free_segment: slot {slot} at segment offset {offset} is not in page {expected_page} like \
         the slots before it; pass a run of one request's row (the slots of a page are consecutive)"
    )]
    SegmentNotPaged {
        /// Index into the segment.
        offset: usize,
        /// The slot found there.
        slot: KvSlot,
        /// The page the row layout requires.
        expected_page: usize,
    },
    /// An extend shape with `seq_len < prefix_len`.
    #[error("request {request}: prefix_len {prefix_len} exceeds seq_len {seq_len}")]
    PrefixExceedsSeq {
        /// Index of the request in the batch.
        request: usize,
        /// Its prefix length.
        prefix_len: usize,
        /// Its sequence length.
        seq_len: usize,
    },
    /// An extend shape with a prefix but no `last_loc`.
    #[error(
        "request {request}: prefix_len {prefix_len} > 0 needs last_loc, the slot of the last prefix token"
    )]
    MissingLastLoc {
        /// Index of the request in the batch.
        request: usize,
        /// Its prefix length.
        prefix_len: usize,
    },
    /// An extend shape with `prefix_len == 0` and a `last_loc`.
    #[error("request {request}: last_loc {last_loc} given with prefix_len 0 (pass None)")]
    UnexpectedLastLoc {
        /// Index of the request in the batch.
        request: usize,
        /// The stray slot.
        last_loc: KvSlot,
    },
    /// `last_loc` is not at the page offset that the prefix length implies.
    #[error(
        "request {request}: last_loc {last_loc} does not fit prefix_len {prefix_len}: \
         (last_loc + 1) % {page_size} must equal prefix_len % {page_size}"
    )]
    LastLocMismatch {
        /// Index of the request in the batch.
        request: usize,
        /// The slot of the last stored token.
        last_loc: KvSlot,
        /// Tokens already stored (for decode: `seq_len - 1`).
        prefix_len: usize,
        /// The allocator's page size.
        page_size: usize,
    },
    /// `last_loc` is not a slot of an allocated page.
    #[error("request {request}: last_loc {last_loc} is not a slot of an allocated page")]
    LastLocNotAllocated {
        /// Index of the request in the batch.
        request: usize,
        /// The offending slot.
        last_loc: KvSlot,
    },
    /// `last_loc` is not the last slot handed out in its page: another request continued the
    /// page since (or the slot was never handed out), so continuing from it would hand out a
    /// slot twice. Each page keeps a fill mark to tell.
    #[error(
        "request {request}: last_loc {last_loc} is not the last slot handed out in page {page} \
         (that is slot {latest}): a request continues its page only from its own last slot; \
         read last_loc from the request's own row"
    )]
    LastLocNotLatest {
        /// Index of the request in the batch.
        request: usize,
        /// The slot given as the last stored one.
        last_loc: KvSlot,
        /// Its page.
        page: PageId,
        /// The last slot handed out in that page.
        latest: KvSlot,
    },
    /// Two requests of one batch continue the same partially filled page: both would be
    /// given its next slots (sglang's kernels hand the slots out twice). A partial last page
    /// belongs to one request; requests whose prefix ends at a page boundary may share it.
    #[error(
        "request {request}: last_loc {last_loc} lies in page {page}, the partially filled last \
         page of request {first} of this batch too; each request must continue a partial page \
         of its own (copy a shared partial page, or share prefixes only up to a page boundary)"
    )]
    SharedPartialPage {
        /// Index of the second request in the batch.
        request: usize,
        /// Its last stored slot.
        last_loc: KvSlot,
        /// The shared page.
        page: PageId,
        /// Index of the first request whose partial last page it is.
        first: usize,
    },
    /// A decode shape without a stored token before the new one.
    #[error(
        "request {request}: decode seq_len {seq_len} must be at least 2 (one stored token plus \
         the new one); allocate a first token with alloc_extend"
    )]
    DecodeSeqTooShort {
        /// Index of the request in the batch.
        request: usize,
        /// Its post-step sequence length.
        seq_len: usize,
    },
    /// A [`DecodeRow`](super::DecodeRow) whose row no request holds.
    #[error(
        "request {request}: row {row} is not held in the request-to-token table; decode a \
         request by the row its extend assigned"
    )]
    DecodeRowNotHeld {
        /// Index of the request in the batch.
        request: usize,
        /// The row.
        row: usize,
    },
    /// A [`DecodeRow`](super::DecodeRow) with no stored token, or no room for the new one.
    #[error(
        "request {request}: cannot decode after {len} stored tokens: a decode needs \
         1 <= len < {width} (a stored token, and room in the row for the new one)"
    )]
    DecodePositionOutOfRange {
        /// Index of the request in the batch.
        request: usize,
        /// Tokens stored in the row before the step.
        len: usize,
        /// Positions per row of the table.
        width: usize,
    },
    /// A decode batch given by rows names one row twice.
    #[error(
        "request {request}: row {row} was already named by request {first} of this decode \
         batch; each request decodes one token per step"
    )]
    DecodeRowRepeated {
        /// Index of the second request naming the row.
        request: usize,
        /// The row.
        row: usize,
        /// Index of the first request naming it.
        first: usize,
    },
    /// A free group opened while one is open (sglang's nested `free_group_begin` silently
    /// drops the deferred frees).
    #[error(
        "a free group is open already ({deferred_pages} pages deferred): commit it (drop its \
         guard or call commit) before opening another"
    )]
    NestedFreeGroup {
        /// Pages deferred in the open group.
        deferred_pages: usize,
    },
    /// A page size of 0.
    #[error("page size must be at least 1")]
    ZeroPageSize,
    /// The pool's slot ids, up to the end of its last page, would not fit in [`KvSlot`].
    #[error(
        "{num_pages} pages of {page_size} slots end at slot {slot_end}, past u32::MAX: take \
         fewer or smaller pages, so that every slot id and the end of the last page fit in a u32"
    )]
    TooManySlots {
        /// Requested pages (excluding page 0).
        num_pages: usize,
        /// Requested page size.
        page_size: usize,
        /// One past the largest slot id the pool would use (`u64::MAX` when that overflows).
        slot_end: u64,
    },
    /// The pool's bookkeeping does not fit in memory: the system allocator refused it.
    #[error(
        "cannot allocate the bookkeeping of {num_pages} pages of {page_size} slots (about \
         {bookkeeping_bytes} bytes): the host refused the memory; take fewer pages"
    )]
    PoolTooLarge {
        /// Requested pages (excluding page 0).
        num_pages: usize,
        /// Requested page size.
        page_size: usize,
        /// Bytes the bookkeeping needs (11 per page).
        bookkeeping_bytes: usize,
    },
    /// A pool size that is not a whole number of pages: the allocator would silently leave the
    /// remainder unused.
    #[error(
        "a pool of {size} slots is not a whole number of pages of {page_size} slots; pass \
         {nearest} ({} pages) instead",
        .nearest / .page_size
    )]
    UnalignedPoolSize {
        /// The size passed.
        size: usize,
        /// The page size passed.
        page_size: usize,
        /// The largest whole number of pages below `size`, in slots (the next one above when
        /// that is 0).
        nearest: usize,
    },
}

/// A broken allocator invariant, reported by `check()`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvariantViolation {
    /// Page 0 is not marked reserved, or another page is.
    #[error("page {page} has state {state:?}; exactly page 0 must be Reserved")]
    Reserved {
        /// The page.
        page: usize,
        /// Its state.
        state: PageState,
    },
    /// A list holds a page id outside `1..pages`.
    #[error("the {list} list holds a page outside 1..{}: {range}", .range.pages)]
    PageOutOfRange {
        /// `"free"`, `"release"` or `"deferred"`.
        list: &'static str,
        /// The page id found, and the pages there are.
        range: PageOutOfRange,
    },
    /// A page appears twice across the free, release and deferred lists.
    #[error("page {page} appears more than once (second time in the {list} list)")]
    DuplicatePage {
        /// `"free"`, `"release"` or `"deferred"`.
        list: &'static str,
        /// The duplicated page.
        page: PageId,
    },
    /// A list holds a page whose state says it belongs elsewhere.
    #[error("the {list} list holds page {page}, whose state is {state:?}")]
    StateMismatch {
        /// `"free"`, `"release"` or `"deferred"`.
        list: &'static str,
        /// The page.
        page: PageId,
        /// Its state.
        state: PageState,
    },
    /// A page's state says it is in a list, but no list holds it.
    #[error("page {page} has state {state:?} but is in no list")]
    MissingFromList {
        /// The page.
        page: usize,
        /// Its state.
        state: PageState,
    },
    /// Pages are deferred while no free group is open.
    #[error("{count} pages are deferred outside a free group")]
    DeferredOutsideGroup {
        /// Deferred pages.
        count: usize,
    },
    /// A held page's fill mark names no slot of the page, so a continuation of it would be
    /// judged against a slot it does not have.
    #[error("held page {page}'s fill mark {mark} names no slot of its {page_size} slots")]
    FillMarkOutsidePage {
        /// The page.
        page: usize,
        /// Its fill mark (the low 16 bits of its last handed-out slot).
        mark: u16,
        /// Slots per page.
        page_size: usize,
    },
    /// Pages wait in the release list although `need_sort` is off.
    #[error("{count} pages are in the release list although need_sort is off")]
    ReleaseWithoutNeedSort {
        /// Released pages.
        count: usize,
    },
}
