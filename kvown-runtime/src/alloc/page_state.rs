//! The one-byte state every page carries, used to reject double and foreign frees.

/// Where a page is in its life cycle. One byte per page.
///
/// # Examples
///
/// ```
/// use kvown_runtime::alloc::PageState;
///
/// assert!(PageState::Free.is_available() && PageState::Released.is_available());
/// assert!(!PageState::Held.is_available() && !PageState::Deferred.is_available());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum PageState {
    /// Page 0, the padding page; never allocated, never freed.
    Reserved,
    /// In the free list and not handed out since the allocator was created or cleared.
    Unused,
    /// Handed out by an allocation and not freed since.
    Held,
    /// Transient: named by the free call in progress, or the partially filled last page of a
    /// request of the batched allocation in progress (`alloc_extend`, `alloc_decode`), so that
    /// a second request of the batch naming it is refused.
    /// [`check`](super::PageAllocator::check) reports it as a violation, because no call leaves
    /// a page in this state.
    Pending,
    /// Freed inside a free group; becomes free when the group commits.
    Deferred,
    /// Freed and back in the free list.
    Free,
    /// Freed in `need_sort` mode and waiting in the release list for the next merge.
    Released,
}

// One byte per page, as `PageAllocator::bookkeeping_bytes` counts it.
const _: () = assert!(std::mem::size_of::<PageState>() == 1);

impl PageState {
    /// Whether the page counts towards `available_size` (free list or release list).
    #[inline]
    pub fn is_available(self) -> bool {
        matches!(self, Self::Unused | Self::Free | Self::Released)
    }
}
