//! [`PageAllocator`]: the one allocator core behind [`TokenAllocator`](super::TokenAllocator)
//! (page size 1, FIFO reuse) and [`PagedAllocator`](super::PagedAllocator) (LIFO reuse).

use std::marker::PhantomData;

use super::free_list::FreeList;
use super::geometry::{PageGeometry, PageMath, Specialised};
use super::rules::{
    ContinuedPages, DecodeFill, check_decode, check_extend, fill_decode, fill_extend,
    fill_trusted_decode, push_slot_run, unmark_decode, unmark_pages,
};
use super::{
    AllocError, DecodeRow, DecodeShape, ExtendShape, KvAllocator, KvSlot, PageId, PageState,
    ReuseOrder, TrustedDecodeRows,
};
use crate::slots::ReqToTokenPool;

/// Bookkeeping bytes per page: the state byte, and a page id each in the free/release ring and
/// the deferred list ([`PageAllocator::bookkeeping_bytes`]).
const BYTES_PER_PAGE: usize = 1 + 2 * std::mem::size_of::<PageId>();

/// A page allocator over pages `1..=num_pages` of `page_size` slots; page 0 is padding.
///
/// * Allocation always takes pages from the head of the free list.
/// * `R` decides where freed pages go: [`Fifo`](super::Fifo) appends them in the order given,
///   [`Lifo`](super::Lifo) prepends them (a plain `free` sorted ascending, a `free_segment` in
///   row order, a group end as [`deferred_pages`](Self::deferred_pages) lists them: the pages
///   of `free_segment(s)` and `free_page_ids` in call order, then those of `free` sorted
///   ascending).
/// * With `need_sort`, frees go to a release list instead, and the two lists are merged and
///   sorted ascending when sglang merges them: when its cheap over-estimate of the pages a call
///   takes exceeds the free list (see [`PageAllocator::merge_released`]), so that every
///   allocation hands out sglang's pages in sglang's order. A call answered out of memory keeps
///   the merge it made first, as sglang's does: a refused call changes no ownership.
/// * Every page carries a [`PageState`], so double frees, frees of unallocated pages and
///   duplicate pages are rejected before anything changes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PageAllocator<R: ReuseOrder> {
    geometry: PageGeometry,
    num_pages: usize,
    need_sort: bool,
    state: Vec<PageState>,
    free: FreeList,
    /// Pages deferred by the open free group. Outside a group it is empty between calls and
    /// serves as the scratch list of the free call in progress.
    deferred: Vec<PageId>,
    /// In an open group, how many of `deferred` (at its front) keep their order at the group's
    /// end: those of `free_segment(s)` and `free_page_ids`, in call order. The rest, from `free`,
    /// are sorted then (sglang's group end: one `free` of the deferred tokens, sorted, then the
    /// segments' page representatives released in front of them).
    ordered_deferred: usize,
    in_free_group: bool,
    order: PhantomData<R>,
}

impl<R: ReuseOrder> PageAllocator<R> {
    /// An allocator with every page free: `[1, …, num_pages]`.
    pub(crate) fn with_pages(
        page_size: usize,
        num_pages: usize,
        need_sort: bool,
    ) -> Result<Self, AllocError> {
        if page_size == 0 {
            return Err(AllocError::ZeroPageSize);
        }
        let slot_end = (num_pages as u64)
            .saturating_add(1)
            .saturating_mul(page_size as u64);
        // The end of the last page is a slot id too (a run's exclusive end), so it must fit.
        if slot_end > u64::from(KvSlot::MAX) {
            return Err(AllocError::TooManySlots {
                num_pages,
                page_size,
                slot_end,
            });
        }
        // Sized from the caller's numbers: reserved fallibly, so that a pool the host cannot
        // hold is a typed error rather than an abort.
        let too_large = AllocError::PoolTooLarge {
            num_pages,
            page_size,
            bookkeeping_bytes: num_pages.saturating_add(1).saturating_mul(BYTES_PER_PAGE),
        };
        let mut state = Vec::new();
        let mut deferred = Vec::new();
        if state.try_reserve_exact(num_pages + 1).is_err()
            || deferred.try_reserve_exact(num_pages).is_err()
        {
            return Err(too_large);
        }
        let free = FreeList::try_full(num_pages).ok_or(too_large)?;
        state.push(PageState::Reserved);
        state.resize(num_pages + 1, PageState::Unused);
        Ok(Self {
            geometry: PageGeometry::new(page_size),
            num_pages,
            need_sort,
            state,
            free,
            deferred,
            ordered_deferred: 0,
            in_free_group: false,
            order: PhantomData,
        })
    }

    /// Pages that can be handed out (page 0 excluded).
    pub fn num_pages(&self) -> usize {
        self.num_pages
    }

    /// Whether frees go to a release list that is merged and sorted lazily.
    pub fn need_sort(&self) -> bool {
        self.need_sort
    }

    /// Merges the release list into the free list, sorted ascending (sglang
    /// `merge_and_sort_free`); a no-op when nothing is released.
    ///
    /// Allocations merge by themselves exactly when sglang's do, a call answered out of memory
    /// included; this is for a caller that wants the free list merged at another point (before
    /// reading it, or to start a phase from a sorted list).
    pub fn merge_released(&mut self) {
        if self.free.released_len() > 0 {
            for page in self.free.released_pages() {
                self.state[page as usize] = PageState::Free;
            }
            self.free.merge_and_sort();
        }
    }

    /// Pages freed in the open free group, not yet available.
    pub fn deferred_count(&self) -> usize {
        self.deferred.len()
    }

    /// The free list, head (next allocated) first. Excludes the release list.
    pub fn free_pages(&self) -> impl Iterator<Item = PageId> + '_ {
        self.free.free_pages()
    }

    /// Pages in the free list (the length of [`free_pages`](Self::free_pages)).
    pub fn free_page_count(&self) -> usize {
        self.free.free_len()
    }

    /// The release list (`need_sort` mode), in no particular order.
    pub fn released_pages(&self) -> impl Iterator<Item = PageId> + '_ {
        self.free.released_pages()
    }

    /// The pages deferred by the open free group, in the order its end releases them: those of
    /// `free_segment(s)` and `free_page_ids` calls in call order, then those of `free` calls
    /// (sorted at the end with LIFO reuse).
    pub fn deferred_pages(&self) -> &[PageId] {
        &self.deferred
    }

    /// The state of `page`, or `None` beyond the last page.
    pub fn page_state(&self, page: PageId) -> Option<PageState> {
        self.state.get(page as usize).copied()
    }

    /// Whether `page` is in the free list or the release list.
    pub fn is_page_free(&self, page: PageId) -> bool {
        self.page_state(page).is_some_and(PageState::is_available)
    }

    /// Whether `page` is handed out and not freed.
    pub fn is_page_allocated(&self, page: PageId) -> bool {
        self.page_state(page) == Some(PageState::Held)
    }

    /// Bytes of bookkeeping this allocator holds: the struct, one state byte per page, and the
    /// free/release ring and the deferred list with 4 bytes per page each (9 bytes per page).
    pub fn bookkeeping_bytes(&self) -> usize {
        std::mem::size_of::<Self>()
            + self.state.capacity() // one byte per state
            + self.free.capacity() * std::mem::size_of::<PageId>()
            + self.deferred.capacity() * std::mem::size_of::<PageId>()
    }

    /// Every page free again (`[1, …, num_pages]`), release list empty, no open group.
    pub fn clear(&mut self) {
        self.state.fill(PageState::Unused);
        self.state[0] = PageState::Reserved;
        self.free.reset(self.num_pages);
        self.deferred.clear();
        self.ordered_deferred = 0;
        self.in_free_group = false;
    }

    /// Verifies the bookkeeping: page 0 reserved, the free, release and deferred lists hold
    /// distinct in-range pages whose states agree with the list, every page marked free,
    /// released or deferred is in its list, and nothing is left pending. O(num_pages); allocates
    /// a temporary bitmap, so meant for tests and debug checks.
    pub fn check(&self) -> Result<(), super::InvariantViolation> {
        use super::InvariantViolation as V;
        for (page, &state) in self.state.iter().enumerate() {
            if (page == 0) != (state == PageState::Reserved) {
                return Err(V::Reserved { page, state });
            }
        }
        if !self.in_free_group && !self.deferred.is_empty() {
            return Err(V::DeferredOutsideGroup {
                count: self.deferred.len(),
            });
        }
        if !self.need_sort && self.free.released_len() > 0 {
            return Err(V::ReleaseWithoutNeedSort {
                count: self.free.released_len(),
            });
        }
        let mut listed = vec![false; self.num_pages + 1];
        self.check_list("free", self.free.free_pages(), &mut listed, |state| {
            matches!(state, PageState::Unused | PageState::Free)
        })?;
        self.check_list(
            "release",
            self.free.released_pages(),
            &mut listed,
            |state| state == PageState::Released,
        )?;
        self.check_list(
            "deferred",
            self.deferred.iter().copied(),
            &mut listed,
            |state| state == PageState::Deferred,
        )?;
        for (page, &state) in self.state.iter().enumerate() {
            let must_be_listed = !matches!(state, PageState::Reserved | PageState::Held);
            if must_be_listed && !listed[page] {
                return Err(V::MissingFromList { page, state });
            }
        }
        Ok(())
    }

    /// Checks one list for range, duplicates (across lists, via `listed`) and state agreement.
    fn check_list(
        &self,
        list: &'static str,
        pages: impl Iterator<Item = PageId>,
        listed: &mut [bool],
        belongs: impl Fn(PageState) -> bool,
    ) -> Result<(), super::InvariantViolation> {
        use super::InvariantViolation as V;
        for page in pages {
            let index = page as usize;
            if index == 0 || index > self.num_pages {
                return Err(V::PageOutOfRange {
                    list,
                    page,
                    num_pages: self.num_pages,
                });
            }
            if std::mem::replace(&mut listed[index], true) {
                return Err(V::DuplicatePage { list, page });
            }
            let state = self.state[index];
            if !belongs(state) {
                return Err(V::StateMismatch { list, page, state });
            }
        }
        Ok(())
    }

    /// The batched decode of `alloc_decode`: one pass validates the
    /// batch and writes its slots; its pages are claimed only when it is valid and fits.
    #[inline]
    fn decode_batch(
        &mut self,
        reqs: impl ExactSizeIterator<Item = DecodeShape> + Clone,
        out: &mut Vec<KvSlot>,
    ) -> Result<(), AllocError> {
        if self.free.released_len() > 0 && reqs.len() > self.free.free_len() {
            let shapes: Vec<DecodeShape> = reqs.collect();
            return self.decode_batch_merging(&shapes, out);
        }
        let start = out.len();
        let pass = match self.geometry.specialised() {
            Specialised::PowerOfTwo(math) => self.decode_pass(math, reqs.clone(), out),
            Specialised::AnySize(math) => self.decode_pass(math, reqs.clone(), out),
        };
        let Err(fill) = pass else {
            return Ok(());
        };
        out.truncate(start);
        unmark_pages(
            self.geometry,
            &mut self.state,
            reqs.clone().map(|shape| shape.last_loc),
        );
        let shapes: Vec<DecodeShape> = reqs.collect();
        self.decode_batch_slow(&shapes, fill, out)
    }

    /// `decode_batch`'s pass: fills `out`, and when the batch is valid and fits, claims its new
    /// pages and turns the partial pages the pass marked back to `Held`. Otherwise returns what
    /// the pass found, with `out` to truncate and the marks to undo.
    #[inline(always)]
    fn decode_pass<M: PageMath>(
        &mut self,
        math: M,
        reqs: impl ExactSizeIterator<Item = DecodeShape>,
        out: &mut Vec<KvSlot>,
    ) -> Result<(), DecodeFill> {
        let start = out.len();
        let fill = fill_decode(math, &mut self.state, &self.free, reqs, out);
        if !self.claim_decode_pages(&fill) {
            return Err(fill);
        }
        unmark_decode(math, &mut self.state, &out[start..]);
        Ok(())
    }

    /// Claims the pages a decode pass peeked when the batch is valid and fits; `false`, changing
    /// nothing, otherwise.
    #[inline]
    fn claim_decode_pages(&mut self, fill: &DecodeFill) -> bool {
        if !fill.valid || fill.new_pages > self.free.free_len() {
            return false;
        }
        for page in self.free.take_front(fill.new_pages) {
            self.state[page as usize] = PageState::Held;
        }
        true
    }

    /// Validates an extend batch and makes its new pages available: returns the new pages and
    /// new tokens. Marks each request's partial last page `Pending` (requests whose prefix ends
    /// at a page boundary, fresh prompts among them, mark nothing), so that a second request
    /// continuing it is refused; the caller turns the marks back to `Held`, on error too.
    #[inline]
    fn check_extend_batch(&mut self, reqs: &[ExtendShape]) -> Result<(usize, usize), AllocError> {
        let geometry = self.geometry;
        let mut new_pages = 0usize;
        let mut new_tokens = 0usize;
        for (request, shape) in reqs.iter().enumerate() {
            new_pages =
                new_pages.saturating_add(check_extend(geometry, &mut self.state, reqs, request)?);
            new_tokens = new_tokens.saturating_add(shape.seq_len - shape.prefix_len);
        }
        // sglang's merge trigger: the paged allocator's `alloc_extend` merges when
        // `extend_num_tokens // page_size + bs + 1 > len(free_pages)`; the token allocator's
        // `alloc(extend_num_tokens)` when the tokens exceed the free list.
        let estimate = match R::FREED_FIRST {
            true => (new_tokens / geometry.page_size())
                .saturating_add(reqs.len())
                .saturating_add(1),
            false => new_pages,
        };
        self.ensure_free_within(new_pages, estimate)?;
        Ok((new_pages, new_tokens))
    }

    /// Panics unless `batch` keeps the promise of [`TrustedDecodeRows`]: the checks of
    /// `alloc_decode_table` (rows held, once each, lengths in range, last slots in held pages at
    /// their offsets) pass, and `new_pages` of the tokens open a page. A failure is a bug of the
    /// batch flow.
    #[cold]
    #[inline(never)]
    fn verify_trusted<I>(&self, batch: &TrustedDecodeRows<I>, table: &ReqToTokenPool)
    where
        I: ExactSizeIterator<Item = DecodeRow> + Clone,
    {
        let shapes = DecodeRow::read_shapes(batch.rows(), table)
            .unwrap_or_else(|error| panic!("a trusted decode batch fails its checks: {error}"));
        let mut opening = 0;
        for (request, shape) in shapes.iter().enumerate() {
            match check_decode(
                self.geometry,
                &self.state,
                request,
                shape.seq_len,
                shape.last_loc,
            ) {
                Ok(opens) => opening += usize::from(opens),
                Err(error) => panic!("a trusted decode batch fails its checks: {error}"),
            }
        }
        assert_eq!(
            opening,
            batch.new_pages(),
            "a trusted decode batch declared the wrong number of new pages"
        );
    }

    /// The rare outcomes of `decode_batch`'s pass, which left `out` as it was: the first
    /// invalid request's typed error, out of memory, or, in `need_sort` mode, a merge of the
    /// release list and the pass again.
    #[cold]
    #[inline(never)]
    fn decode_batch_slow(
        &mut self,
        reqs: &[DecodeShape],
        fill: DecodeFill,
        out: &mut Vec<KvSlot>,
    ) -> Result<(), AllocError> {
        if !fill.valid {
            self.validate_decode(reqs)?;
            unreachable!("fill_decode rejected a batch that check_decode accepts")
        }
        self.merge_or_oom(fill.new_pages)?;
        self.decode_batch(reqs.iter().copied(), out)
    }

    /// A decode batch in `need_sort` mode with more requests than free pages, where sglang
    /// merges the release list before it allocates (`alloc_decode`: `bs > len(free_pages)`):
    /// validates the batch, merges when the merged list can serve it (out of memory otherwise,
    /// changing nothing), then allocates.
    #[cold]
    #[inline(never)]
    fn decode_batch_merging(
        &mut self,
        reqs: &[DecodeShape],
        out: &mut Vec<KvSlot>,
    ) -> Result<(), AllocError> {
        let new_pages = self.validate_decode(reqs)?;
        self.merge_or_oom(new_pages)?;
        self.decode_batch(reqs.iter().copied(), out)
    }

    /// Checks every request of a decode batch without changing anything: the first invalid
    /// request's typed error, or the pages the batch opens.
    fn validate_decode(&self, reqs: &[DecodeShape]) -> Result<usize, AllocError> {
        let mut continued = ContinuedPages::default();
        let mut opening = 0;
        for (request, shape) in reqs.iter().enumerate() {
            let opens = check_decode(
                self.geometry,
                &self.state,
                request,
                shape.seq_len,
                shape.last_loc,
            )?;
            if opens {
                opening += 1;
            } else {
                continued.note(self.geometry.page_size(), request, shape.last_loc)?;
            }
        }
        Ok(opening)
    }

    /// Makes `pages` free pages available at the head of the free list, merging the release
    /// list first when that is what it takes; otherwise reports out of memory.
    #[inline(always)]
    fn ensure_free(&mut self, pages: usize) -> Result<(), AllocError> {
        self.ensure_free_within(pages, pages)
    }

    /// [`Self::ensure_free`] for a call whose sglang counterpart merges the release list when
    /// `estimate` (its over-estimate of the pages the call takes, at least `pages`) exceeds the
    /// free list: merges then too, when the merged list can serve `pages`. The release list is
    /// empty outside `need_sort` mode, so there this is `ensure_free`.
    #[inline(always)]
    fn ensure_free_within(&mut self, pages: usize, estimate: usize) -> Result<(), AllocError> {
        let free = self.free.free_len();
        if pages <= free && (estimate <= free || self.free.released_len() == 0) {
            return Ok(());
        }
        self.merge_or_oom(pages)
    }

    /// The slow path of `ensure_free`, reached where sglang's call merges: merge the release
    /// list (sglang `merge_and_sort_free`), then report out of memory if `pages` are still more
    /// than the free list. The merge stays made when the call is refused, as sglang's does: it
    /// moves no page between owners.
    #[cold]
    #[inline(never)]
    fn merge_or_oom(&mut self, pages: usize) -> Result<(), AllocError> {
        self.merge_released();
        if pages <= self.free.free_len() {
            return Ok(());
        }
        Err(AllocError::OutOfMemory {
            requested: pages.saturating_mul(self.geometry.page_size()),
            available: self.available_size(),
        })
    }

    /// Marks the page of `slot` as pending in the current free call and records it, or skips it
    /// when this call already named the page.
    #[inline]
    fn mark_pending(&mut self, slot: KvSlot) -> Result<usize, AllocError> {
        self.mark_page(self.geometry.page_of(slot), slot)
    }

    /// Marks `page` as pending as `mark_pending` does; `slot` is the slot that named it, for the
    /// errors.
    #[inline]
    fn mark_page(&mut self, page: usize, slot: KvSlot) -> Result<usize, AllocError> {
        match self.state.get(page) {
            Some(PageState::Held) => {
                self.state[page] = PageState::Pending;
                self.deferred.push(page as PageId);
                Ok(page)
            }
            Some(PageState::Pending) => Ok(page),
            Some(PageState::Reserved) => Err(AllocError::ReservedSlot {
                slot,
                page_size: self.geometry.page_size(),
            }),
            Some(PageState::Unused) => Err(AllocError::NotAllocated {
                slot,
                page: page as PageId,
            }),
            Some(&state) => Err(AllocError::DoubleFree {
                slot,
                page: page as PageId,
                state,
            }),
            None => Err(AllocError::SlotOutOfRange {
                slot,
                slot_end: (self.num_pages as u64 + 1) * self.geometry.page_size() as u64,
            }),
        }
    }

    /// Marks the pages of `slots` pending, in slot order, as one `mark_pending` per slot would:
    /// after a page is marked, the slots that follow it in the same page are no-ops, so a run of
    /// up to a page of them is skipped after one vectorisable check.
    #[inline]
    fn mark_slots(&mut self, slots: &[KvSlot]) -> Result<(), AllocError> {
        let geometry = self.geometry;
        let window = geometry.page_size();
        let mut rest = slots;
        while let Some(&first) = rest.first() {
            let page = self.mark_pending(first)?;
            // The run starts at `first` (trivially in `page`) so that its loads line up with
            // the stores that wrote the slots.
            let run = &rest[..rest.len().min(window)];
            let same = if all_in_page(geometry, run, page) {
                run.len()
            } else {
                1 + run[1..]
                    .iter()
                    .take_while(|&&slot| geometry.page_of(slot) == page)
                    .count()
            };
            rest = &rest[same..];
        }
        Ok(())
    }

    /// Marks the pages of `row[start_pos .. start_pos + slots.len()]` pending, one representative
    /// per page (the first slot, then every slot at a page boundary of the row), after checking
    /// that the other slots lie in their representative's page.
    fn mark_segment(&mut self, slots: &[KvSlot], start_pos: usize) -> Result<(), AllocError> {
        let geometry = self.geometry;
        let mut chunk_start = 0;
        let mut chunk_len = geometry.page_size() - geometry.offset(start_pos);
        while chunk_start < slots.len() {
            let chunk_end = (chunk_start + chunk_len).min(slots.len());
            let page = self.mark_pending(slots[chunk_start])?;
            // The whole chunk, first slot included (trivially in `page`): a whole page of
            // slots vectorises without a remainder.
            if !all_in_page(geometry, &slots[chunk_start..chunk_end], page) {
                return Err(segment_not_paged(
                    geometry,
                    slots,
                    chunk_start..chunk_end,
                    page,
                ));
            }
            chunk_start = chunk_end;
            chunk_len = geometry.page_size();
        }
        Ok(())
    }

    /// Fast path of `free` for slots that all lie in one held page, outside a free group: the
    /// page goes straight to the free (or release) list, as the general path would put it (a
    /// sort of one page is the identity). Returns `false`, changing nothing, for anything else.
    #[inline]
    fn free_one_page(&mut self, slots: &[KvSlot]) -> bool {
        let geometry = self.geometry;
        let Some(&last) = slots.last() else {
            return false;
        };
        if self.in_free_group || slots.len() > geometry.page_size() {
            return false;
        }
        // The page of the last slot: the range test below then needs no load of it and starts
        // at `slots[0]`, so its vector loads line up with the stores that wrote the slots (a
        // freshly allocated page is usually freed from the start of its run); a load that
        // straddles two of those stores waits for them to retire.
        let page = geometry.page_of(last);
        if self.state.get(page) != Some(&PageState::Held) || !run_in_page(geometry, slots, page) {
            return false;
        }
        self.free_held_page(page);
        true
    }

    /// Takes the head of the free list (`ensure_free(1)` made one available) and marks it held:
    /// one page without an iterator over the free list.
    #[inline(always)]
    fn take_one_page(&mut self) -> PageId {
        let page = self.free.pop_front();
        self.state[page as usize] = PageState::Held;
        page
    }

    /// Returns the held `page` to the free (or release) list outside a free group, where the
    /// general path would put it (a sort of one page is the identity).
    #[inline(always)]
    fn free_held_page(&mut self, page: usize) {
        debug_assert!(!self.in_free_group && self.state[page] == PageState::Held);
        let page_id = [page as PageId];
        if self.need_sort {
            self.state[page] = PageState::Released;
            self.free.release(&page_id);
        } else {
            self.state[page] = PageState::Free;
            if R::FREED_FIRST {
                self.free.prepend(&page_id);
            } else {
                self.free.append(&page_id);
            }
        }
    }

    /// The general path of `free_page_ids`: every page checked and marked, then released (or
    /// deferred inside a group) as one update; on error nothing changes.
    #[inline(never)]
    fn free_page_ids_checked(&mut self, pages: &[PageId]) -> Result<(), AllocError> {
        let start = self.deferred.len();
        let result = pages.iter().try_for_each(|&page| {
            if page == 0 || page as usize > self.num_pages {
                return Err(AllocError::PageOutOfRange {
                    page,
                    num_pages: self.num_pages,
                });
            }
            self.mark_page(page as usize, self.geometry.first_slot(page))
                .map(drop)
        });
        self.finish_free(start, result, false)
    }

    /// Finishes a free call whose pages are `deferred[start..]`: undoes them on error, defers
    /// them inside a group (after the ordered ones when `sort` is false), releases them
    /// otherwise (sorted when `sort` is true).
    #[inline]
    fn finish_free(
        &mut self,
        start: usize,
        result: Result<(), AllocError>,
        sort: bool,
    ) -> Result<(), AllocError> {
        if let Err(error) = result {
            for &page in &self.deferred[start..] {
                self.state[page as usize] = PageState::Held;
            }
            self.deferred.truncate(start);
            return Err(error);
        }
        if self.in_free_group {
            for &page in &self.deferred[start..] {
                self.state[page as usize] = PageState::Deferred;
            }
            if !sort {
                let added = self.deferred.len() - start;
                self.deferred[self.ordered_deferred..].rotate_right(added);
                self.ordered_deferred += added;
            }
        } else {
            self.release_deferred(if sort { 0 } else { self.deferred.len() });
        }
        Ok(())
    }

    /// Returns every page in `deferred` to the free list (or the release list) as one update,
    /// `deferred[sorted_from..]` sorted first when freed pages go to the head.
    #[inline]
    fn release_deferred(&mut self, sorted_from: usize) {
        let freed = if self.need_sort {
            PageState::Released
        } else {
            PageState::Free
        };
        for &page in &self.deferred {
            self.state[page as usize] = freed;
        }
        if self.need_sort {
            self.free.release(&self.deferred);
        } else if R::FREED_FIRST {
            self.deferred[sorted_from..].sort_unstable();
            self.free.prepend(&self.deferred);
        } else {
            self.free.append(&self.deferred);
        }
        self.deferred.clear();
    }
}

impl<R: ReuseOrder> PageAllocator<R> {
    /// [`KvAllocator::alloc_decode_trusted`] that also tells `on_write` each table write as it
    /// makes it: the flat index `row * width + position` into the table's entries and the slot.
    /// An allocator that wraps this one and keeps a copy of the table (a device stager) records
    /// the step in the same pass. Only out of memory fails, before anything is written.
    #[inline]
    pub fn alloc_decode_trusted_with<I>(
        &mut self,
        batch: TrustedDecodeRows<I>,
        table: &mut ReqToTokenPool,
        out: &mut Vec<KvSlot>,
        on_write: impl FnMut(usize, KvSlot),
    ) -> Result<(), AllocError>
    where
        I: ExactSizeIterator<Item = DecodeRow> + Clone,
    {
        if cfg!(debug_assertions) {
            self.verify_trusted(&batch, table);
        }
        let new_pages = batch.new_pages();
        // sglang's `alloc_decode` merges when `bs > len(free_pages)`.
        self.ensure_free_within(new_pages, batch.rows().len())?;
        let (free, entries) = (&self.free, table.entries_mut());
        let opened = match self.geometry.specialised() {
            Specialised::PowerOfTwo(math) => {
                fill_trusted_decode(math, free, batch.rows(), entries, out, on_write)
            }
            Specialised::AnySize(math) => {
                fill_trusted_decode(math, free, batch.rows(), entries, out, on_write)
            }
        };
        assert_eq!(
            opened, new_pages,
            "a trusted decode batch opened another number of pages than it declared"
        );
        for page in self.free.take_front(new_pages) {
            self.state[page as usize] = PageState::Held;
        }
        Ok(())
    }
}

/// Whether every slot of `slots` lies in `page` (a page of this allocator, so its slots fit
/// in `u32`): a `u32` range test folded without early exit, which LLVM vectorises.
#[inline]
fn all_in_page(geometry: PageGeometry, slots: &[KvSlot], page: usize) -> bool {
    let first = geometry.first_slot(page as PageId);
    let page_size = geometry.page_size() as KvSlot;
    !slots.iter().fold(false, |outside, &slot| {
        outside | (slot.wrapping_sub(first) >= page_size)
    })
}

/// The error of a segment whose `chunk` (the positions of `slots` that must lie in `page`) has
/// a slot outside it: the first such slot.
#[cold]
#[inline(never)]
fn segment_not_paged(
    geometry: PageGeometry,
    slots: &[KvSlot],
    mut chunk: std::ops::Range<usize>,
    page: usize,
) -> AllocError {
    let offset = chunk
        .find(|&i| geometry.page_of(slots[i]) != page)
        .expect("all_in_page found a slot outside the page");
    AllocError::SegmentNotPaged {
        offset,
        slot: slots[offset],
        expected_page: page,
    }
}

/// [`all_in_page`] for the one-page free, with runs of the common page sizes (16, 32, 64)
/// tested at a length known at compile time: straight-line vector code with no loop and no
/// remainder (W1_k1: 186 -> 159 instructions per page, with [`push_slot_run`] on the allocating
/// side). Only there: in `mark_segment` the same dispatch cost W2 about 1,300 more instructions
/// per step than the loop (LLVM's fixed-length code for that chunk was the longer).
#[inline]
fn run_in_page(geometry: PageGeometry, slots: &[KvSlot], page: usize) -> bool {
    fn fixed<const N: usize>(slots: &[KvSlot]) -> &[KvSlot] {
        <&[KvSlot; N]>::try_from(slots).map_or(slots, |run| run.as_slice())
    }
    match slots.len() {
        16 => all_in_page(geometry, fixed::<16>(slots), page),
        32 => all_in_page(geometry, fixed::<32>(slots), page),
        64 => all_in_page(geometry, fixed::<64>(slots), page),
        _ => all_in_page(geometry, slots, page),
    }
}

impl<R: ReuseOrder> KvAllocator for PageAllocator<R> {
    fn page_size(&self) -> usize {
        self.geometry.page_size()
    }

    fn capacity(&self) -> usize {
        self.num_pages * self.geometry.page_size()
    }

    fn available_size(&self) -> usize {
        self.free.total_len() * self.geometry.page_size()
    }

    // `always`: with a plain `#[inline]` LLVM stopped inlining this into a larger caller crate
    // (the bench binary after it grew), which cost W1_k1 26 instructions a page (159 -> 185).
    #[inline(always)]
    fn alloc(&mut self, num_tokens: usize, out: &mut Vec<KvSlot>) -> Result<(), AllocError> {
        let geometry = self.geometry;
        if geometry.offset(num_tokens) != 0 {
            return Err(AllocError::UnalignedAlloc {
                num_tokens,
                page_size: geometry.page_size(),
            });
        }
        let pages = geometry.whole_pages(num_tokens);
        self.ensure_free(pages)?;
        if pages == 1 {
            let first = geometry.first_slot(self.take_one_page());
            push_slot_run(out, first, geometry.page_size());
            return Ok(());
        }
        out.reserve(num_tokens);
        for page in self.free.take_front(pages) {
            self.state[page as usize] = PageState::Held;
            push_slot_run(out, geometry.first_slot(page), geometry.page_size());
        }
        Ok(())
    }

    #[inline]
    fn alloc_page_ids(
        &mut self,
        num_pages: usize,
        out: &mut Vec<PageId>,
    ) -> Result<(), AllocError> {
        self.ensure_free(num_pages)?;
        if num_pages == 1 {
            out.push(self.take_one_page());
            return Ok(());
        }
        out.reserve(num_pages);
        for page in self.free.take_front(num_pages) {
            self.state[page as usize] = PageState::Held;
            out.push(page);
        }
        Ok(())
    }

    fn alloc_extend(
        &mut self,
        reqs: &[ExtendShape],
        out: &mut Vec<KvSlot>,
    ) -> Result<(), AllocError> {
        let geometry = self.geometry;
        let (new_pages, new_tokens) = match self.check_extend_batch(reqs) {
            Ok(counts) => counts,
            Err(error) => {
                unmark_pages(
                    geometry,
                    &mut self.state,
                    reqs.iter().filter_map(|shape| shape.last_loc),
                );
                return Err(error);
            }
        };
        out.reserve(new_tokens);
        let mut pages = self.free.take_front(new_pages);
        // Also turns the partial pages `check_extend_batch` marked back to `Held`.
        for shape in reqs {
            fill_extend(geometry, shape, &mut pages, &mut self.state, out);
        }
        debug_assert!(pages.next().is_none(), "alloc_extend left pages unconsumed");
        Ok(())
    }

    fn alloc_decode(
        &mut self,
        reqs: &[DecodeShape],
        out: &mut Vec<KvSlot>,
    ) -> Result<(), AllocError> {
        self.decode_batch(reqs.iter().copied(), out)
    }

    /// Takes the batch's pages first (the only failure), then writes every request's slot in
    /// one pass that reads and writes each row once and checks nothing but the table's bounds.
    /// Debug builds verify the batch against the table and the page states first.
    #[inline]
    fn alloc_decode_trusted<I>(
        &mut self,
        batch: TrustedDecodeRows<I>,
        table: &mut ReqToTokenPool,
        out: &mut Vec<KvSlot>,
    ) -> Result<(), AllocError>
    where
        I: ExactSizeIterator<Item = DecodeRow> + Clone,
    {
        self.alloc_decode_trusted_with(batch, table, out, |_, _| {})
    }

    #[inline]
    fn free(&mut self, slots: &[KvSlot]) -> Result<(), AllocError> {
        if self.free_one_page(slots) {
            return Ok(());
        }
        let start = self.deferred.len();
        let result = self.mark_slots(slots);
        self.finish_free(start, result, true)
    }

    fn free_segment(&mut self, slots: &[KvSlot], start_pos: usize) -> Result<(), AllocError> {
        let start = self.deferred.len();
        let result = self.mark_segment(slots, start_pos);
        self.finish_free(start, result, false)
    }

    fn free_segments(&mut self, segments: &[(&[KvSlot], usize)]) -> Result<(), AllocError> {
        let start = self.deferred.len();
        // sglang frees segment by segment: outside a group, where each call puts its pages at
        // the head, the last segment's pages end up first.
        let prepended = !self.in_free_group && !self.need_sort && R::FREED_FIRST;
        let result = segments.iter().try_for_each(|&(slots, start_pos)| {
            let before = self.deferred.len();
            self.mark_segment(slots, start_pos)?;
            if prepended {
                let added = self.deferred.len() - before;
                self.deferred[start..].rotate_right(added);
            }
            Ok(())
        });
        self.finish_free(start, result, false)
    }

    #[inline]
    fn free_page_ids(&mut self, pages: &[PageId]) -> Result<(), AllocError> {
        // Fast path: one held page outside a group (page 0 is `Reserved`, so never `Held`).
        if let [page] = *pages
            && !self.in_free_group
            && self.state.get(page as usize) == Some(&PageState::Held)
        {
            self.free_held_page(page as usize);
            return Ok(());
        }
        self.free_page_ids_checked(pages)
    }

    fn free_group_begin(&mut self) -> Result<(), AllocError> {
        if self.in_free_group {
            return Err(AllocError::NestedFreeGroup {
                deferred_pages: self.deferred.len(),
            });
        }
        self.in_free_group = true;
        Ok(())
    }

    fn free_group_end(&mut self) -> Result<(), AllocError> {
        if !self.in_free_group {
            return Err(AllocError::NotInFreeGroup);
        }
        self.in_free_group = false;
        let ordered = std::mem::take(&mut self.ordered_deferred);
        self.release_deferred(ordered);
        Ok(())
    }

    fn in_free_group(&self) -> bool {
        self.in_free_group
    }
}

#[cfg(test)]
mod tests {
    use super::super::{InvariantViolation as V, PagedAllocator};
    use super::*;

    fn held_two() -> PagedAllocator {
        let mut allocator = PagedAllocator::new(16, 4, false).unwrap();
        allocator.alloc(8, &mut Vec::new()).unwrap();
        allocator.check().unwrap();
        allocator
    }

    /// The one-page paths compile runs of 16, 32 and 64 slots at a fixed length: for those and
    /// for other sizes, `alloc` writes the page's slots in order, and `free` of the page with any
    /// one slot moved to an unallocated page fails naming that page and changes nothing.
    #[test]
    fn one_page_paths_agree_for_fixed_and_other_page_sizes() {
        for page_size in [3, 15, 16, 17, 32, 64] {
            let mut allocator = PagedAllocator::new(page_size * 4, page_size, false).unwrap();
            let mut slots = Vec::new();
            allocator.alloc(page_size, &mut slots).unwrap();
            let first = page_size as KvSlot;
            assert_eq!(slots, (first..2 * first).collect::<Vec<_>>(), "{page_size}");
            let before = allocator.clone();
            for position in 0..page_size {
                let mut foreign = slots.clone();
                foreign[position] = 2 * first + position as KvSlot;
                let error = allocator.free(&foreign).unwrap_err();
                assert!(
                    matches!(error, AllocError::NotAllocated { page: 2, .. }),
                    "page size {page_size}, position {position}: {error:?}"
                );
                assert_eq!(
                    allocator, before,
                    "page size {page_size}, position {position}"
                );
            }
            assert_eq!(allocator.free_page_count(), 3, "{page_size}");
            allocator.free(&slots).unwrap();
            assert_eq!(allocator.free_pages().next(), Some(1), "{page_size}");
            assert_eq!(allocator.free_page_count(), 4, "{page_size}");
            allocator.check().unwrap();
        }
    }

    #[test]
    fn check_reports_a_duplicate_free_page() {
        let mut allocator = held_two();
        allocator.free.append(&[3]);
        assert_eq!(
            allocator.check(),
            Err(V::DuplicatePage {
                list: "free",
                page: 3
            })
        );
    }

    #[test]
    fn check_reports_a_page_out_of_range() {
        let mut allocator = held_two();
        allocator.free.append(&[9]);
        assert_eq!(
            allocator.check(),
            Err(V::PageOutOfRange {
                list: "free",
                page: 9,
                num_pages: 4
            })
        );
    }

    #[test]
    fn check_reports_a_listed_page_with_the_wrong_state() {
        let mut allocator = held_two();
        allocator.state[3] = PageState::Held;
        assert_eq!(
            allocator.check(),
            Err(V::StateMismatch {
                list: "free",
                page: 3,
                state: PageState::Held
            })
        );
    }

    #[test]
    fn check_reports_free_or_pending_pages_missing_from_lists() {
        let mut allocator = held_two();
        allocator.state[1] = PageState::Free;
        assert_eq!(
            allocator.check(),
            Err(V::MissingFromList {
                page: 1,
                state: PageState::Free
            })
        );
        allocator.state[1] = PageState::Pending;
        assert_eq!(
            allocator.check(),
            Err(V::MissingFromList {
                page: 1,
                state: PageState::Pending
            })
        );
    }

    #[test]
    fn check_reports_reserved_page_and_list_mode_violations() {
        let mut allocator = held_two();
        allocator.state[0] = PageState::Unused;
        assert_eq!(
            allocator.check(),
            Err(V::Reserved {
                page: 0,
                state: PageState::Unused
            })
        );
        let mut allocator = held_two();
        allocator.deferred.push(1);
        allocator.state[1] = PageState::Deferred;
        assert_eq!(allocator.check(), Err(V::DeferredOutsideGroup { count: 1 }));
        let mut allocator = held_two();
        allocator.free.release(&[2]);
        allocator.state[2] = PageState::Released;
        assert_eq!(
            allocator.check(),
            Err(V::ReleaseWithoutNeedSort { count: 1 })
        );
    }
}
