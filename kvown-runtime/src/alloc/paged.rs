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
    /// Fails with [`AllocError::ZeroPageSize`] or [`AllocError::TooManySlots`].
    pub fn new(size: usize, page_size: usize, need_sort: bool) -> Result<Self, AllocError> {
        if page_size == 0 {
            return Err(AllocError::ZeroPageSize);
        }
        Self::with_pages(page_size, size / page_size, need_sort)
    }
}
