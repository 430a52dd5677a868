//! [`AllocPlanner`]: the host half of the device allocator. It keeps the device free ring's head
//! and length, validates every call, and turns a batch into the exact kernel arguments, all
//! without touching the device. The device half ([`crate::CudaPagedAllocator`]) uploads and
//! launches a plan and then commits it; the host-emulation test runs the same plans through the
//! kernel sources compiled for the CPU.

use std::marker::PhantomData;
use std::ops::Range;

use kvown_runtime::alloc::{
    AllocError, DecodeShape, ExtendShape, KvSlot, PageGeometry, PageId, ReuseOrder,
};

use crate::error::{CudaError, to_u32};
use crate::marks::BatchMarks;

/// Threads per block of the allocation kernels.
pub const ALLOC_BLOCK: u32 = 256;

/// The row of a request that has none: an allocation for it writes its slots to
/// `out_cache_loc` only, no request-to-token row (a plain allocation of whole pages is an
/// extend from 0 with this row). `NO_ROW` in `alloc.cu`.
pub const NO_ROW: u32 = u32::MAX;

/// Words per request in the `alloc_extend` parameter array:
/// `prefix_len, seq_len, last_loc, row, out_start, page_start`.
pub const EXTEND_PARAM_WORDS: usize = 6;

/// Words per request in the `alloc_decode` parameter array:
/// `seq_len, last_loc, row, page_start`.
pub const DECODE_PARAM_WORDS: usize = 4;

/// One `alloc_extend` or `alloc_decode` launch, ready to upload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllocPlan {
    /// Per-request kernel parameters ([`EXTEND_PARAM_WORDS`] or [`DECODE_PARAM_WORDS`] each).
    pub params: Vec<u32>,
    /// Requests in the batch.
    pub num_reqs: u32,
    /// Slots the launch writes to `out_cache_loc`.
    pub out_len: usize,
    /// Free-list pages the launch consumes from the head.
    pub pages: usize,
    /// The ring position of the free list's head at launch time.
    pub free_head: u32,
    /// Blocks of [`ALLOC_BLOCK`] threads.
    pub blocks: u32,
}

/// One `free_pages_write` launch: `pages` written into the ring from position `first` on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FreePlan {
    /// Distinct pages, in the order they enter the ring.
    pub pages: Vec<PageId>,
    /// Ring position of the first page.
    pub first: u32,
}

/// The device free ring's host-side state and the request-to-token table's shape, with reuse
/// order `R` (`Lifo` like `PagedAllocator`, `Fifo` like `TokenAllocator`).
///
/// Planning a batch checks that its rows, and the partial pages it continues, are distinct with
/// a stamp per row and per page (4 bytes each) instead of a hash set per call: the plans take
/// `&mut self` for those stamps, and change nothing else.
#[derive(Debug, Clone)]
pub struct AllocPlanner<R: ReuseOrder> {
    geometry: PageGeometry,
    num_pages: usize,
    free_head: usize,
    free_len: usize,
    rows: usize,
    row_len: usize,
    row_marks: BatchMarks,
    page_marks: BatchMarks,
    reuse: PhantomData<R>,
}

impl<R: ReuseOrder> AllocPlanner<R> {
    /// A planner over `size / page_size` pages, all free in order `[1, 2, …]` (ring head 0), and
    /// a table of `rows × row_len` slots. `rows` and `row_len` must fit the kernels' `u32` indices
    /// ([`CudaError::TooLarge`]).
    pub fn new(
        size: usize,
        page_size: usize,
        rows: usize,
        row_len: usize,
    ) -> Result<Self, CudaError> {
        if page_size == 0 {
            return Err(AllocError::ZeroPageSize.into());
        }
        let num_pages = size / page_size;
        // Saturating, as the host allocator: an overflow is a pool too large, not a panic.
        let slot_end = (num_pages as u64)
            .saturating_add(1)
            .saturating_mul(page_size as u64);
        if slot_end > u64::from(u32::MAX) {
            return Err(AllocError::TooManySlots {
                num_pages,
                page_size,
                slot_end,
            }
            .into());
        }
        // Row indices stay below NO_ROW; the kernels' row stride is a u32.
        to_u32("rows", rows)?;
        to_u32("row_len", row_len)?;
        rows.checked_mul(row_len).ok_or(CudaError::TooLarge {
            what: "rows * row_len",
            value: usize::MAX,
        })?;
        Ok(Self {
            geometry: PageGeometry::new(page_size),
            num_pages,
            free_head: 0,
            free_len: num_pages,
            rows,
            row_len,
            row_marks: BatchMarks::new(rows),
            page_marks: BatchMarks::new(num_pages + 1),
            reuse: PhantomData,
        })
    }

    /// Slots per page.
    pub fn page_size(&self) -> usize {
        self.geometry.page_size()
    }

    /// Pages the allocator manages (the ring's length).
    pub fn num_pages(&self) -> usize {
        self.num_pages
    }

    /// Slots that can ever be handed out.
    pub fn capacity(&self) -> usize {
        self.num_pages * self.page_size()
    }

    /// Slots free now (free pages × page size).
    pub fn available_size(&self) -> usize {
        self.free_len * self.page_size()
    }

    /// Ring position of the free list's head.
    pub fn free_head(&self) -> usize {
        self.free_head
    }

    /// Pages on the free list.
    pub fn free_len(&self) -> usize {
        self.free_len
    }

    /// Rows of the request-to-token table.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Slots per request-to-token row.
    pub fn row_len(&self) -> usize {
        self.row_len
    }

    /// The launch for a batched extend (sglang `alloc_extend`): request `i` gets slots for
    /// positions `[prefix_len, seq_len)` in row `rows[i]` (none for [`NO_ROW`]; any other row
    /// once per batch, [`CudaError::RowRepeated`]). Two requests may not continue one partial
    /// page ([`AllocError::SharedPartialPage`]). Changes nothing but the planner's scratch
    /// stamps; see [`AllocPlanner::commit`].
    pub fn plan_extend(
        &mut self,
        reqs: &[ExtendShape],
        rows: &[u32],
    ) -> Result<AllocPlan, CudaError> {
        check_row_count(reqs.len(), rows.len())?;
        let geometry = self.geometry;
        let slot_end = self.slot_end();
        // Pushed, not written in place as `plan_decode` does: zeroing the larger extend records
        // first cost more instructions than the pushes' capacity checks (callgrind, `ebda400`).
        let mut params = Vec::with_capacity(reqs.len() * EXTEND_PARAM_WORDS);
        let (mut out_start, mut page_start) = (0usize, 0usize);
        for (request, (shape, &row)) in reqs.iter().zip(rows).enumerate() {
            let ExtendShape {
                prefix_len,
                seq_len,
                ..
            } = *shape;
            let last = match shape.validate(request)? {
                None => 0,
                Some(last_loc) => {
                    self.check_last_loc(request, last_loc, prefix_len, slot_end)?;
                    last_loc
                }
            };
            self.check_request_row(request, row, seq_len)?;
            request_fits_u32(geometry.page_size(), shape)?;
            let new_pages = geometry.pages_for(seq_len) - geometry.pages_for(prefix_len);
            params.extend([
                to_u32("prefix_len", prefix_len)?,
                to_u32("seq_len", seq_len)?,
                last,
                row,
                to_u32("out_start", out_start)?,
                to_u32("page_start", page_start)?,
            ]);
            out_start += seq_len - prefix_len;
            page_start += new_pages;
        }
        // The kernel indexes out_cache_loc in u32.
        to_u32("out_len", out_start)?;
        self.check_rows_distinct(rows)?;
        self.check_partial_pages_distinct(
            reqs.iter()
                .enumerate()
                .filter(|(_, shape)| geometry.offset(shape.prefix_len) != 0)
                .filter_map(|(request, shape)| Some((request, shape.last_loc?))),
        )?;
        self.plan(
            params,
            reqs.len(),
            out_start,
            page_start,
            to_u32("blocks", reqs.len())?,
        )
    }

    /// The launch for a batched decode (sglang `alloc_decode`): one slot per request, at
    /// position `seq_len - 1` of row `rows[i]` (none for [`NO_ROW`]; any other row once per
    /// batch, [`CudaError::RowRepeated`]). Two requests may not continue one partial page
    /// ([`AllocError::SharedPartialPage`]). Changes nothing but the planner's scratch stamps;
    /// see [`AllocPlanner::commit`].
    pub fn plan_decode(
        &mut self,
        reqs: &[DecodeShape],
        rows: &[u32],
    ) -> Result<AllocPlan, CudaError> {
        check_row_count(reqs.len(), rows.len())?;
        // Page starts count up to the batch's length, so they fit in u32 once it does.
        to_u32("requests", reqs.len())?;
        let geometry = self.geometry;
        let slot_end = self.slot_end();
        let mut params = vec![0; reqs.len() * DECODE_PARAM_WORDS];
        let mut page_start = 0u32;
        let records = params.chunks_exact_mut(DECODE_PARAM_WORDS);
        for (request, ((shape, &row), record)) in reqs.iter().zip(rows).zip(records).enumerate() {
            let DecodeShape { seq_len, last_loc } = *shape;
            if seq_len < 2 {
                return Err(AllocError::DecodeSeqTooShort { request, seq_len }.into());
            }
            self.check_last_loc(request, last_loc, seq_len - 1, slot_end)?;
            self.check_request_row(request, row, seq_len)?;
            record.copy_from_slice(&[to_u32("seq_len", seq_len)?, last_loc, row, page_start]);
            page_start += u32::from(geometry.offset(seq_len - 1) == 0);
        }
        self.check_rows_distinct(rows)?;
        self.check_partial_pages_distinct(
            reqs.iter()
                .enumerate()
                .filter(|(_, shape)| geometry.offset(shape.seq_len - 1) != 0)
                .map(|(request, shape)| (request, shape.last_loc)),
        )?;
        let blocks = reqs.len().div_ceil(ALLOC_BLOCK as usize);
        self.plan(
            params,
            reqs.len(),
            reqs.len(),
            page_start as usize,
            to_u32("blocks", blocks)?,
        )
    }

    fn plan(
        &self,
        params: Vec<u32>,
        num_reqs: usize,
        out_len: usize,
        pages: usize,
        blocks: u32,
    ) -> Result<AllocPlan, CudaError> {
        if pages > self.free_len {
            return Err(AllocError::OutOfMemory {
                requested: pages.saturating_mul(self.page_size()),
                available: self.available_size(),
            }
            .into());
        }
        Ok(AllocPlan {
            params,
            num_reqs: to_u32("requests", num_reqs)?,
            out_len,
            pages,
            free_head: to_u32("free_head", self.free_head)?,
            blocks,
        })
    }

    /// Records that `plan` was launched: its pages left the head of the free list.
    ///
    /// # Panics
    /// When `plan` is stale: planned before another commit, or committed already (its ring head
    /// is not the current one, or it takes more pages than are free).
    pub fn commit(&mut self, plan: &AllocPlan) {
        assert!(
            plan.free_head as usize == self.free_head && plan.pages <= self.free_len,
            "stale allocation plan: planned at ring head {} for {} pages, the head is now at {} \
             with {} pages free",
            plan.free_head,
            plan.pages,
            self.free_head,
            self.free_len
        );
        self.free_head = (self.free_head + plan.pages) % self.num_pages.max(1);
        self.free_len -= plan.pages;
    }

    /// The launch that frees the pages holding `slots` (each page once): `Lifo` puts them,
    /// sorted, at the head of the free list; `Fifo` appends them in first-appearance order. Same
    /// order as the CPU allocator's `free`. `None` when `slots` is empty. Changes nothing but the
    /// planner's scratch stamps; see [`AllocPlanner::commit_free`].
    pub fn plan_free(&mut self, slots: &[KvSlot]) -> Result<Option<FreePlan>, CudaError> {
        let slot_end = self.slot_end();
        let mut pages: Vec<PageId> = Vec::new();
        self.page_marks.start();
        for &slot in slots {
            if u64::from(slot) >= slot_end {
                return Err(AllocError::SlotOutOfRange { slot, slot_end }.into());
            }
            let page = self.geometry.page_of(slot);
            if page == 0 {
                return Err(AllocError::ReservedSlot {
                    slot,
                    page_size: self.page_size(),
                }
                .into());
            }
            // Each page once, in first-appearance order.
            if self.page_marks.claim(page) {
                pages.push(page as PageId);
            }
        }
        if R::FREED_FIRST {
            pages.sort_unstable();
        }
        self.place_freed(pages)
    }

    /// The launch that puts `pages` on the free list in the order given: `Lifo` at the head
    /// (`pages[0]` becomes the head), `Fifo` at the tail. This is how a CPU allocator returns
    /// the pages of `free_segment`, which it does not sort. `pages` must be distinct pages of
    /// this allocator. `None` when `pages` is empty. Changes nothing; see
    /// [`AllocPlanner::commit_free`].
    pub fn plan_free_pages(&self, pages: &[PageId]) -> Result<Option<FreePlan>, CudaError> {
        let mut sorted = pages.to_vec();
        sorted.sort_unstable();
        for pair in sorted.windows(2) {
            if pair[0] == pair[1] {
                return Err(CudaError::DuplicatePage { page: pair[0] });
            }
        }
        if let Some(&page) = sorted
            .iter()
            .find(|&&page| page == 0 || page as usize > self.num_pages)
        {
            return Err(CudaError::PageOutOfRange {
                page,
                num_pages: self.num_pages,
            });
        }
        self.place_freed(pages.to_vec())
    }

    /// Where distinct `pages` enter the ring: before the head (`Lifo`) or after the tail
    /// (`Fifo`), if the ring has room for them.
    fn place_freed(&self, pages: Vec<PageId>) -> Result<Option<FreePlan>, CudaError> {
        if pages.is_empty() {
            return Ok(None);
        }
        if self.free_len + pages.len() > self.num_pages {
            return Err(CudaError::FreeListOverflow {
                pages: pages.len(),
                free: self.free_len,
                num_pages: self.num_pages,
            });
        }
        let first = self.freed_first(pages.len());
        Ok(Some(FreePlan {
            pages,
            first: to_u32("first", first)?,
        }))
    }

    /// The ring position where `count` freed pages start, `count` being at most the pages out:
    /// just before the head (`Lifo`) or just after the tail (`Fifo`).
    fn freed_first(&self, count: usize) -> usize {
        if R::FREED_FIRST {
            (self.free_head + self.num_pages - count) % self.num_pages.max(1)
        } else {
            (self.free_head + self.free_len) % self.num_pages.max(1)
        }
    }

    /// Records that `plan` was launched: its pages joined the free list.
    ///
    /// # Panics
    /// When `plan` is stale: planned before another commit, or committed already (it would
    /// overfill the ring, or start elsewhere than freed pages now go).
    pub fn commit_free(&mut self, plan: &FreePlan) {
        let count = plan.pages.len();
        assert!(
            self.free_len + count <= self.num_pages
                && plan.first as usize == self.freed_first(count),
            "stale free plan: {count} pages from ring position {}, with {} of {} pages free and \
             the head at {}",
            plan.first,
            self.free_len,
            self.num_pages,
            self.free_head
        );
        if R::FREED_FIRST {
            self.free_head = plan.first as usize;
        }
        self.free_len += plan.pages.len();
    }

    /// `row` exists and positions up to `end` fit in it.
    pub fn check_row(&self, request: usize, row: u32, end: usize) -> Result<(), CudaError> {
        if row as usize >= self.rows {
            return Err(CudaError::RowOutOfRange {
                request,
                row,
                rows: self.rows,
            });
        }
        if end > self.row_len {
            return Err(CudaError::RowOverflow {
                request,
                end,
                row_len: self.row_len,
            });
        }
        Ok(())
    }

    /// The table entries of positions `start..start + len` of `row`, as a range of the
    /// row-major table, once `row` exists and the positions fit in it (an end past `usize` is
    /// [`CudaError::RowOverflow`] with `end = usize::MAX`).
    pub fn row_range(&self, row: u32, start: usize, len: usize) -> Result<Range<usize>, CudaError> {
        let end = start.saturating_add(len);
        self.check_row(0, row, end)?;
        let base = row as usize * self.row_len;
        Ok(base + start..base + end)
    }

    /// [`AllocPlanner::check_row`] for a request's row, which may be [`NO_ROW`].
    fn check_request_row(&self, request: usize, row: u32, end: usize) -> Result<(), CudaError> {
        if row == NO_ROW {
            return Ok(());
        }
        self.check_row(request, row, end)
    }

    /// `last_loc` is in an allocatable page (below `slot_end`, [`AllocPlanner::slot_end`]) at
    /// the offset that follows `stored` tokens.
    fn check_last_loc(
        &self,
        request: usize,
        last_loc: KvSlot,
        stored: usize,
        slot_end: u64,
    ) -> Result<(), CudaError> {
        let geometry = self.geometry;
        if u64::from(last_loc) >= slot_end || geometry.page_of(last_loc) == 0 {
            return Err(AllocError::LastLocNotAllocated { request, last_loc }.into());
        }
        if geometry.offset(last_loc as usize + 1) != geometry.offset(stored) {
            return Err(AllocError::LastLocMismatch {
                request,
                last_loc,
                prefix_len: stored,
                page_size: geometry.page_size(),
            }
            .into());
        }
        Ok(())
    }

    /// One past the last slot of the last page (`new` checked that it fits in `u32`).
    fn slot_end(&self) -> u64 {
        (self.num_pages as u64 + 1) * self.page_size() as u64
    }

    /// Each row (other than [`NO_ROW`]) is named by one request of the batch at most: the
    /// kernels write every request's row in parallel. The rows are validated already.
    fn check_rows_distinct(&mut self, rows: &[u32]) -> Result<(), CudaError> {
        self.row_marks.start();
        for (request, &row) in rows.iter().enumerate() {
            if row != NO_ROW && !self.row_marks.claim(row as usize) {
                let first = rows
                    .iter()
                    .position(|&other| other == row)
                    .expect("an earlier request names the row");
                return Err(CudaError::RowRepeated {
                    request,
                    row,
                    first,
                });
            }
        }
        Ok(())
    }

    /// No two requests of one batch continue the same partially filled page (the kernels would
    /// give both its next slots): `partial` yields `(request, last_loc)`, `last_loc` validated,
    /// for each request whose stored tokens do not end at a page boundary. The host
    /// allocator's rule and error.
    fn check_partial_pages_distinct(
        &mut self,
        partial: impl Iterator<Item = (usize, KvSlot)> + Clone,
    ) -> Result<(), CudaError> {
        let geometry = self.geometry;
        self.page_marks.start();
        for (request, last_loc) in partial.clone() {
            let page = geometry.page_of(last_loc);
            if !self.page_marks.claim(page) {
                let (first, _) = partial
                    .clone()
                    .find(|&(_, other)| geometry.page_of(other) == page)
                    .expect("an earlier request continues the page");
                return Err(AllocError::SharedPartialPage {
                    request,
                    last_loc,
                    page: page as PageId,
                    first,
                }
                .into());
            }
        }
        Ok(())
    }
}

/// Checks that an extend batch fits the `u32` arithmetic of `alloc_extend`: each request's
/// positions rounded up to a page, its threads' strided index over its new positions, and the
/// batch's `out_cache_loc` index. The shapes alone decide it (an invalid shape passes here and
/// is refused by its own check).
pub(crate) fn extend_fits_u32(page_size: usize, reqs: &[ExtendShape]) -> Result<(), CudaError> {
    let mut out_len = 0usize;
    for shape in reqs {
        request_fits_u32(page_size, shape)?;
        out_len = out_len.saturating_add(shape.seq_len.saturating_sub(shape.prefix_len));
    }
    to_u32("out_len", out_len).map(drop)
}

/// One request of [`extend_fits_u32`].
fn request_fits_u32(page_size: usize, shape: &ExtendShape) -> Result<(), CudaError> {
    // The kernel rounds positions up to a page in u32 arithmetic.
    to_u32(
        "seq_len + page_size - 1",
        shape.seq_len.saturating_add(page_size - 1),
    )?;
    // Each thread steps by the block over the new positions; its last step must not wrap.
    let new_slots = shape.seq_len.saturating_sub(shape.prefix_len);
    to_u32(
        "seq_len - prefix_len + ALLOC_BLOCK - 1",
        new_slots.saturating_add(ALLOC_BLOCK as usize - 1),
    )
    .map(drop)
}

fn check_row_count(requests: usize, rows: usize) -> Result<(), CudaError> {
    if requests == rows {
        Ok(())
    } else {
        Err(CudaError::RowCountMismatch { requests, rows })
    }
}

#[cfg(test)]
mod tests {
    use kvown_runtime::alloc::{Fifo, Lifo};

    use super::*;

    /// An extend from position 0 to `seq_len` (no prefix).
    fn fresh(seq_len: usize) -> ExtendShape {
        ExtendShape {
            prefix_len: 0,
            seq_len,
            last_loc: None,
        }
    }

    /// A planner over 16 pages of 4 slots with the first 6 pages out (head at ring position 6).
    fn six_out<R: ReuseOrder>() -> AllocPlanner<R> {
        let mut planner = AllocPlanner::<R>::new(64, 4, 1, 1).unwrap();
        let shape = fresh(24);
        let plan = planner.plan_extend(&[shape], &[NO_ROW]).unwrap();
        planner.commit(&plan);
        planner
    }

    #[test]
    fn freed_pages_keep_their_order_at_the_head_or_the_tail() {
        let mut lifo = six_out::<Lifo>();
        let plan = lifo.plan_free_pages(&[5, 2, 4]).unwrap().unwrap();
        assert_eq!(plan.pages, [5, 2, 4], "not sorted");
        assert_eq!(plan.first, 3, "ends just before the head");
        lifo.commit_free(&plan);
        assert_eq!((lifo.free_head(), lifo.free_len()), (3, 13));

        let mut fifo = six_out::<Fifo>();
        let plan = fifo.plan_free_pages(&[5, 2, 4]).unwrap().unwrap();
        assert_eq!(
            plan.first, 0,
            "starts just after the tail (6 + 10, wrapped)"
        );
        fifo.commit_free(&plan);
        assert_eq!((fifo.free_head(), fifo.free_len()), (6, 13));
        assert_eq!(fifo.plan_free_pages(&[]).unwrap(), None);
    }

    /// `plan_free` lists each page once however its slots come (together, apart, repeated):
    /// `Lifo` sorted, `Fifo` in the order of first appearance.
    #[test]
    fn freed_slots_name_each_page_once() {
        // Pages 1..=6 hold slots 4..28; slots of pages 5, 2, 5, 4, 2 (page 5 twice apart).
        let slots = [20, 21, 8, 23, 16, 17, 9, 22];
        let lifo = six_out::<Lifo>().plan_free(&slots).unwrap().unwrap();
        assert_eq!(lifo.pages, [2, 4, 5]);
        let fifo = six_out::<Fifo>().plan_free(&slots).unwrap().unwrap();
        assert_eq!(fifo.pages, [5, 2, 4]);
    }

    /// The planner counts the slots a `PagedAllocator` of the same size and page size hands
    /// out: whole pages only.
    #[test]
    fn capacity_and_availability_follow_the_host_allocator() {
        use kvown_runtime::alloc::{KvAllocator, PagedAllocator};
        for (size, page_size) in [(64, 4), (66, 4), (48, 16), (7, 1)] {
            let planner = AllocPlanner::<Lifo>::new(size, page_size, 1, 1).unwrap();
            let host = PagedAllocator::new(size, page_size, false).unwrap();
            assert_eq!(planner.capacity(), host.capacity(), "{size} / {page_size}");
            assert_eq!(planner.available_size(), host.available_size());
        }
        assert_eq!(six_out::<Lifo>().capacity(), 64);
        assert_eq!(six_out::<Lifo>().available_size(), 40);
    }

    /// Two requests of one batch may not name one row (the kernels would write it at once);
    /// rowless requests are many.
    #[test]
    fn a_row_named_twice_in_a_batch_is_refused() {
        let mut planner = AllocPlanner::<Lifo>::new(64, 4, 3, 16).unwrap();
        let extend = fresh(4);
        let mut repeated = |rows: &[u32]| match planner.plan_extend(&vec![extend; rows.len()], rows)
        {
            Err(CudaError::RowRepeated {
                request,
                row,
                first,
            }) => Some((request, row, first)),
            Err(other) => panic!("{other}"),
            Ok(_) => None,
        };
        assert_eq!(repeated(&[1, 2, 1]), Some((2, 1, 0)));
        assert_eq!(repeated(&[NO_ROW, 1, NO_ROW, 2]), None);
        let decode = DecodeShape {
            seq_len: 5,
            last_loc: 7,
        };
        let error = planner.plan_decode(&[decode, decode], &[0, 0]).unwrap_err();
        assert!(
            matches!(
                error,
                CudaError::RowRepeated {
                    request: 1,
                    row: 0,
                    first: 0
                }
            ),
            "{error}"
        );
        assert!(
            planner
                .plan_decode(&[decode, decode], &[NO_ROW, NO_ROW])
                .is_ok()
        );
        assert!(planner.plan_decode(&[decode, decode], &[0, 1]).is_ok());
    }

    /// Two requests continuing one partial page are refused as the host allocator refuses them
    /// (both were planned the page's next slots); requests at a page boundary, which open new
    /// pages, may share a last page.
    #[test]
    fn two_requests_in_one_partial_page_are_refused() {
        use kvown_runtime::alloc::{KvAllocator, PagedAllocator};
        let mut planner = six_out::<Lifo>(); // pages 1..=6 (slots 4..28) out
        let mut host = PagedAllocator::new(64, 4, false).unwrap();
        host.alloc(24, &mut Vec::new()).unwrap();
        let shape = |prefix_len, seq_len, last_loc| ExtendShape {
            prefix_len,
            seq_len,
            last_loc,
        };
        let decode = |seq_len, last_loc| DecodeShape { seq_len, last_loc };
        let expected = AllocError::SharedPartialPage {
            request: 2,
            last_loc: 4,
            page: 1,
            first: 0,
        };
        let extend = [shape(2, 4, Some(5)), fresh(3), shape(1, 3, Some(4))];
        let refused = planner.plan_extend(&extend, &[NO_ROW; 3]).unwrap_err();
        assert!(
            matches!(&refused, CudaError::Alloc(e) if *e == expected),
            "{refused}"
        );
        let host_refused = host.alloc_extend(&extend, &mut Vec::new()).unwrap_err();
        assert_eq!(host_refused, expected);
        let batch = [decode(3, 5), decode(9, 11), decode(2, 4)];
        let refused = planner.plan_decode(&batch, &[NO_ROW; 3]).unwrap_err();
        assert!(
            matches!(&refused, CudaError::Alloc(e) if *e == expected),
            "{refused}"
        );
        assert_eq!(host.alloc_decode(&batch, &mut Vec::new()), Err(expected));

        let aligned = [
            shape(4, 5, Some(7)),
            shape(4, 6, Some(7)),
            shape(3, 4, Some(6)),
        ];
        assert!(planner.plan_extend(&aligned, &[NO_ROW; 3]).is_ok());
        let batch = [decode(5, 7), decode(5, 7), decode(4, 6)];
        assert!(planner.plan_decode(&batch, &[NO_ROW; 3]).is_ok());
        // Page size 1 has no partial pages.
        let mut tokens = AllocPlanner::<Fifo>::new(16, 1, 1, 1).unwrap();
        assert!(tokens.plan_decode(&batch[..2], &[NO_ROW; 2]).is_ok());
    }

    /// A pool whose slot range overflows `u64` is too large, as the host allocator says; its
    /// end was computed with a multiplication that overflowed.
    #[test]
    fn a_pool_past_the_u64_range_is_too_many_slots() {
        use kvown_runtime::alloc::{AllocError, PagedAllocator};
        for (size, page_size) in [(usize::MAX, usize::MAX), (usize::MAX, 1)] {
            let host = PagedAllocator::new(size, page_size, false).unwrap_err();
            let planner = AllocPlanner::<Lifo>::new(size, page_size, 1, 1).unwrap_err();
            let CudaError::Alloc(error) = planner else {
                panic!("{size} / {page_size}: {planner}");
            };
            assert_eq!(error, host, "{size} / {page_size}");
            assert!(matches!(
                error,
                AllocError::TooManySlots {
                    slot_end: u64::MAX,
                    ..
                }
            ));
        }
    }

    /// The planner checks what it is given before it plans a launch: one row per request, rows
    /// in the table and long enough, last slots in an allocatable page at the offset the stored
    /// length implies. (Behind `MirroredAllocator` the host allocator rejects all of these
    /// first; a `CudaPagedAllocator` used on its own relies on the planner.)
    #[test]
    fn plans_reject_bad_rows_and_last_slots() {
        use kvown_runtime::alloc::{AllocError, DecodeShape};
        // 16 pages of 4 slots (slots 4..68), 2 rows of 32 positions.
        let mut planner = AllocPlanner::<Lifo>::new(64, 4, 2, 32).unwrap();
        assert!(matches!(
            planner.plan_extend(&[fresh(4)], &[]),
            Err(CudaError::RowCountMismatch {
                requests: 1,
                rows: 0
            })
        ));
        let decode = |seq_len, last_loc| DecodeShape { seq_len, last_loc };
        assert!(matches!(
            planner.plan_decode(&[decode(2, 4)], &[0, 1]),
            Err(CudaError::RowCountMismatch {
                requests: 1,
                rows: 2
            })
        ));
        assert!(matches!(
            planner.plan_extend(&[fresh(4)], &[2]),
            Err(CudaError::RowOutOfRange {
                request: 0,
                row: 2,
                rows: 2
            })
        ));
        assert!(matches!(
            planner.plan_extend(&[fresh(4), fresh(33)], &[0, 1]),
            Err(CudaError::RowOverflow {
                request: 1,
                end: 33,
                row_len: 32
            })
        ));
        assert!(planner.plan_extend(&[fresh(33)], &[NO_ROW]).is_ok());
        // Without a row, only the u32 positions of the kernel bound an extend: rounded up to a
        // page, its end must fit. (One new slot each, after a prefix ending in page 1.)
        let top = u32::MAX as usize - 3;
        let one_more = |seq_len: usize| ExtendShape {
            prefix_len: seq_len - 1,
            seq_len,
            last_loc: Some(4 + ((seq_len - 2) % 4) as KvSlot),
        };
        let at_top = planner.plan_extend(&[one_more(top)], &[NO_ROW]);
        assert!(at_top.is_ok(), "{at_top:?}");
        assert!(matches!(
            planner.plan_extend(&[one_more(top + 1)], &[NO_ROW]),
            Err(CudaError::TooLarge {
                what: "seq_len + page_size - 1",
                ..
            })
        ));
        assert!(planner.plan_decode(&[decode(3, 5)], &[0]).is_ok());
        // Past the last page, and in the padding page: each at the offset its length implies,
        // so only the range test can refuse them.
        for (seq_len, last_loc) in [(2, 68), (5, 3)] {
            assert!(
                matches!(
                    planner.plan_decode(&[decode(seq_len, last_loc)], &[0]),
                    Err(CudaError::Alloc(AllocError::LastLocNotAllocated { request: 0, last_loc: l }))
                        if l == last_loc
                ),
                "{last_loc}"
            );
        }
        assert!(matches!(
            planner.plan_decode(&[decode(3, 4)], &[0]),
            Err(CudaError::Alloc(AllocError::LastLocMismatch {
                request: 0,
                last_loc: 4,
                prefix_len: 2,
                page_size: 4
            }))
        ));
    }

    #[test]
    fn freed_pages_are_validated() {
        let planner = six_out::<Lifo>();
        assert!(matches!(
            planner.plan_free_pages(&[3, 1, 3]),
            Err(CudaError::DuplicatePage { page: 3 })
        ));
        for page in [0, 17] {
            assert!(matches!(
                planner.plan_free_pages(&[1, page]),
                Err(CudaError::PageOutOfRange { num_pages: 16, .. })
            ));
        }
        assert!(matches!(
            planner.plan_free_pages(&[1, 2, 3, 4, 5, 6, 7]),
            Err(CudaError::FreeListOverflow {
                pages: 7,
                free: 10,
                num_pages: 16
            })
        ));
    }

    /// An extend batch whose `out_cache_loc` outgrows the kernel's `u32` index is refused: here
    /// each of the 65534 pages of 65536 slots is finished by one request (65535 slots each,
    /// no new pages), and a fresh request adds 3 * 65535 slots (u32::MAX in all) or one more;
    /// past the index, the last request's `out_start + k` wrapped onto request 0's slots.
    #[test]
    fn an_extend_batch_past_the_u32_out_cache_loc_is_too_large() {
        let page_size = 1 << 16;
        let mut planner = AllocPlanner::<Lifo>::new(65534 * page_size, page_size, 1, 1).unwrap();
        let finish = |page: usize| ExtendShape {
            prefix_len: 1,
            seq_len: page_size,
            last_loc: Some((page * page_size) as KvSlot),
        };
        let batch = |fresh_len| {
            let mut reqs: Vec<ExtendShape> = (1..=65534).map(finish).collect();
            reqs.push(fresh(fresh_len));
            reqs
        };
        let fits = batch(3 * 65535);
        let plan = planner.plan_extend(&fits, &vec![NO_ROW; fits.len()]);
        assert_eq!(plan.unwrap().out_len, u32::MAX as usize);
        let over = batch(3 * 65535 + 1);
        assert!(matches!(
            planner.plan_extend(&over, &vec![NO_ROW; over.len()]),
            Err(CudaError::TooLarge {
                what: "out_len",
                ..
            })
        ));
    }

    /// An extend of nearly 2^32 new slots is refused: `alloc_extend`'s threads stride over the
    /// new positions in `u32` steps of a block, and the last step wrapped back to the start, so
    /// the kernel never finished.
    #[test]
    fn an_extend_whose_thread_stride_wraps_is_too_large() {
        let size = u32::MAX as usize - 2;
        let mut planner = AllocPlanner::<Lifo>::new(size, 1, 1, 1).unwrap();
        let top = (u32::MAX - ALLOC_BLOCK + 1) as usize;
        assert!(planner.plan_extend(&[fresh(top)], &[NO_ROW]).is_ok());
        assert!(matches!(
            planner.plan_extend(&[fresh(top + 1)], &[NO_ROW]),
            Err(CudaError::TooLarge {
                what: "seq_len - prefix_len + ALLOC_BLOCK - 1",
                ..
            })
        ));
    }

    /// A row range is checked without overflow: a start near `usize::MAX` is a row overflow,
    /// not a panic (debug) or a wrapped end that passes the check (release).
    #[test]
    fn row_ranges_past_usize_are_row_overflows() {
        let planner = AllocPlanner::<Lifo>::new(64, 4, 3, 16).unwrap();
        assert_eq!(planner.row_range(2, 4, 12).unwrap(), 36..48);
        assert_eq!(planner.row_range(1, 16, 0).unwrap(), 32..32);
        assert!(matches!(
            planner.row_range(1, usize::MAX, 1),
            Err(CudaError::RowOverflow {
                end: usize::MAX,
                row_len: 16,
                ..
            })
        ));
        assert!(matches!(
            planner.row_range(3, 0, 1),
            Err(CudaError::RowOutOfRange {
                row: 3,
                rows: 3,
                ..
            })
        ));
    }

    /// The kernels take the table's row length as a `u32` stride: a longer row is refused when
    /// the planner is built, not by every allocation that launches (the device allocator was
    /// built, then each launch failed with `TooLarge`, which a mirror's replay turns into a
    /// panic after the host has allocated).
    #[test]
    fn a_row_past_the_kernels_u32_stride_is_too_large() {
        let long = u32::MAX as usize + 1;
        assert!(matches!(
            AllocPlanner::<Lifo>::new(64, 4, 1, long),
            Err(CudaError::TooLarge {
                what: "row_len",
                ..
            })
        ));
        assert!(AllocPlanner::<Lifo>::new(64, 4, 1, long - 1).is_ok());
    }

    /// A plan committed twice, or after another commit, is a stale plan: committing it again
    /// moved the head and took its pages a second time without a word (and, past the free
    /// pages, underflowed the free count).
    #[test]
    #[should_panic(expected = "stale")]
    fn committing_an_allocation_plan_twice_panics() {
        let mut planner = six_out::<Lifo>();
        let shape = fresh(4);
        let plan = planner.plan_extend(&[shape], &[NO_ROW]).unwrap();
        planner.commit(&plan);
        planner.commit(&plan);
    }

    /// The same for a free plan: the pages would join the free list twice.
    #[test]
    #[should_panic(expected = "stale")]
    fn committing_a_free_plan_twice_panics() {
        let mut planner = six_out::<Fifo>();
        let plan = planner.plan_free_pages(&[2, 5]).unwrap().unwrap();
        planner.commit_free(&plan);
        planner.commit_free(&plan);
    }
}
