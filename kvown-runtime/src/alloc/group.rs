//! Free groups: a guard that defers frees until it commits (sglang `free_group_begin` /
//! `free_group_end`).

use std::ops::{Deref, DerefMut};

use super::{AllocError, KvAllocator};

/// One step of a free group, passed to [`KvAllocator::free_group_step`]: open or commit. Only
/// this crate builds one (in [`FreeGroup`] and `KvCache::free_group`), so a group is always
/// committed by the guard that opened it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupStep {
    open: bool,
}

impl GroupStep {
    /// Opens a group.
    pub(crate) const OPEN: GroupStep = GroupStep { open: true };
    /// Commits the open group.
    pub(crate) const COMMIT: GroupStep = GroupStep { open: false };

    /// Whether the step opens the group (`false`: it commits it).
    pub fn opens(self) -> bool {
        self.open
    }
}

/// What a [`FreeGroup`] defers the frees of: an allocator, or a
/// [`KvCache`](crate::cache::KvCache) (whose batch flow the guard then hands out). Sealed.
pub trait Deferring {
    /// Commits the group the guard opened.
    #[doc(hidden)]
    fn commit_group(&mut self);
}

impl<A: KvAllocator + ?Sized> Deferring for A {
    fn commit_group(&mut self) {
        let committed = self.free_group_step(GroupStep::COMMIT);
        debug_assert!(
            committed.is_ok(),
            "the guard's group is open: {committed:?}"
        );
    }
}

/// An open free group ([`KvAllocator::free_group`], `KvCache::free_group`): everything freed
/// through it (it dereferences to the allocator or the cache) stays deferred, and its pages
/// unavailable, until it commits, with [`FreeGroup::commit`] or when dropped; then the deferred
/// pages go back to the free list as one update (with LIFO reuse: the pages of ordered frees in
/// call order, then those of plain `free`s, sorted). Opening a second group through it fails
/// with a typed error that keeps this one.
///
/// ```
/// use kvown_runtime::alloc::{AllocError, KvAllocator, PagedAllocator, SlotCalls};
///
/// let mut allocator = PagedAllocator::new(16, 4, false)?;
/// let mut slots = Vec::new();
/// allocator.alloc(8, &mut slots)?;
/// {
///     let mut group = allocator.free_group()?;
///     group.free_segment(&slots, 0)?;
///     assert!(matches!(group.free_group(), Err(AllocError::NestedFreeGroup { .. })));
///     assert_eq!(group.available_size(), 2 * 4);
/// } // dropped: committed
/// assert_eq!(allocator.available_size(), 4 * 4);
/// slots.clear();
/// allocator.alloc(4, &mut slots)?;
/// let mut group = allocator.free_group()?;
/// group.free(&slots)?;
/// group.commit(); // or explicitly
/// assert_eq!(allocator.available_size(), 4 * 4);
/// # Ok::<(), AllocError>(())
/// ```
#[derive(Debug)]
pub struct FreeGroup<'a, T: Deferring + ?Sized> {
    target: &'a mut T,
}

impl<'a, A: KvAllocator + ?Sized> FreeGroup<'a, A> {
    /// Opens a group on `allocator` ([`KvAllocator::free_group`]).
    pub(crate) fn open(allocator: &'a mut A) -> Result<Self, AllocError> {
        allocator.free_group_step(GroupStep::OPEN)?;
        Ok(FreeGroup { target: allocator })
    }
}

impl<'a, T: Deferring + ?Sized> FreeGroup<'a, T> {
    /// The guard of a group `target` has just opened.
    pub(crate) fn opened(target: &'a mut T) -> Self {
        FreeGroup { target }
    }

    /// Commits the group: the deferred frees apply now (as when the guard is dropped).
    pub fn commit(self) {}
}

impl<T: Deferring + ?Sized> Drop for FreeGroup<'_, T> {
    fn drop(&mut self) {
        self.target.commit_group();
    }
}

impl<T: Deferring + ?Sized> Deref for FreeGroup<'_, T> {
    type Target = T;

    fn deref(&self) -> &T {
        self.target
    }
}

impl<T: Deferring + ?Sized> DerefMut for FreeGroup<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        self.target
    }
}
