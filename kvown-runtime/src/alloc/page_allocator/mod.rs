//! [`PageAllocator`]: the one allocator core behind [`TokenAllocator`](super::TokenAllocator)
//! (page size 1, FIFO reuse) and [`PagedAllocator`](super::PagedAllocator) (LIFO reuse): its
//! state and checks here, the decode, the extend and the frees in their own files.

mod decode;
mod extend;
mod free;

use std::marker::PhantomData;

use super::free_list::FreeList;
use super::geometry::PageGeometry;
use super::rules::{fill_mark, last_handed};
use super::{
    AllocError, DecodeRequests, ExtendShape, FreeOrder, GroupStep, KvAllocator, KvSlot, PageId,
    PageState, ReuseOrder,
};
use crate::shared_error::{OutOfMemory, PageOutOfRange};

/// Bookkeeping bytes per page: the state byte, the two-byte fill mark, and a page id each in
/// the free/release ring and the deferred list ([`PageAllocator::bookkeeping_bytes`]).
const BYTES_PER_PAGE: usize = 1 + 2 + 2 * std::mem::size_of::<PageId>();

/// A page allocator over pages `1..=num_pages` of `page_size` slots; page 0 is padding.
///
/// * Allocation always takes pages from the head of the free list.
/// * `R` decides where freed pages go: [`Fifo`](super::Fifo) appends them in the order given,
///   [`Lifo`](super::Lifo) prepends them (a plain `free` sorted ascending, a `free_segment` in
///   row order, a group end as [`deferred_pages`](Self::deferred_pages) lists them: the pages
///   of `free_segment(s)` and `free_page_ids` in call order, then those of `free` sorted
///   ascending).
/// * With `need_sort`, frees go to a release list instead, merged into the free list and sorted
///   ascending when a call's over-estimate of the pages it takes exceeds the free list
///   ([`PageAllocator::merge_released`]). A call answered out of memory keeps that merge, which
///   moves no page between owners. Rule: sglang `merge_and_sort_free` and its callers.
/// * Every page carries a [`PageState`], so double frees, frees of unallocated pages and
///   duplicate pages are rejected before anything changes, and a fill mark (the low 16 bits of
///   its last handed-out slot, two bytes), so that a continuation from any slot but the page's
///   last handed-out one is rejected too ([`AllocError::LastLocNotLatest`]).
///
/// # Examples
///
/// ```
/// use kvown_runtime::alloc::{ExtendShape, KvAllocator, PageState, PagedAllocator};
///
/// let mut allocator = PagedAllocator::new(16, 4, false)?; // pages 1..=4
/// let prompt = ExtendShape { prefix_len: 0, seq_len: 6, last_loc: None };
/// allocator.alloc_extend(&[prompt], &mut Vec::new())?; // page 1 whole, page 2 half
/// assert_eq!(allocator.num_pages(), 4);
/// assert_eq!(allocator.free_pages().collect::<Vec<_>>(), [3, 4]);
/// assert_eq!(allocator.free_page_count(), 2);
/// assert_eq!(allocator.page_state(2), Some(PageState::Held));
/// assert!(allocator.is_page_allocated(2) && allocator.is_page_free(3));
/// assert_eq!(allocator.last_handed(2), Some(9), "slots 8 and 9 of page 2");
/// assert!(allocator.bookkeeping_bytes() >= 5 * 11);
/// allocator.check()?;
/// allocator.clear();
/// assert_eq!(allocator.available_size(), 16);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// A free group's pages stay deferred until its guard commits:
///
/// ```
/// use kvown_runtime::alloc::{FreeOrder, KvAllocator, PagedAllocator};
///
/// let mut allocator = PagedAllocator::new(16, 4, false)?;
/// let mut pages = Vec::new();
/// allocator.alloc_page_ids(3, &mut pages)?;
/// let mut group = allocator.free_group()?;
/// assert!(group.in_free_group());
/// group.free_page_ids(&[2, 1], FreeOrder::Given)?;
/// assert_eq!((group.deferred_count(), group.deferred_pages()), (2, &[2, 1][..]));
/// group.commit();
/// assert_eq!((allocator.deferred_count(), allocator.in_free_group()), (0, false));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PageAllocator<R: ReuseOrder> {
    geometry: PageGeometry,
    num_pages: usize,
    need_sort: bool,
    state: Vec<PageState>,
    /// Per page, the low 16 bits of its last handed-out slot: its fill mark, meaningful while
    /// the page is held.
    fill: Vec<u16>,
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
        let mut fill = Vec::new();
        let mut deferred = Vec::new();
        if state.try_reserve_exact(num_pages + 1).is_err()
            || fill.try_reserve_exact(num_pages + 1).is_err()
            || deferred.try_reserve_exact(num_pages).is_err()
        {
            return Err(too_large);
        }
        let free = FreeList::try_full(num_pages).ok_or(too_large)?;
        state.push(PageState::Reserved);
        state.resize(num_pages + 1, PageState::Unused);
        fill.resize(num_pages + 1, 0);
        Ok(Self {
            geometry: PageGeometry::new(page_size),
            num_pages,
            need_sort,
            state,
            fill,
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
    ///
    /// # Examples
    ///
    /// ```
    /// # use kvown_runtime::alloc::{KvAllocator, PagedAllocator, SlotCalls};
    /// let mut allocator = PagedAllocator::new(16, 4, true)?;
    /// assert!(allocator.need_sort());
    /// let mut slots = Vec::new();
    /// allocator.alloc(8, &mut slots)?;
    /// allocator.free(&slots)?;
    /// assert_eq!(allocator.released_pages().count(), 2, "waiting for a merge");
    /// assert_eq!(allocator.available_size(), 16, "but available");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn need_sort(&self) -> bool {
        self.need_sort
    }

    /// Merges the release list into the free list, sorted ascending (sglang
    /// `merge_and_sort_free`); a no-op when nothing is released.
    ///
    /// Allocations merge by themselves when a call's over-estimate of its pages exceeds the free
    /// list, a call answered out of memory included; this is for a caller that wants the free
    /// list merged at another point (before reading it, or to start a phase from a sorted list).
    ///
    /// # Examples
    ///
    /// ```
    /// # use kvown_runtime::alloc::{FreeOrder, KvAllocator, PagedAllocator};
    /// let mut allocator = PagedAllocator::new(16, 4, true)?;
    /// let mut pages = Vec::new();
    /// allocator.alloc_page_ids(4, &mut pages)?;
    /// allocator.free_page_ids(&[3, 1], FreeOrder::Given)?;
    /// allocator.merge_released();
    /// assert_eq!(allocator.free_pages().collect::<Vec<_>>(), [1, 3], "merged and sorted");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
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
    ///
    /// # Examples
    ///
    /// ```
    /// # use kvown_runtime::alloc::{FreeOrder, KvAllocator, PagedAllocator};
    /// let mut allocator = PagedAllocator::new(16, 4, true)?;
    /// let mut pages = Vec::new();
    /// allocator.alloc_page_ids(2, &mut pages)?;
    /// allocator.free_page_ids(&pages, FreeOrder::Given)?;
    /// let mut released: Vec<_> = allocator.released_pages().collect();
    /// released.sort();
    /// assert_eq!(released, [1, 2]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
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

    /// The last slot of `page` handed out, by its fill mark: a continuation of the page starts
    /// after it. `None` for a page not held (or beyond the last page).
    pub fn last_handed(&self, page: PageId) -> Option<KvSlot> {
        let mark = *self.fill.get(page as usize)?;
        self.is_page_allocated(page)
            .then(|| last_handed(self.geometry, page, mark))
    }

    /// Whether a free group is open: frees made now stay deferred, and their pages
    /// unavailable, until its guard commits ([`KvAllocator::free_group`]).
    pub fn in_free_group(&self) -> bool {
        self.in_free_group
    }

    /// Bytes of bookkeeping this allocator holds: the struct, one state byte and a two-byte
    /// fill mark per page, and the free/release ring and the deferred list with 4 bytes per
    /// page each (11 bytes per page).
    pub fn bookkeeping_bytes(&self) -> usize {
        std::mem::size_of::<Self>()
            + self.state.capacity() // one byte per state
            + self.fill.capacity() * std::mem::size_of::<u16>()
            + self.free.capacity() * std::mem::size_of::<PageId>()
            + self.deferred.capacity() * std::mem::size_of::<PageId>()
    }

    /// Every page free again (`[1, …, num_pages]`), release list empty, no open group.
    pub fn clear(&mut self) {
        self.state.fill(PageState::Unused);
        self.state[0] = PageState::Reserved;
        self.fill.fill(0);
        self.free.reset(self.num_pages);
        self.deferred.clear();
        self.ordered_deferred = 0;
        self.in_free_group = false;
    }

    /// Verifies the bookkeeping: page 0 reserved, the free, release and deferred lists hold
    /// distinct in-range pages whose states agree with the list, every page marked free,
    /// released or deferred is in its list, nothing is left pending, and each held page's fill
    /// mark names one of its slots. O(num_pages); allocates
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
        self.check_fill_marks()
    }

    /// Checks that each held page's fill mark names one of its slots. A mark tells slots apart
    /// modulo 2^16, so for larger pages every mark names one.
    fn check_fill_marks(&self) -> Result<(), super::InvariantViolation> {
        let page_size = self.geometry.page_size();
        if page_size > 1 << 16 {
            return Ok(());
        }
        for (page, (&state, &mark)) in self.state.iter().zip(&self.fill).enumerate() {
            let first = self.geometry.first_slot(page as PageId);
            let offset = usize::from(mark.wrapping_sub(first as u16));
            if state == PageState::Held && offset >= page_size {
                return Err(super::InvariantViolation::FillMarkOutsidePage {
                    page,
                    mark,
                    page_size,
                });
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
                    range: PageOutOfRange {
                        page,
                        pages: self.num_pages + 1,
                    },
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
        Err(AllocError::OutOfMemory(OutOfMemory {
            requested: pages.saturating_mul(self.geometry.page_size()),
            available: self.available_size(),
            evictable: 0,
        }))
    }

    /// Takes the head of the free list (`ensure_free(1)` made one available) and marks it held:
    /// one page without an iterator over the free list.
    #[inline(always)]
    fn take_one_page(&mut self) -> PageId {
        let page = self.free.pop_front();
        self.state[page as usize] = PageState::Held;
        page
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

    fn alloc_extend(
        &mut self,
        reqs: &[ExtendShape],
        out: &mut Vec<KvSlot>,
    ) -> Result<(), AllocError> {
        self.extend(reqs, out)
    }

    #[inline]
    fn alloc_decode<D: DecodeRequests>(
        &mut self,
        reqs: D,
        out: &mut Vec<KvSlot>,
    ) -> Result<(), AllocError> {
        self.decode(reqs, out)
    }

    // `always`: the slot-level `alloc` is built on it, and with a plain `#[inline]` LLVM
    // stopped inlining that into a larger caller crate (W1_k1: 159 -> 185 instructions a page).
    #[inline(always)]
    fn alloc_page_ids(
        &mut self,
        num_pages: usize,
        out: &mut Vec<PageId>,
    ) -> Result<(), AllocError> {
        self.ensure_free(num_pages)?;
        let page_size = self.geometry.page_size() as KvSlot;
        if num_pages == 1 {
            let page = self.take_one_page();
            self.fill[page as usize] = fill_mark((page + 1) * page_size - 1);
            out.push(page);
            return Ok(());
        }
        let start = out.len();
        self.free.take_front_into(num_pages, out);
        // Slices taken before the loop: a store through `self.state[..]` would make LLVM load
        // both vectors' pointers and lengths again for every page.
        let (state, fill) = (&mut self.state[..], &mut self.fill[..]);
        for &page in &out[start..] {
            state[page as usize] = PageState::Held;
            fill[page as usize] = fill_mark((page + 1) * page_size - 1);
        }
        Ok(())
    }

    #[inline]
    fn free_page_ids(&mut self, pages: &[PageId], order: FreeOrder<'_>) -> Result<(), AllocError> {
        self.free_by_id(pages, order)
    }

    fn free_group_step(&mut self, step: GroupStep) -> Result<(), AllocError> {
        self.group_step(step)
    }
}

#[cfg(test)]
mod tests {
    use super::super::{InvariantViolation as V, PagedAllocator, SlotCalls};
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

    /// A pool whose free ring wraps: pages taken from its head and freed to its head in another
    /// order, so that a bulk take reads both halves of the ring.
    fn wrapped(page_size: usize, num_pages: usize) -> PagedAllocator {
        let mut allocator = PagedAllocator::new(page_size * num_pages, page_size, false).unwrap();
        let mut pages = Vec::new();
        allocator.alloc_page_ids(num_pages / 2, &mut pages).unwrap();
        for &page in pages.iter().step_by(2) {
            allocator.free_page_ids(&[page], FreeOrder::Given).unwrap();
        }
        allocator.check().unwrap();
        allocator
    }

    /// Held slots plus available slots make the capacity, and the checker passes.
    fn assert_accounted(allocator: &PagedAllocator, held_pages: usize) {
        allocator.check().unwrap();
        assert_eq!(
            allocator.available_size() + held_pages * allocator.page_size(),
            allocator.capacity()
        );
    }

    /// A bulk `alloc_page_ids` / `alloc` hands out the head of the free list in order, marks each
    /// page held with every slot handed out, and writes each page's run; one more page than
    /// there are is refused and changes nothing.
    #[test]
    fn bulk_allocations_take_the_free_head_in_order() {
        for page_size in [1, 3, 16, 32, 64] {
            let mut allocator = wrapped(page_size, 40);
            let free: Vec<PageId> = allocator.free_pages().collect();
            let before = allocator.clone();
            let mut out = vec![7];
            let error = allocator.alloc_page_ids(free.len() + 1, &mut out);
            assert!(
                matches!(error, Err(AllocError::OutOfMemory { .. })),
                "{error:?}"
            );
            assert_eq!((&allocator, &out[..]), (&before, &[7][..]), "{page_size}");
            allocator.alloc_page_ids(10, &mut out).unwrap();
            assert_eq!(out[1..], free[..10], "{page_size}");
            let mut slots = vec![7];
            allocator.alloc(12 * page_size, &mut slots).unwrap();
            let runs: Vec<KvSlot> = free[10..22]
                .iter()
                .flat_map(|&page| page * page_size as KvSlot..(page + 1) * page_size as KvSlot)
                .collect();
            assert_eq!(slots[1..], runs, "{page_size}");
            for &page in &free[..22] {
                let last = (page + 1) * page_size as KvSlot - 1;
                assert_eq!(allocator.last_handed(page), Some(last), "{page_size}");
            }
            assert_accounted(&allocator, 40 - free.len() + 22);
        }
        // Past the 1,024 page ids `alloc` stacks, the runs are written in place.
        for page_size in [3, 16] {
            let mut allocator = wrapped(page_size, 2400);
            let free: Vec<PageId> = allocator.free_pages().collect();
            let mut slots = vec![7];
            allocator.alloc(1500 * page_size, &mut slots).unwrap();
            let runs: Vec<KvSlot> = free[..1500]
                .iter()
                .flat_map(|&page| page * page_size as KvSlot..(page + 1) * page_size as KvSlot)
                .collect();
            assert_eq!(slots[1..], runs, "{page_size}");
            assert_accounted(&allocator, 2400 - free.len() + 1500);
        }
    }

    /// A bulk free with one page at fault anywhere (page 0, out of range, never allocated, freed
    /// already) is refused naming that page and changes nothing; a page named twice is freed
    /// once. Inside a free group the same holds, and the commit releases every page.
    #[test]
    fn a_refused_bulk_free_changes_nothing() {
        let mut allocator = wrapped(16, 64);
        let mut held = Vec::new();
        allocator.alloc_page_ids(20, &mut held).unwrap();
        let freed = held.pop().unwrap();
        allocator.free_page_ids(&[freed], FreeOrder::Given).unwrap();
        let unused = 64;
        assert!(!allocator.is_page_allocated(unused) && !allocator.is_page_allocated(freed));
        for order in [
            FreeOrder::Given,
            FreeOrder::Unordered,
            FreeOrder::Segments(&[5, 12]),
        ] {
            for (bad, position) in [(0, 0), (65, 7), (unused, 19), (freed, 10)] {
                let mut pages = held.clone();
                pages.insert(position, bad);
                let before = allocator.clone();
                let error = allocator.free_page_ids(&pages, order).unwrap_err();
                let named = match error {
                    AllocError::PageOutOfRange(range) => range.page,
                    AllocError::NotAllocated { page, .. } | AllocError::DoubleFree { page, .. } => {
                        page
                    }
                    AllocError::ReservedSlot { .. } => 0,
                    other => panic!("{other:?}"),
                };
                assert_eq!(named, bad, "{order:?}");
                assert_eq!(allocator, before, "{order:?}, page {bad} at {position}");
            }
        }
        let mut group = allocator.clone();
        let mut twice = held.clone();
        twice.push(held[3]);
        allocator.free_page_ids(&twice, FreeOrder::Given).unwrap();
        assert!(held.iter().all(|&page| allocator.is_page_free(page)));
        assert_eq!(allocator.free_pages().take(19).collect::<Vec<_>>(), held);
        assert_accounted(&allocator, 16);
        group.free_group_step(GroupStep::OPEN).unwrap();
        group.free_page_ids(&twice, FreeOrder::Given).unwrap();
        assert_eq!(group.deferred_pages(), &held[..]);
        group.free_group_step(GroupStep::COMMIT).unwrap();
        assert_eq!(group, allocator);
    }

    proptest::proptest! {
        /// Bulk page-id calls against a model of the held set: an allocation of `take` pages
        /// (refused when there are fewer, changing nothing), then a free of some held pages in
        /// any order with repeats and, sometimes, one page at fault (refused, changing
        /// nothing). After every call the held pages are the model's and the slots add up.
        #[test]
        fn bulk_page_calls_are_all_or_nothing(
            steps in proptest::collection::vec(
                (0usize..40, proptest::collection::vec(0usize..64, 0..48), proptest::option::of(0u32..70)),
                1..24,
            ),
        ) {
            let mut allocator = PagedAllocator::new(16 * 64, 16, false).unwrap();
            let mut held: Vec<PageId> = Vec::new();
            for (take, picks, fault) in steps {
                let before = allocator.clone();
                let mut out = Vec::new();
                match allocator.alloc_page_ids(take, &mut out) {
                    Ok(()) => {
                        proptest::prop_assert_eq!(out.len(), take);
                        held.extend(&out);
                    }
                    Err(_) => {
                        proptest::prop_assert!(take > before.free_page_count());
                        proptest::prop_assert_eq!(&allocator, &before);
                    }
                }
                let mut pages: Vec<PageId> = if held.is_empty() {
                    Vec::new()
                } else {
                    picks.iter().map(|&pick| held[pick % held.len()]).collect()
                };
                let at_fault = fault.filter(|&page| !held.contains(&page));
                if let Some(page) = at_fault {
                    pages.insert(pages.len() / 2, page);
                }
                let before = allocator.clone();
                match allocator.free_page_ids(&pages, FreeOrder::Given) {
                    Ok(()) => {
                        proptest::prop_assert!(at_fault.is_none());
                        held.retain(|page| !pages.contains(page));
                    }
                    Err(_) => {
                        proptest::prop_assert!(at_fault.is_some());
                        proptest::prop_assert_eq!(&allocator, &before);
                    }
                }
                for &page in &held {
                    proptest::prop_assert!(allocator.is_page_allocated(page));
                }
                allocator.check().unwrap();
                proptest::prop_assert_eq!(
                    allocator.available_size() + held.len() * 16,
                    allocator.capacity()
                );
            }
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
                range: PageOutOfRange { page: 9, pages: 5 }
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
    fn check_reports_a_fill_mark_outside_its_page() {
        let mut allocator = held_two();
        // Page 2 holds slots 8..12; a mark of slot 12 is page 3's first slot.
        allocator.fill[2] = 12;
        assert_eq!(
            allocator.check(),
            Err(V::FillMarkOutsidePage {
                page: 2,
                mark: 12,
                page_size: 4
            })
        );
        allocator.fill[2] = 11;
        assert_eq!(allocator.check(), Ok(()));
        // A free page's mark is never read: anything goes.
        allocator.fill[3] = 0;
        assert_eq!(allocator.check(), Ok(()));
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
