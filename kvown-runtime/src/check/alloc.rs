//! The allocator's own invariants, on its own: page 0 reserved, every other page in exactly one
//! of the free, release and deferred lists or held, each list's pages in the state it says,
//! and the fill marks of held pages in range ([`InvariantViolation`] names the first that
//! fails). The check itself is [`PageAllocator::check`](crate::alloc::PageAllocator::check),
//! beside the fields it reads; this is where the checkers reach it.

use crate::alloc::{AsPageAllocator, InvariantViolation};

/// Checks the invariants of the page allocator under `allocator` (a [`PagedAllocator`],
/// [`TokenAllocator`] or a wrapper that exposes one). O(pages): for tests and debug runs.
///
/// ```
/// use kvown_runtime::alloc::{PagedAllocator, SlotCalls};
/// use kvown_runtime::check::check_allocator;
///
/// let mut allocator = PagedAllocator::new(64, 4, false)?;
/// let mut slots = Vec::new();
/// allocator.alloc(8, &mut slots)?;
/// check_allocator(&allocator)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// [`PagedAllocator`]: crate::alloc::PagedAllocator
/// [`TokenAllocator`]: crate::alloc::TokenAllocator
pub fn check_allocator<A: AsPageAllocator + ?Sized>(
    allocator: &A,
) -> Result<(), InvariantViolation> {
    allocator.page_allocator().check()
}
