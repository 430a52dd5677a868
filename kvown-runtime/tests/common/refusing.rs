//! Allocators that refuse frees on demand, as one whose bookkeeping disagrees with the batch
//! flow's (or a backend that reports a device failure) would: the error paths a correct host
//! allocator never takes.
//! Included with `#[path]` by the tests that use it.

use std::cell::Cell;
use std::rc::Rc;

use kvown_runtime::alloc::{
    AllocError, AsPageAllocator, DecodeRow, DecodeShape, ExtendShape, KvAllocator, KvSlot,
    PageAllocator, PageId, TrustedDecodeRows,
};
use kvown_runtime::slots::{ReqRow, ReqToTokenPool};

/// How many more frees an allocator passes on, shared with the test that arms it: `None` (the
/// default) passes every free, `Some(n)` passes `n` more and refuses the rest.
#[derive(Debug, Clone, Default)]
pub struct FreeBudget(Rc<Cell<Option<usize>>>);

impl FreeBudget {
    /// Sets how many more frees pass (`None`: all of them).
    pub fn set(&self, frees_left: Option<usize>) {
        self.0.set(frees_left);
    }

    /// Runs `free` while the budget lasts, spending one free when it succeeds; otherwise
    /// refuses with [`AllocError::NotAllocated`] naming `first` (the first slot of the call),
    /// changing nothing.
    fn spend(
        &self,
        first: Option<KvSlot>,
        page_size: usize,
        free: impl FnOnce() -> Result<(), AllocError>,
    ) -> Result<(), AllocError> {
        match self.0.get() {
            Some(0) => {
                let slot = first.unwrap_or(0);
                Err(AllocError::NotAllocated {
                    slot,
                    page: slot / page_size as KvSlot,
                })
            }
            left => {
                free()?;
                self.0.set(left.map(|n| n - 1));
                Ok(())
            }
        }
    }
}

/// The first slot of a free of several segments, for the refusal's message.
fn first_slot(segments: &[(&[KvSlot], usize)]) -> Option<KvSlot> {
    segments
        .iter()
        .find_map(|(slots, _)| slots.first().copied())
}

/// `inner` as it is, every method passed on (the provided ones too, so its own fast paths
/// run), except that frees go through `budget`.
#[derive(Debug)]
pub struct RefusingFrees<A> {
    pub inner: A,
    pub budget: FreeBudget,
}

impl<A: KvAllocator> RefusingFrees<A> {
    /// Passes a free on to `inner` while the budget lasts ([`FreeBudget::spend`]).
    fn free_within_budget(
        &mut self,
        first: Option<KvSlot>,
        free: impl FnOnce(&mut A) -> Result<(), AllocError>,
    ) -> Result<(), AllocError> {
        let page_size = self.inner.page_size();
        let inner = &mut self.inner;
        self.budget.spend(first, page_size, || free(inner))
    }
}

impl<A: KvAllocator> KvAllocator for RefusingFrees<A> {
    fn page_size(&self) -> usize {
        self.inner.page_size()
    }

    fn capacity(&self) -> usize {
        self.inner.capacity()
    }

    fn available_size(&self) -> usize {
        self.inner.available_size()
    }

    fn alloc(&mut self, num_tokens: usize, out: &mut Vec<KvSlot>) -> Result<(), AllocError> {
        self.inner.alloc(num_tokens, out)
    }

    fn alloc_extend(
        &mut self,
        reqs: &[ExtendShape],
        out: &mut Vec<KvSlot>,
    ) -> Result<(), AllocError> {
        self.inner.alloc_extend(reqs, out)
    }

    fn alloc_decode(
        &mut self,
        reqs: &[DecodeShape],
        out: &mut Vec<KvSlot>,
    ) -> Result<(), AllocError> {
        self.inner.alloc_decode(reqs, out)
    }

    fn free(&mut self, slots: &[KvSlot]) -> Result<(), AllocError> {
        self.free_within_budget(slots.first().copied(), |inner| inner.free(slots))
    }

    fn free_segment(&mut self, slots: &[KvSlot], start_pos: usize) -> Result<(), AllocError> {
        self.free_within_budget(slots.first().copied(), |inner| {
            inner.free_segment(slots, start_pos)
        })
    }

    fn free_segments(&mut self, segments: &[(&[KvSlot], usize)]) -> Result<(), AllocError> {
        self.free_within_budget(first_slot(segments), |inner| inner.free_segments(segments))
    }

    fn free_page_ids(&mut self, pages: &[PageId]) -> Result<(), AllocError> {
        let first = pages
            .first()
            .map(|&page| page * self.inner.page_size() as KvSlot);
        self.free_within_budget(first, |inner| inner.free_page_ids(pages))
    }

    fn free_group_begin(&mut self) -> Result<(), AllocError> {
        self.inner.free_group_begin()
    }

    fn free_group_end(&mut self) -> Result<(), AllocError> {
        self.inner.free_group_end()
    }

    fn alloc_page_ids(
        &mut self,
        num_pages: usize,
        out: &mut Vec<PageId>,
    ) -> Result<(), AllocError> {
        self.inner.alloc_page_ids(num_pages, out)
    }

    fn alloc_extend_rows(
        &mut self,
        reqs: &[ExtendShape],
        rows: impl Iterator<Item = ReqRow>,
        out: &mut Vec<KvSlot>,
    ) -> Result<(), AllocError> {
        self.inner.alloc_extend_rows(reqs, rows, out)
    }

    fn alloc_decode_table<I>(
        &mut self,
        reqs: I,
        table: &mut ReqToTokenPool,
        out: &mut Vec<KvSlot>,
    ) -> Result<(), AllocError>
    where
        I: ExactSizeIterator<Item = DecodeRow> + Clone,
    {
        self.inner.alloc_decode_table(reqs, table, out)
    }

    fn alloc_decode_trusted<I>(
        &mut self,
        batch: TrustedDecodeRows<I>,
        table: &mut ReqToTokenPool,
        out: &mut Vec<KvSlot>,
    ) -> Result<(), AllocError>
    where
        I: ExactSizeIterator<Item = DecodeRow> + Clone,
    {
        self.inner.alloc_decode_trusted(batch, table, out)
    }

    fn row_written(&mut self, row: ReqRow, start_pos: usize, slots: &[KvSlot]) {
        self.inner.row_written(row, start_pos, slots);
    }
}

/// The checker reads the wrapped allocator, the state that every free passed on changed.
impl<A: AsPageAllocator> AsPageAllocator for RefusingFrees<A> {
    type Order = A::Order;

    fn page_allocator(&self) -> &PageAllocator<A::Order> {
        self.inner.page_allocator()
    }
}
