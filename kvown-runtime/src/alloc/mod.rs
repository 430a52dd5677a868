//! KV slot allocators: page size 1 ([`TokenAllocator`]) and paged ([`PagedAllocator`]).
//!
//! Slots are rows of the KV buffers. Page `p` covers slots `[p * page_size, (p + 1) * page_size)`;
//! page 0 (slots `0..page_size`) is reserved as padding and is never handed out.
//!
//! Every fallible call is transactional: on `Err` the allocator is as before the call, with one
//! exception that changes no ownership: in `need_sort` mode a call answered out of memory keeps
//! the merge of the release list it made first, as sglang's does.
//!
//! A batched extend takes, per request, the rest of its partial last page, then whole new
//! pages, then a partial page for its tail (sglang `alloc_extend`); a decode takes a new page
//! only when the new token opens one:
//!
//! ```
//! use kvown_runtime::alloc::{DecodeShape, ExtendShape, KvAllocator, PagedAllocator};
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
//! allocator.free_page_ids(&pages).unwrap();
//! assert_eq!(allocator.available_size(), (16 - 2) * 4);
//! ```

mod allocator;
mod error;
mod free_list;
mod geometry;
mod page_state;
mod paged;
mod reuse;
mod rules;
mod token;
#[cfg(test)]
mod trusted_tests;

pub use allocator::PageAllocator;
pub use error::{AllocError, InvariantViolation};
pub use geometry::PageGeometry;
pub use page_state::PageState;
pub use paged::PagedAllocator;
pub use reuse::{Fifo, Lifo, ReuseOrder};
pub use rules::ContinuedPages;
pub use token::TokenAllocator;

use crate::slots::{ReqRow, ReqToTokenPool};

pub use crate::ids::{KvSlot, PageId};

/// Rounds `n` up to a multiple of `page_size`.
///
/// # Panics
/// If `page_size` is 0, or (in debug builds; release builds wrap) if the result exceeds
/// `usize::MAX`.
#[inline]
pub const fn ceil_align(n: usize, page_size: usize) -> usize {
    n.div_ceil(page_size) * page_size
}

/// Rounds `n` down to a multiple of `page_size`.
///
/// # Panics
/// If `page_size` is 0.
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
/// goes to position `len` of `row`, after its last stored token at `len - 1`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodeRow {
    /// The request's row.
    pub row: ReqRow,
    /// Tokens stored in the row before the step (`kv_allocated_len`); at least 1.
    pub len: usize,
}

/// One request of a batched extend, by its place in the request-to-token table
/// ([`KvAllocator::alloc_extend_rows`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExtendRow<'a> {
    /// The request's row.
    pub row: ReqRow,
    /// Slots written to positions `[0, prefix.len())` of a new row before its new slots (a
    /// matched prefix); empty for a row the request already holds.
    pub prefix: &'a [KvSlot],
}

/// A decode batch given by rows that a [`KvCache`](crate::cache::KvCache)'s batch flow has
/// already checked (`prepare_for_decode`): every row is held by exactly one request of the
/// batch, each `len` is that request's allocated length, in `1..width`, and `new_pages` of the
/// new tokens open a page. Only this crate builds one, so an allocator may trust it and skip the
/// per-request checks of [`KvAllocator::alloc_decode_table`]
/// ([`KvAllocator::alloc_decode_trusted`]). Not `Clone`: one batch is allocated once (an
/// allocator that wraps another passes it on).
#[derive(Debug)]
pub struct TrustedDecodeRows<I> {
    rows: I,
    new_pages: usize,
}

impl<I> TrustedDecodeRows<I>
where
    I: ExactSizeIterator<Item = DecodeRow> + Clone,
{
    /// Wraps rows the caller has checked as the type promises.
    pub(crate) fn new(rows: I, new_pages: usize) -> Self {
        TrustedDecodeRows { rows, new_pages }
    }

    /// The requests, in batch order.
    pub fn rows(&self) -> I {
        self.rows.clone()
    }

    /// How many of the new tokens open a page: the pages the step takes.
    pub fn new_pages(&self) -> usize {
        self.new_pages
    }
}

/// The allocator interface the batch flow, the radix cache and the backends share.
///
/// Batched calls append to `out` (the batch's `out_cache_loc`) in request order and leave `out`
/// untouched on error.
///
/// Four provided methods tell the allocator where the batch flow writes the request-to-token
/// table: [`KvAllocator::alloc_extend_rows`], [`KvAllocator::alloc_decode_table`],
/// [`KvAllocator::alloc_decode_trusted`] and [`KvAllocator::row_written`]. Their defaults cost
/// nothing; an allocator that wraps another to keep a copy of the table (kvown-cuda's
/// `StagedAllocator`, which ships each step's table writes to the GPU) overrides them.
pub trait KvAllocator {
    /// Slots per page (1 for [`TokenAllocator`]).
    fn page_size(&self) -> usize;
    /// Slots that can ever be handed out (reserved page excluded).
    fn capacity(&self) -> usize;
    /// Slots free now (pages free × page size), deferred frees excluded.
    fn available_size(&self) -> usize;
    /// Allocates `num_tokens` slots (a multiple of the page size) as whole pages, in free-list order.
    fn alloc(&mut self, num_tokens: usize, out: &mut Vec<KvSlot>) -> Result<(), AllocError>;
    /// Batched extend allocation (sglang `alloc_extend`, three parts per request).
    ///
    /// A `last_loc` must be the caller's own: the allocator checks that it lies in an allocated
    /// page at the offset `prefix_len` implies, and that no two requests of the batch continue
    /// one partial page, but not whose page it is across calls. A request continuing another's
    /// partial page gets that request's next slots, and the check is
    /// [`PageLedger`](crate::check::PageLedger) (or [`KvCache::check`](crate::cache::KvCache::check),
    /// whose batch flow reads each `last_loc` from the request's own row).
    fn alloc_extend(
        &mut self,
        reqs: &[ExtendShape],
        out: &mut Vec<KvSlot>,
    ) -> Result<(), AllocError>;
    /// Batched decode allocation, one slot per request (new page only at a page boundary).
    /// Whose page a `last_loc` is the allocator cannot know, as for
    /// [`KvAllocator::alloc_extend`]; [`KvAllocator::alloc_decode_table`] reads it from the
    /// request's row.
    fn alloc_decode(
        &mut self,
        reqs: &[DecodeShape],
        out: &mut Vec<KvSlot>,
    ) -> Result<(), AllocError>;
    /// Frees the pages that contain `slots` (each page once). Validates before changing anything.
    fn free(&mut self, slots: &[KvSlot]) -> Result<(), AllocError>;
    /// Frees `row[start_pos .. start_pos + slots.len()]` of one request, page by page.
    fn free_segment(&mut self, slots: &[KvSlot], start_pos: usize) -> Result<(), AllocError>;
    /// Frees several segments of one request's row in one call (sglang `free_segments`):
    /// segments that meet inside a page free that page once (with the earlier segment). All or
    /// nothing. The free list ends as sglang's segment-by-segment frees leave it: with LIFO reuse
    /// outside a free group, the last segment's pages first.
    fn free_segments(&mut self, segments: &[(&[KvSlot], usize)]) -> Result<(), AllocError>;
    /// Frees whole pages named by id, which go back to the free list in the order given, as
    /// [`KvAllocator::free_segment`] puts a row's pages (a page named twice is freed once).
    /// The prefix cache evicts with it: its nodes keep page ids, so no slot list is built. All
    /// or nothing.
    fn free_page_ids(&mut self, pages: &[PageId]) -> Result<(), AllocError>;
    /// Starts deferring frees until [`KvAllocator::free_group_end`]. Groups do not nest: a
    /// second begin fails with [`AllocError::NestedFreeGroup`] and keeps the open group.
    fn free_group_begin(&mut self) -> Result<(), AllocError>;
    /// Applies every free deferred since [`KvAllocator::free_group_begin`] as one update
    /// (a no-op when nothing was deferred). Fails with [`AllocError::NotInFreeGroup`] when no
    /// group is open.
    fn free_group_end(&mut self) -> Result<(), AllocError>;
    /// Whether a free group is open: frees made now stay deferred, and their pages unavailable,
    /// until [`KvAllocator::free_group_end`].
    fn in_free_group(&self) -> bool;

    /// Allocates `num_pages` whole pages, in free-list order, and appends their ids to `out`:
    /// [`KvAllocator::alloc`] at page granularity (page `p` backs slots
    /// `p * page_size .. (p + 1) * page_size`), for callers that keep page ids, as a block
    /// table or the prefix cache does. [`KvAllocator::free_page_ids`] gives them back. On error
    /// (out of memory) nothing is taken and `out` is untouched.
    ///
    /// The default allocates the slots with [`KvAllocator::alloc`] and keeps each page's first
    /// one, so an allocator that mirrors `alloc` mirrors this too.
    fn alloc_page_ids(
        &mut self,
        num_pages: usize,
        out: &mut Vec<PageId>,
    ) -> Result<(), AllocError> {
        let page_size = self.page_size();
        let available = self.available_size();
        // Refused before the slots' buffer is reserved, which for a huge count would abort.
        let num_tokens = num_pages
            .checked_mul(page_size)
            .filter(|&tokens| tokens <= available)
            .ok_or(AllocError::OutOfMemory {
                requested: num_pages.saturating_mul(page_size),
                available,
            })?;
        let mut slots = Vec::with_capacity(num_tokens);
        self.alloc(num_tokens, &mut slots)?;
        out.extend(
            slots
                .iter()
                .step_by(page_size)
                .map(|&slot| slot / page_size as KvSlot),
        );
        Ok(())
    }

    /// [`KvAllocator::alloc_extend`] for requests whose request-to-token rows are known: the
    /// `i`-th item of `rows` is the row of `reqs[i]`, which gets the new slots at positions
    /// `[prefix_len, seq_len)`, after `prefix` at positions `[0, prefix.len())` when the row is
    /// new and takes a matched prefix (the batch flow writes the host table itself). An
    /// allocator that keeps a copy of the table, such as a device stager, writes its copy in the
    /// same step. The default ignores `rows` without iterating it, so it costs nothing.
    fn alloc_extend_rows<'a>(
        &mut self,
        reqs: &[ExtendShape],
        rows: impl Iterator<Item = ExtendRow<'a>>,
        out: &mut Vec<KvSlot>,
    ) -> Result<(), AllocError>
    where
        Self: Sized,
    {
        let _ = rows;
        self.alloc_extend(reqs, out)
    }

    /// [`KvAllocator::alloc_decode`] for requests given by their rows, writing the
    /// request-to-token table too: request `i` of `reqs` gets its new slot at position `len` of
    /// its row, and `out[i]` is that slot. Its shape comes from the table (the last stored
    /// token's slot at `len - 1`); each row may appear once ([`DecodeRow::read_shapes`] names
    /// the errors). All or nothing: on error neither `table` nor `out` changed.
    /// The iterator is cloned when the allocator needs a second look.
    ///
    /// The default reads the shapes, calls [`KvAllocator::alloc_decode`] and writes the
    /// table; an allocator that keeps a copy of the table, such as a device stager, writes its
    /// copy in the same step. (The batch flow calls [`KvAllocator::alloc_decode_trusted`], where
    /// the paged allocator reads and writes each row once.)
    fn alloc_decode_table<I>(
        &mut self,
        reqs: I,
        table: &mut ReqToTokenPool,
        out: &mut Vec<KvSlot>,
    ) -> Result<(), AllocError>
    where
        Self: Sized,
        I: ExactSizeIterator<Item = DecodeRow> + Clone,
    {
        let shapes = DecodeRow::read_shapes(reqs.clone(), table)?;
        let start = out.len();
        self.alloc_decode(&shapes, out)?;
        for (req, &slot) in reqs.zip(&out[start..]) {
            table.set_held(req.row, req.len, slot);
        }
        Ok(())
    }

    /// [`KvAllocator::alloc_decode_table`] for a batch the batch flow has checked: the result
    /// is the same, and the only error is out of memory (nothing changed). The paged allocator
    /// skips the per-request checks the batch already passed (and the undo log they need),
    /// verifying them only in debug builds. The default calls
    /// [`KvAllocator::alloc_decode_table`].
    fn alloc_decode_trusted<I>(
        &mut self,
        batch: TrustedDecodeRows<I>,
        table: &mut ReqToTokenPool,
        out: &mut Vec<KvSlot>,
    ) -> Result<(), AllocError>
    where
        Self: Sized,
        I: ExactSizeIterator<Item = DecodeRow> + Clone,
    {
        self.alloc_decode_table(batch.rows, table, out)
    }

    /// Tells the allocator that the batch flow wrote `slots` to positions
    /// `[start_pos, start_pos + slots.len())` of request-to-token row `row` other than
    /// through an allocation (a matched prefix copied into a new row, a row pointed at the
    /// prefix cache's slots), so that a copy of the table can follow. The default does
    /// nothing.
    fn row_written(&mut self, row: ReqRow, start_pos: usize, slots: &[KvSlot]) {
        let _ = (row, start_pos, slots);
    }
}

/// An allocator whose bookkeeping is a host [`PageAllocator`]: the allocator itself, or a
/// wrapper that keeps one as its authoritative state (the CUDA stager). The invariant checker
/// ([`KvCache::check`](crate::cache::KvCache::check)) reads that state.
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
