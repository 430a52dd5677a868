//! The refusals and findings that several layers share, defined once: the error enums of the
//! allocators, the K/V pools, the prefix cache, the batch flow and the checker wrap these
//! rather than repeat them. A leaf: it imports nothing of the crate but the ids.

use crate::ids::PageId;

/// A page id outside the pages there are: ids `0..pages`, page 0 the padding page.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("page {page} is outside the pages 0..{pages} (page 0 is the padding page)")]
pub struct PageOutOfRange {
    /// The page named.
    pub page: PageId,
    /// One past the last page id (the padding page 0 counted).
    pub pages: usize,
}

/// Not enough free KV slots for a call. Every number is in slots (whole pages × page size).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "out of KV memory: requested {requested} slots, {available} free and {evictable} evictable \
     from the prefix cache; free {} more (evict, retract requests or lower the batch size) or \
     enlarge the pool",
    requested.saturating_sub(available.saturating_add(*evictable))
)]
pub struct OutOfMemory {
    /// Slots the call needs in new pages.
    pub requested: usize,
    /// Slots free now (deferred frees excluded).
    pub available: usize,
    /// Slots the prefix cache could free by eviction, as far as the refusing layer knows: 0
    /// from an allocator, which holds no prefix cache (its caller adds its own and evicts the
    /// difference).
    pub evictable: usize,
}

/// An allocator and a prefix cache used together with different page sizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "page sizes differ: allocator {allocator}, prefix cache {cache}; build both with one page \
     size"
)]
pub struct PageSizeMismatch {
    /// The allocator's page size.
    pub allocator: usize,
    /// The prefix cache's page size.
    pub cache: usize,
}
