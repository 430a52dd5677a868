//! Page frees and free groups: every free is checked and marked page by page, then released
//! (or deferred in a group) as one update, or undone.

use super::PageAllocator;
use crate::alloc::{AllocError, FreeOrder, GroupStep, KvSlot, PageId, PageState, ReuseOrder};
use crate::shared_error::PageOutOfRange;

impl<R: ReuseOrder> PageAllocator<R> {
    /// [`KvAllocator::free_page_ids`](crate::alloc::KvAllocator::free_page_ids): one held page
    /// outside a group goes straight back (page 0 is `Reserved`, so never `Held`); anything else
    /// takes the checked path.
    #[inline]
    pub(super) fn free_by_id(
        &mut self,
        pages: &[PageId],
        order: FreeOrder<'_>,
    ) -> Result<(), AllocError> {
        if let [page] = *pages
            && !self.in_free_group
            && self.state.get(page as usize) == Some(&PageState::Held)
        {
            self.free_held_page(page as usize);
            return Ok(());
        }
        self.free_checked(pages, order)
    }

    /// The general path of `free_by_id`: every page checked and marked, then released (or
    /// deferred inside a group) as one update, in `order`; on error nothing changes.
    #[inline(never)]
    fn free_checked(&mut self, pages: &[PageId], order: FreeOrder<'_>) -> Result<(), AllocError> {
        let start = self.deferred.len();
        let result = match order {
            FreeOrder::Segments(ends) => self.mark_segments(pages, ends, start),
            FreeOrder::Given | FreeOrder::Unordered => self.mark_run(pages),
        };
        self.finish_free(start, result, order == FreeOrder::Unordered)
    }

    /// Marks the pages of consecutive segments (`pages[..ends[0]]`, `pages[ends[0]..ends[1]]`,
    /// ..., the rest last; ends clamped into order), as sglang's segment-by-segment frees take
    /// them: outside a group, where each of its calls puts its pages at the head, the last
    /// segment's pages end up first.
    fn mark_segments(
        &mut self,
        pages: &[PageId],
        ends: &[usize],
        start: usize,
    ) -> Result<(), AllocError> {
        let prepended = !self.in_free_group && !self.need_sort && R::FREED_FIRST;
        let mut from = 0;
        let segment_ends = ends.iter().map(|&end| end.min(pages.len()));
        for end in segment_ends.chain([pages.len()]) {
            let end = end.max(from);
            let before = self.deferred.len();
            self.mark_run(&pages[from..end])?;
            if prepended {
                let added = self.deferred.len() - before;
                self.deferred[start..].rotate_right(added);
            }
            from = end;
        }
        Ok(())
    }

    /// Marks `pages` pending for the free in progress and records them, as [`Self::mark_listed`]
    /// of each in turn does, streamed when every page is in range and held, and named once: one
    /// range test for all of them, one pass over their states, one copy of their ids. Otherwise
    /// (a page at fault, or one named twice) the marks made are undone and the pages go one by
    /// one, which names the first page at fault and skips repeats.
    #[inline]
    fn mark_run(&mut self, pages: &[PageId]) -> Result<(), AllocError> {
        if pages.len() > 1 {
            let num_pages = self.num_pages as PageId;
            let in_range = pages.iter().fold(true, |in_range, &page| {
                in_range & (page.wrapping_sub(1) < num_pages)
            });
            if in_range {
                // A slice, not the vector: see `alloc_page_ids`.
                let state = &mut self.state[..];
                let marked = pages
                    .iter()
                    .take_while(|&&page| {
                        let page = &mut state[page as usize];
                        let held = *page == PageState::Held;
                        if held {
                            *page = PageState::Pending;
                        }
                        held
                    })
                    .count();
                if marked == pages.len() {
                    self.deferred.extend_from_slice(pages);
                    return Ok(());
                }
                // Each page marked was held and named once: held again, as before the call.
                for &page in &pages[..marked] {
                    state[page as usize] = PageState::Held;
                }
            }
        }
        pages.iter().try_for_each(|&page| self.mark_listed(page))
    }

    /// Marks `page` pending for the free in progress after checking that it is one of this
    /// allocator's pages.
    #[inline]
    fn mark_listed(&mut self, page: PageId) -> Result<(), AllocError> {
        if page == 0 || page as usize > self.num_pages {
            return Err(AllocError::PageOutOfRange(PageOutOfRange {
                page,
                pages: self.num_pages + 1,
            }));
        }
        self.mark_page(page as usize, self.geometry.first_slot(page))
    }

    /// Marks `page` pending in the current free call and records it, or skips it when this
    /// call already named it; `slot` names the page in the errors.
    #[inline]
    fn mark_page(&mut self, page: usize, slot: KvSlot) -> Result<(), AllocError> {
        match self.state.get(page) {
            Some(PageState::Held) => {
                self.state[page] = PageState::Pending;
                self.deferred.push(page as PageId);
                Ok(())
            }
            Some(PageState::Pending) => Ok(()),
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

    /// Finishes a free call whose pages are `deferred[start..]`: undoes them on error, defers
    /// them inside a group (after the ordered ones unless `unordered`), releases them otherwise
    /// (sorted when `unordered`).
    #[inline]
    fn finish_free(
        &mut self,
        start: usize,
        result: Result<(), AllocError>,
        unordered: bool,
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
            if !unordered {
                let added = self.deferred.len() - start;
                self.deferred[self.ordered_deferred..].rotate_right(added);
                self.ordered_deferred += added;
            }
        } else {
            self.release_deferred(if unordered { 0 } else { self.deferred.len() });
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
        let state = &mut self.state[..];
        for &page in &self.deferred {
            state[page as usize] = freed;
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

    /// [`KvAllocator::free_group_step`](crate::alloc::KvAllocator::free_group_step): opens a
    /// group (refused inside one), or commits it: every deferred page released as one update,
    /// those of ordered frees in call order, then those of unordered ones (sorted with LIFO
    /// reuse); committing without an open group does nothing.
    pub(super) fn group_step(&mut self, step: GroupStep) -> Result<(), AllocError> {
        if step.opens() {
            if self.in_free_group {
                return Err(AllocError::NestedFreeGroup {
                    deferred_pages: self.deferred.len(),
                });
            }
            self.in_free_group = true;
        } else if self.in_free_group {
            self.in_free_group = false;
            let ordered = std::mem::take(&mut self.ordered_deferred);
            self.release_deferred(ordered);
        }
        Ok(())
    }
}
