//! Slot and page arithmetic for one page size, with a shift fast path for powers of two.

use super::{KvSlot, PageId};

/// The page size of one allocator and the arithmetic that maps slots and positions to pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PageGeometry {
    page_size: usize,
    shift: u32,
    power_of_two: bool,
}

impl PageGeometry {
    /// Geometry for `page_size >= 1` (the caller checks the lower bound).
    pub(crate) fn new(page_size: usize) -> Self {
        debug_assert!(page_size >= 1);
        Self {
            page_size,
            shift: page_size.trailing_zeros(),
            power_of_two: page_size.is_power_of_two(),
        }
    }

    /// Slots per page.
    #[inline]
    pub(crate) fn page_size(self) -> usize {
        self.page_size
    }

    /// The page that holds `slot`.
    #[inline]
    pub(crate) fn page_of(self, slot: KvSlot) -> usize {
        if self.power_of_two {
            (slot >> self.shift) as usize
        } else {
            slot as usize / self.page_size
        }
    }

    /// `n % page_size`: the offset of position or slot `n` inside its page.
    #[inline]
    pub(crate) fn offset(self, n: usize) -> usize {
        if self.power_of_two {
            n & (self.page_size - 1)
        } else {
            n % self.page_size
        }
    }

    /// `floor(n / page_size)`: the whole pages in `n` tokens.
    #[inline]
    pub(crate) fn whole_pages(self, n: usize) -> usize {
        if self.power_of_two {
            n >> self.shift
        } else {
            n / self.page_size
        }
    }

    /// `ceil(n / page_size)`: the pages that back `n` tokens, without overflow.
    #[inline]
    pub(crate) fn pages_for(self, n: usize) -> usize {
        self.whole_pages(n) + usize::from(self.offset(n) != 0)
    }

    /// The first slot of `page`. Callers only pass pages whose slots fit in `u32`.
    #[inline]
    pub(crate) fn first_slot(self, page: PageId) -> KvSlot {
        page * self.page_size as KvSlot
    }
}
