//! Setup shared by the radix prefix-cache suites: allocators, fresh slots, keys and the slots
//! of a cached path.

use kvown_runtime::alloc::{KvSlot, PagedAllocator, SlotCalls};
use kvown_runtime::radix::{RadixCache, TreePos};

/// A paged allocator of `pages` pages of `page_size` slots.
pub fn allocator(page_size: usize, pages: usize) -> PagedAllocator {
    PagedAllocator::new(pages * page_size, page_size, false).unwrap()
}

/// `tokens` freshly allocated slots (whole pages).
pub fn alloc_slots(alloc: &mut PagedAllocator, tokens: usize) -> Vec<KvSlot> {
    let mut out = Vec::new();
    alloc.alloc(tokens, &mut out).unwrap();
    out
}

/// A key of `pages` whole pages whose tokens are `base, base + 1, ...`.
pub fn key(page_size: usize, pages: usize, base: u32) -> Vec<u32> {
    (0..(pages * page_size) as u32).map(|i| base + i).collect()
}

/// The slots of the cached path `[0, at.len)`.
pub fn path_slots(cache: &RadixCache, at: TreePos) -> Vec<KvSlot> {
    let mut out = vec![0; at.len];
    cache.path_slots_into(at, 0, &mut out).unwrap();
    out
}
