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

/// The free list in the ring's order: its head is the last page of `near`, and the pages after
/// the first of `near` continue from the last of `far`.
#[derive(Clone, Copy)]
pub(crate) struct FreeHeads<'a> {
    near: &'a [PageId],
    far: &'a [PageId],
}

impl FreeHeads<'_> {
    /// The `index`-th page of the free list (0 is the head), if the list is that long.
    #[inline(always)]
    pub(crate) fn get(self, index: usize) -> Option<PageId> {
        if index < self.near.len() {
            return Some(self.near[self.near.len() - 1 - index]);
        }
        let index = index - self.near.len();
        (index < self.far.len()).then(|| self.far[self.far.len() - 1 - index])
    }
}

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

    /// The free list as the (at most two) slices of the ring that hold it, for reading its
    /// first pages by index without the ring's index arithmetic per page.
    #[inline]
    pub(crate) fn heads(&self) -> FreeHeads<'_> {
        let (front, back) = self.pages.as_slices();
        match front.get(self.released..) {
            Some(far) => FreeHeads { near: back, far },
            None => FreeHeads {
                near: &back[self.released - front.len()..],
                far: &[],
            },
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

#[cfg(test)]
mod tests {
    use super::*;

    /// `heads().get(i)` is the `i`-th page of `free_pages()` (and `None` past the list) for
    /// rings wrapped anywhere, with and without released pages.
    #[test]
    fn heads_read_the_free_list_in_order() {
        for num_pages in [1, 2, 5, 8] {
            for (rotated, popped) in
                (0..num_pages).flat_map(|r| (0..=num_pages).map(move |p| (r, p)))
            {
                for released in 0..=popped {
                    let mut list = FreeList::try_full(num_pages).expect("room");
                    // Pages moved from the head to the tail move the ring's start.
                    let moved: Vec<PageId> = (0..rotated).map(|_| list.pop_front()).collect();
                    list.append(&moved);
                    let taken: Vec<PageId> = (0..popped).map(|_| list.pop_front()).collect();
                    list.release(&taken[..released]);
                    list.prepend(&taken[released..]);
                    let free: Vec<PageId> = list.free_pages().collect();
                    let heads = list.heads();
                    for index in 0..=num_pages {
                        assert_eq!(
                            heads.get(index),
                            free.get(index).copied(),
                            "{num_pages} pages, rotated {rotated}, {popped} popped, \
                             {released} released, index {index}"
                        );
                    }
                }
            }
        }
    }
}
