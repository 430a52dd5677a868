//! [`PagedAllocator`]: any page size, LIFO reuse (sglang `PagedTokenToKVPoolAllocator`).

use super::{AllocError, Lifo, PageAllocator};

/// Page allocator: pages `1..=size / page_size`, allocation from the head of the free list,
/// freed pages prepended to the head (reused first). Page 0 (slots `0..page_size`) is padding;
/// the KV buffers need `size + page_size` rows.
pub type PagedAllocator = PageAllocator<Lifo>;

impl PageAllocator<Lifo> {
    /// An allocator over `size / page_size` pages of `page_size` slots, all free.
    /// `need_sort` sends frees to a release list that is merged and sorted when the free list
    /// alone is short.
    ///
    /// # Rounding
    /// A `size` that is not a multiple of `page_size` is rounded **down** to whole pages, as
    /// sglang's `PagedTokenToKVPoolAllocator` does (`num_pages = size // page_size`): `new(100,
    /// 16)` has [`capacity`](super::KvAllocator::capacity) 96. Use
    /// [`PagedAllocator::new_exact`] to have such a size refused instead.
    ///
    /// # Errors
    /// [`AllocError::ZeroPageSize`], [`AllocError::TooManySlots`] when a slot id would not fit
    /// in a `u32`, or [`AllocError::PoolTooLarge`] when the host refuses the bookkeeping (11
    /// bytes a page); nothing aborts, whatever the sizes.
    ///
    /// # Examples
    ///
    /// ```
    /// # use kvown_runtime::alloc::{KvAllocator, PagedAllocator};
    /// let allocator = PagedAllocator::new(100, 16, false)?;
    /// assert_eq!(allocator.capacity(), 96, "rounded down to whole pages");
    /// assert!(PagedAllocator::new(100, 0, false).is_err());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn new(size: usize, page_size: usize, need_sort: bool) -> Result<Self, AllocError> {
        if page_size == 0 {
            return Err(AllocError::ZeroPageSize);
        }
        Self::with_pages(page_size, size / page_size, need_sort)
    }

    /// [`PagedAllocator::new`] for a `size` that must be a whole number of pages: otherwise
    /// [`AllocError::UnalignedPoolSize`] names the nearest size that is (rounded down, or one
    /// page when that is 0).
    ///
    /// ```
    /// use kvown_runtime::alloc::{AllocError, PagedAllocator};
    ///
    /// let refused = PagedAllocator::new_exact(100, 16, false).unwrap_err();
    /// assert_eq!(
    ///     refused,
    ///     AllocError::UnalignedPoolSize { size: 100, page_size: 16, nearest: 96 }
    /// );
    /// assert!(PagedAllocator::new_exact(96, 16, false).is_ok());
    /// ```
    pub fn new_exact(size: usize, page_size: usize, need_sort: bool) -> Result<Self, AllocError> {
        if page_size != 0 && !size.is_multiple_of(page_size) {
            let whole = size - size % page_size;
            return Err(AllocError::UnalignedPoolSize {
                size,
                page_size,
                nearest: if whole == 0 { page_size } else { whole },
            });
        }
        Self::new(size, page_size, need_sort)
    }
}
