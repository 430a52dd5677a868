//! [`TokenAllocator`]: page size 1, FIFO reuse (sglang `TokenToKVPoolAllocator`).

use super::{AllocError, Fifo, PageAllocator};

/// Slot allocator with page size 1: slots `1..=size`, allocation from the head of the free
/// list, freed slots appended to the tail (reused last). Slot 0 is padding.
pub type TokenAllocator = PageAllocator<Fifo>;

impl PageAllocator<Fifo> {
    /// An allocator over slots `1..=size`, all free. `need_sort` sends frees to a release list
    /// that is merged and sorted when the free list alone is short.
    ///
    /// Fails with [`AllocError::TooManySlots`] when `size` exceeds `u32::MAX - 1` (the end of
    /// the last slot, `size + 1`, must fit in a `u32` as well), or with
    /// [`AllocError::PoolTooLarge`] when the host refuses the bookkeeping (11 bytes a slot);
    /// nothing aborts, whatever the size.
    ///
    /// # Examples
    ///
    /// ```
    /// # use kvown_runtime::alloc::{KvAllocator, SlotCalls, TokenAllocator};
    /// let mut allocator = TokenAllocator::new(4, false)?; // slots 1..=4
    /// let mut slots = Vec::new();
    /// allocator.alloc(2, &mut slots)?;
    /// allocator.free(&slots[..1])?; // appended: reused last
    /// slots.clear();
    /// allocator.alloc(3, &mut slots)?;
    /// assert_eq!(slots, [3, 4, 1]);
    /// assert!(TokenAllocator::new(u32::MAX as usize, false).is_err(), "past the u32 range");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn new(size: usize, need_sort: bool) -> Result<Self, AllocError> {
        Self::with_pages(1, size, need_sort)
    }
}
