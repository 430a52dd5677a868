//! [`AllocatorLayer`]: an allocator that wraps another and changes only some of its calls.

use super::{
    AllocError, AsPageAllocator, DecodeRequests, ExtendShape, FreeOrder, GroupStep, KvAllocator,
    KvSlot, PageAllocator, PageId,
};

/// An allocator built on another one, [`AllocatorLayer::Inner`], that changes some of its
/// calls: a fault injector, a counter, a backend that checks a device's answer. Implement
/// `inner` / `inner_mut` and only the calls the layer changes; every other call passes
/// through, the layer is a [`KvAllocator`] (the sizes and free groups are the inner
/// allocator's) and, over a [`PageAllocator`], the invariant checker reads that one
/// ([`AsPageAllocator`]).
///
/// ```
/// use kvown_runtime::alloc::{AllocError, AllocatorLayer, FreeOrder, PageId, PagedAllocator};
/// use kvown_runtime::alloc::{DecodeShape, ExtendShape, KvAllocator, SlotCalls};
///
/// /// Counts the pages freed, every free passing on.
/// struct Counted(PagedAllocator, usize);
///
/// impl AllocatorLayer for Counted {
///     type Inner = PagedAllocator;
///     fn inner(&self) -> &PagedAllocator { &self.0 }
///     fn inner_mut(&mut self) -> &mut PagedAllocator { &mut self.0 }
///     fn free_page_ids(&mut self, pages: &[PageId], order: FreeOrder<'_>) -> Result<(), AllocError> {
///         self.0.free_page_ids(pages, order)?;
///         self.1 += pages.len();
///         Ok(())
///     }
/// }
///
/// let mut counted = Counted(PagedAllocator::new(16, 4, false)?, 0);
/// let mut slots = Vec::new();
/// counted.alloc(8, &mut slots)?;
/// counted.free(&slots)?; // a slot-level free, through the layer's page free
/// assert_eq!((counted.1, counted.available_size()), (2, 16));
/// // The calls the layer does not change reach the inner allocator.
/// let mut pages = Vec::new();
/// KvAllocator::alloc_page_ids(&mut counted, 1, &mut pages)?;
/// assert!(counted.inner().is_page_allocated(pages[0]));
/// let mut slots = Vec::new();
/// let prompt = ExtendShape { prefix_len: 0, seq_len: 3, last_loc: None };
/// KvAllocator::alloc_extend(&mut counted, &[prompt], &mut slots)?;
/// let step = DecodeShape { seq_len: 4, last_loc: slots[2] };
/// KvAllocator::alloc_decode(&mut counted, &[step], &mut slots)?;
/// assert_eq!(counted.available_size(), 16 - 2 * 4);
/// # Ok::<(), AllocError>(())
/// ```
pub trait AllocatorLayer {
    /// The allocator underneath.
    type Inner: KvAllocator;

    /// The allocator underneath.
    fn inner(&self) -> &Self::Inner;

    /// The allocator underneath, for the calls that pass through.
    fn inner_mut(&mut self) -> &mut Self::Inner;

    /// [`KvAllocator::alloc_extend`]; passes through unless changed.
    fn alloc_extend(
        &mut self,
        reqs: &[ExtendShape],
        out: &mut Vec<KvSlot>,
    ) -> Result<(), AllocError> {
        self.inner_mut().alloc_extend(reqs, out)
    }

    /// [`KvAllocator::alloc_decode`]; passes through unless changed.
    fn alloc_decode<D: DecodeRequests>(
        &mut self,
        reqs: D,
        out: &mut Vec<KvSlot>,
    ) -> Result<(), AllocError> {
        self.inner_mut().alloc_decode(reqs, out)
    }

    /// [`KvAllocator::alloc_page_ids`]; passes through unless changed.
    fn alloc_page_ids(
        &mut self,
        num_pages: usize,
        out: &mut Vec<PageId>,
    ) -> Result<(), AllocError> {
        self.inner_mut().alloc_page_ids(num_pages, out)
    }

    /// [`KvAllocator::free_page_ids`], and through it every slot-level free; passes through
    /// unless changed.
    fn free_page_ids(&mut self, pages: &[PageId], order: FreeOrder<'_>) -> Result<(), AllocError> {
        self.inner_mut().free_page_ids(pages, order)
    }
}

impl<L: AllocatorLayer> KvAllocator for L {
    fn page_size(&self) -> usize {
        self.inner().page_size()
    }

    fn capacity(&self) -> usize {
        self.inner().capacity()
    }

    fn available_size(&self) -> usize {
        self.inner().available_size()
    }

    #[inline]
    fn alloc_extend(
        &mut self,
        reqs: &[ExtendShape],
        out: &mut Vec<KvSlot>,
    ) -> Result<(), AllocError> {
        AllocatorLayer::alloc_extend(self, reqs, out)
    }

    #[inline]
    fn alloc_decode<D: DecodeRequests>(
        &mut self,
        reqs: D,
        out: &mut Vec<KvSlot>,
    ) -> Result<(), AllocError> {
        AllocatorLayer::alloc_decode(self, reqs, out)
    }

    #[inline]
    fn alloc_page_ids(
        &mut self,
        num_pages: usize,
        out: &mut Vec<PageId>,
    ) -> Result<(), AllocError> {
        AllocatorLayer::alloc_page_ids(self, num_pages, out)
    }

    #[inline]
    fn free_page_ids(&mut self, pages: &[PageId], order: FreeOrder<'_>) -> Result<(), AllocError> {
        AllocatorLayer::free_page_ids(self, pages, order)
    }

    fn free_group_step(&mut self, step: GroupStep) -> Result<(), AllocError> {
        self.inner_mut().free_group_step(step)
    }
}

/// A layer over a host allocator is checked against the host allocator.
impl<L: AllocatorLayer> AsPageAllocator for L
where
    L::Inner: AsPageAllocator,
{
    type Order = <L::Inner as AsPageAllocator>::Order;

    fn page_allocator(&self) -> &PageAllocator<Self::Order> {
        self.inner().page_allocator()
    }
}
