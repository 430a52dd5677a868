//! KV slot allocators: page size 1 ([`TokenAllocator`]) and paged ([`PagedAllocator`]).
//!
//! Slots are rows of the KV buffers. Page `p` covers slots `[p * page_size, (p + 1) * page_size)`;
//! page 0 (slots `0..page_size`) is reserved as padding and is never handed out.
//!
//! Every fallible call is transactional: on `Err` the allocator is as before the call, with one
//! exception that changes no ownership: in `need_sort` mode a call answered out of memory keeps
//! the merge of the release list it made first (`docs/design.md`, sglang's rules by topic).
//!
//! [`KvAllocator`] is what an allocator is: its sizes, the batched extend and decode, whole pages
//! by id, and free groups. The slot-level calls (`alloc`, `free`, `free_segment`,
//! `free_segments`, `alloc_decode_table`) are [`SlotCalls`], built on those for every
//! allocator; [`AllocatorLayer`] wraps an allocator and changes only the calls it names.
//!
//! A batched extend takes, per request, the rest of its partial last page, then whole new
//! pages, then a partial page for its tail (sglang `alloc_extend`); a decode takes a new page
//! only when the new token opens one:
//!
//! ```
//! use kvown_runtime::alloc::{
//!     DecodeShape, ExtendShape, FreeOrder, KvAllocator, PagedAllocator, SlotCalls,
//! };
//!
//! let mut allocator = PagedAllocator::new(64, 4, false).unwrap(); // pages 1..=16 free
//! let mut out = Vec::new();
//! let batch = [
//!     ExtendShape { prefix_len: 0, seq_len: 5, last_loc: None }, // page 1 whole, page 2 tail
//!     ExtendShape { prefix_len: 0, seq_len: 3, last_loc: None }, // page 3 tail
//! ];
//! allocator.alloc_extend(&batch, &mut out).unwrap();
//! assert_eq!(out, [4, 5, 6, 7, 8, 12, 13, 14]);
//!
//! out.clear(); // position 5 continues page 2; position 3 continues page 3
//! let decode = [
//!     DecodeShape { seq_len: 6, last_loc: 8 },
//!     DecodeShape { seq_len: 4, last_loc: 14 },
//! ];
//! allocator.alloc_decode(&decode, &mut out).unwrap();
//! assert_eq!(out, [9, 15]);
//! assert_eq!(allocator.available_size(), (16 - 3) * 4);
//!
//! // Slot 8 is no longer the last slot handed out in page 2: continuing from it again would
//! // hand out slot 9 twice, and is refused.
//! assert!(allocator.alloc_decode(&[DecodeShape { seq_len: 6, last_loc: 8 }], &mut out).is_err());
//!
//! // Freeing a page twice is a typed error that changes nothing.
//! allocator.free(&[12, 13, 14, 15]).unwrap();
//! assert!(allocator.free(&[12]).is_err());
//! assert_eq!(allocator.available_size(), (16 - 2) * 4);
//!
//! // Whole pages by id, for callers that keep page ids (a block table, the prefix cache).
//! // Freed page 3 went back to the head of the free list (LIFO), so it is handed out first.
//! let mut pages = Vec::new();
//! allocator.alloc_page_ids(2, &mut pages).unwrap();
//! assert_eq!(pages, [3, 4]);
//! allocator.free_page_ids(&pages, FreeOrder::Given).unwrap();
//! assert_eq!(allocator.available_size(), (16 - 2) * 4);
//! ```

mod error;
mod free_list;
mod geometry;
mod group;
mod layer;
mod page_allocator;
mod page_state;
mod paged;
mod requests;
mod reuse;
mod rules;
mod slot_calls;
mod token;

pub use error::{AllocError, InvariantViolation};
pub use geometry::PageGeometry;
pub(crate) use group::Deferring;
pub use group::{FreeGroup, GroupStep};
pub use layer::AllocatorLayer;
pub use page_allocator::PageAllocator;
pub use page_state::PageState;
pub use paged::PagedAllocator;
pub(crate) use requests::Sealed;
pub use requests::{DecodeRequest, DecodeRequests};
pub use reuse::{Fifo, Lifo, ReuseOrder};
pub use rules::ContinuedPages;
pub use slot_calls::SlotCalls;
pub use token::TokenAllocator;

pub use crate::ids::{KvSlot, PageId};
use crate::slots::ReqRow;

/// Rounds `n` up to a multiple of `page_size`.
///
/// # Panics
/// If `page_size` is 0, or (in debug builds; release builds wrap) if the result exceeds
/// `usize::MAX`.
///
/// # Examples
///
/// ```
/// # use kvown_runtime::alloc::ceil_align;
/// assert_eq!(ceil_align(10, 4), 12);
/// assert_eq!(ceil_align(12, 4), 12);
/// ```
#[inline]
pub const fn ceil_align(n: usize, page_size: usize) -> usize {
    n.div_ceil(page_size) * page_size
}

/// Rounds `n` down to a multiple of `page_size`.
///
/// # Panics
/// If `page_size` is 0.
///
/// # Examples
///
/// ```
/// # use kvown_runtime::alloc::floor_align;
/// assert_eq!(floor_align(10, 4), 8);
/// assert_eq!(floor_align(3, 4), 0);
/// ```
#[inline]
pub const fn floor_align(n: usize, page_size: usize) -> usize {
    n / page_size * page_size
}

/// One request's share of a batched extend allocation: positions `[prefix_len, seq_len)` are new.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExtendShape {
    /// Tokens already backed by slots (the request's prefix).
    pub prefix_len: usize,
    /// Tokens backed after this allocation; `seq_len >= prefix_len`.
    pub seq_len: usize,
    /// Slot of the last prefix token, `None` when `prefix_len == 0`.
    pub last_loc: Option<KvSlot>,
}

/// One request's share of a batched decode allocation: exactly one new token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodeShape {
    /// Length after the new token (the post-step length, as in sglang).
    pub seq_len: usize,
    /// Slot of the last stored token (position `seq_len - 2`).
    pub last_loc: KvSlot,
}

/// One request of a decode step, by its place in the request-to-token table: its new token
/// goes to position `len` of `row`, after its last stored token at `len - 1`
/// ([`SlotCalls::alloc_decode_table`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodeRow {
    /// The request's row.
    pub row: ReqRow,
    /// Tokens stored in the row before the step (`kv_allocated_len`); at least 1.
    pub len: usize,
}

/// Where freed pages go back in the free list: how [`KvAllocator::free_page_ids`] orders them.
/// (`need_sort` allocators put every freed page in their release list, sorted at the next
/// merge, so the order only matters without it.)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FreeOrder<'a> {
    /// In the order given, as one call: the prefix cache's page ids, one segment of a row.
    Given,
    /// As a plain `free` of slots (sglang `free`): sorted ascending where freed pages are
    /// reused first ([`Lifo`]), in the order given where they are reused last ([`Fifo`]).
    /// Inside a free group they go after the ordered frees, sorted at its end.
    Unordered,
    /// As consecutive calls, one per segment, segment `i` ending before `pages[ends[i]]`
    /// (sglang frees a row's segments one by one): outside a free group, with LIFO reuse, the
    /// last segment's pages end up first. `ends` must rise to `pages.len()`.
    Segments(&'a [usize]),
}

/// The allocator interface the batch flow, the radix cache and the backends share: what an
/// allocator is, nine calls. The slot-level calls are [`SlotCalls`], for every allocator.
///
/// Batched calls append to `out` (the batch's `out_cache_loc`) in request order and leave `out`
/// untouched on error. Implement it for a new allocator; to change some calls of an existing
/// one, implement [`AllocatorLayer`] instead.
///
/// # Examples
///
/// ```
/// use kvown_runtime::alloc::{DecodeShape, ExtendShape, FreeOrder, KvAllocator, PagedAllocator};
///
/// let mut allocator = PagedAllocator::new(32, 4, false)?; // pages 1..=8 of 4 slots
/// assert_eq!((allocator.page_size(), allocator.capacity()), (4, 32));
/// let mut slots = Vec::new();
/// let prompt = ExtendShape { prefix_len: 0, seq_len: 3, last_loc: None };
/// allocator.alloc_extend(&[prompt], &mut slots)?; // 3 slots of one page
/// allocator.alloc_decode(&[DecodeShape { seq_len: 4, last_loc: slots[2] }], &mut slots)?;
/// assert_eq!(slots, [4, 5, 6, 7], "page 1, filled in order");
/// let mut pages = Vec::new();
/// allocator.alloc_page_ids(2, &mut pages)?;
/// assert_eq!(allocator.available_size(), 5 * 4);
/// allocator.free_page_ids(&pages, FreeOrder::Given)?;
/// assert!(allocator.free_page_ids(&pages, FreeOrder::Given).is_err(), "a double free");
/// assert_eq!(allocator.available_size(), 7 * 4);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// A free group defers frees until its guard commits:
///
/// ```
/// use kvown_runtime::alloc::{KvAllocator, PagedAllocator, SlotCalls};
///
/// let mut allocator = PagedAllocator::new(32, 4, false)?;
/// let mut slots = Vec::new();
/// allocator.alloc(8, &mut slots)?; // two pages
/// let mut group = allocator.free_group()?;
/// group.free(&slots[..4])?;
/// assert_eq!(group.available_size(), 6 * 4, "deferred until the group commits");
/// group.commit();
/// assert_eq!(allocator.available_size(), 7 * 4);
/// # Ok::<(), kvown_runtime::alloc::AllocError>(())
/// ```
pub trait KvAllocator {
    /// Slots per page (1 for [`TokenAllocator`]).
    fn page_size(&self) -> usize;
    /// Slots that can ever be handed out (reserved page excluded).
    fn capacity(&self) -> usize;
    /// Slots free now (pages free × page size), deferred frees excluded.
    fn available_size(&self) -> usize;
    /// Batched extend allocation (sglang `alloc_extend`, three parts per request).
    ///
    /// A `last_loc` must be the caller's own and the last slot handed out in its page (the
    /// allocator keeps a fill mark per page): a continuation from any other slot is refused
    /// ([`AllocError::LastLocNotLatest`]), as are two requests of the batch continuing one
    /// partial page. Whose page it is the allocator cannot know: a request continuing another's
    /// partial page right after that request's last slot gets that page's next slots, and the
    /// check is [`PageLedger`](crate::check::PageLedger) (or
    /// [`KvCache::check`](crate::cache::KvCache::check), whose batch flow reads each
    /// `last_loc` from the request's own row).
    fn alloc_extend(
        &mut self,
        reqs: &[ExtendShape],
        out: &mut Vec<KvSlot>,
    ) -> Result<(), AllocError>;
    /// Batched decode allocation, one slot per request (new page only at a page boundary),
    /// `out[start + i]` for request `i`. `reqs` are [`DecodeShape`]s (a slice, an array, a
    /// `Vec`), checked as [`KvAllocator::alloc_extend`] checks its `last_loc`s, or a batch the
    /// batch flow built from its table, which it has checked and whose rows
    /// [`DecodeRequests::assign`] writes.
    fn alloc_decode<D: DecodeRequests>(
        &mut self,
        reqs: D,
        out: &mut Vec<KvSlot>,
    ) -> Result<(), AllocError>
    where
        Self: Sized;
    /// Allocates `num_pages` whole pages, in free-list order, and appends their ids to `out`
    /// (page `p` backs slots `p * page_size .. (p + 1) * page_size`), for callers that keep page
    /// ids, as a block table or the prefix cache does. On error (out of memory) nothing is
    /// taken and `out` is untouched.
    fn alloc_page_ids(&mut self, num_pages: usize, out: &mut Vec<PageId>)
    -> Result<(), AllocError>;
    /// Frees whole pages named by id (a page named twice is freed once), back to the free list
    /// as `order` says. All or nothing: page 0 or one beyond the last, a page not handed out
    /// and a double free are typed errors that change nothing. Inside a free group the pages
    /// stay deferred until it commits.
    fn free_page_ids(&mut self, pages: &[PageId], order: FreeOrder<'_>) -> Result<(), AllocError>;
    /// Opens a free group: frees made through the returned guard stay deferred (their pages
    /// unavailable) until it commits, explicitly or when dropped, and then go back to the free
    /// list as one update (sglang `free_group_begin` / `free_group_end`). Groups do not nest:
    /// opening one through an open group's guard fails with [`AllocError::NestedFreeGroup`]
    /// and keeps the open group.
    fn free_group(&mut self) -> Result<FreeGroup<'_, Self>, AllocError>
    where
        Self: Sized,
    {
        FreeGroup::open(self)
    }
    /// The mechanism behind [`KvAllocator::free_group`]: opens or commits the group, as `step`
    /// says. Only this crate builds a [`GroupStep`] (the guards), so nothing else opens a group
    /// that no guard commits; an allocator that wraps another passes it on.
    ///
    /// # Errors
    /// [`AllocError::NestedFreeGroup`] for an open while a group is open, changing nothing.
    fn free_group_step(&mut self, step: GroupStep) -> Result<(), AllocError>;
}

/// An allocator whose bookkeeping is a host [`PageAllocator`]: the allocator itself, or a layer
/// over it ([`AllocatorLayer`], whose inner allocator's is read). The invariant checker
/// ([`KvCache::check`](crate::cache::KvCache::check)) reads that state.
///
/// # Examples
///
/// ```
/// use kvown_runtime::alloc::{AsPageAllocator, KvAllocator, PagedAllocator};
///
/// let allocator = PagedAllocator::new(32, 4, false)?;
/// let host = allocator.page_allocator(); // itself here; a layer's inner allocator otherwise
/// assert_eq!(host.num_pages(), 8);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub trait AsPageAllocator {
    /// The reuse order of the host allocator.
    type Order: ReuseOrder;
    /// The host allocator.
    fn page_allocator(&self) -> &PageAllocator<Self::Order>;
}

impl<R: ReuseOrder> AsPageAllocator for PageAllocator<R> {
    type Order = R;

    fn page_allocator(&self) -> &PageAllocator<R> {
        self
    }
}
