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
    "out of KV memory: requested {requested} slots, {}",
    match evictable {
        Some(evictable) => format!(
            "{available} free and {evictable} evictable from the prefix cache; lower the batch \
             size, retract requests or enlarge the pool"
        ),
        None => format!(
            "{available} available; evict at least {} slots from the prefix cache or lower the \
             batch size",
            requested.saturating_sub(*available)
        ),
    }
)]
pub struct OutOfMemory {
    /// Slots the call needs in new pages.
    pub requested: usize,
    /// Slots free now (deferred frees excluded).
    pub available: usize,
    /// Slots the prefix cache could free by eviction, where the refusing layer knows one
    /// (`None` from an allocator, which knows no prefix cache: the caller adds its own).
    pub evictable: Option<usize>,
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
