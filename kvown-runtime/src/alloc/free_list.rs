//! The free list and the `need_sort` release list, stored in one ring buffer.
//!
//! Layout: `pages[..released]` is the release list and `pages[released..]` the free list, with
//! its head (the page allocated next) at the back. Allocation and the LIFO prepend then touch
//! only the back and the ring's start index stays put (with the head at the front, every freed
//! and reallocated page moved it back and forth: 10 more instructions per `W1_k1` page). "Front"
//! in the method names is the head of the free list, wherever it is stored. The release list is
//! unordered, because the only thing that reads it is the merge, which sorts everything.

use std::collections::VecDeque;

use super::PageId;

/// Free pages in allocation order, followed by released pages awaiting a merge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FreeList {
    pages: VecDeque<PageId>,
    released: usize,
}

impl FreeList {
    /// `[1, 2, …, num_pages]` (head first), nothing released, room for every page; `None`
    /// when the system allocator refuses the room.
    pub(crate) fn try_full(num_pages: usize) -> Option<Self> {
        let mut pages = VecDeque::new();
        pages.try_reserve_exact(num_pages).ok()?;
        let mut list = Self { pages, released: 0 };
        list.reset(num_pages);
        Some(list)
    }

    /// Back to `[1, 2, …, num_pages]` with an empty release list; keeps the buffer.
    pub(crate) fn reset(&mut self, num_pages: usize) {
        self.pages.clear();
        self.pages.extend((1..=num_pages as PageId).rev());
        self.released = 0;
    }

    /// Pages in the free list proper.
    #[inline]
    pub(crate) fn free_len(&self) -> usize {
        self.pages.len() - self.released
    }

    /// Pages in the release list.
    #[inline]
    pub(crate) fn released_len(&self) -> usize {
        self.released
    }

    /// Free plus released pages.
    #[inline]
    pub(crate) fn total_len(&self) -> usize {
        self.pages.len()
    }

    /// Pages the buffer can hold without reallocating.
    pub(crate) fn capacity(&self) -> usize {
        self.pages.capacity()
    }

    /// The free list, head first.
    pub(crate) fn free_pages(&self) -> impl Iterator<Item = PageId> + '_ {
        self.pages.iter().rev().take(self.free_len()).copied()
    }

    /// The release list, in no particular order.
    pub(crate) fn released_pages(&self) -> impl Iterator<Item = PageId> + '_ {
        self.pages.iter().take(self.released).copied()
    }

    /// Removes and yields the first `n` free pages (`n <= free_len`); pages not pulled from
    /// the iterator stay in the list.
    #[inline]
    pub(crate) fn take_front(&mut self, n: usize) -> impl Iterator<Item = PageId> + '_ {
        debug_assert!(n <= self.free_len());
        let pages = &mut self.pages;
        (0..n).map_while(move |_| pages.pop_back())
    }

    /// Moves the first `n` free pages (`n <= free_len`) to the end of `out`, head first: one
    /// copy of at most two slices of the ring, not a page at a time.
    #[inline]
    pub(crate) fn take_front_into(&mut self, n: usize, out: &mut Vec<PageId>) {
        debug_assert!(n <= self.free_len());
        let rest = self.pages.len() - n;
        let (front, back) = self.pages.as_slices();
        // The head is the ring's last page: the taken pages are the ring's tail, reversed.
        let in_back = n.min(back.len());
        out.extend(back[back.len() - in_back..].iter().rev());
        out.extend(front[front.len() - (n - in_back)..].iter().rev());
        self.pages.truncate(rest);
    }

    /// The `index`-th page of the free list (0 is the head), if the list is that long.
    #[inline]
    pub(crate) fn peek(&self, index: usize) -> Option<PageId> {
        if index < self.free_len() {
            self.pages.get(self.pages.len() - 1 - index).copied()
        } else {
            None
        }
    }

    /// Removes and returns the head of the free list (`free_len >= 1`).
    #[inline]
    pub(crate) fn pop_front(&mut self) -> PageId {
        debug_assert!(self.free_len() >= 1);
        self.pages
            .pop_back()
            .expect("ensure_free made a free page available")
    }

    /// Puts `pages` at the head, keeping their order (`pages[0]` becomes the head).
    #[inline]
    pub(crate) fn prepend(&mut self, pages: &[PageId]) {
        if let [page] = *pages {
            self.pages.push_back(page);
            return;
        }
        self.pages.extend(pages.iter().rev());
    }

    /// Puts `pages` at the tail of the free list, keeping their order. Only valid while the
    /// release list is empty (`need_sort` off).
    #[inline]
    pub(crate) fn append(&mut self, pages: &[PageId]) {
        debug_assert_eq!(self.released, 0);
        for &page in pages {
            self.pages.push_front(page);
        }
    }

    /// Adds `pages` to the release list.
    #[inline]
    pub(crate) fn release(&mut self, pages: &[PageId]) {
        for &page in pages {
            self.pages.push_front(page);
        }
        self.released += pages.len();
    }

    /// `free = sort(free ∪ release)` (the smallest page at the head), release emptied.
    pub(crate) fn merge_and_sort(&mut self) {
        self.pages
            .make_contiguous()
            .sort_unstable_by(|a, b| b.cmp(a));
        self.released = 0;
    }
}
