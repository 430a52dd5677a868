//! Allocators that go wrong on demand, as one whose bookkeeping disagrees with the batch flow's
//! (or a backend that reports a device failure) would: a free refused, a free reported done but
//! lost, a page freed behind the cache's back, or an extend allocation refused although the
//! pool had room. The error paths, and the broken states, that a correct host allocator never
//! reaches. It also keeps the pages of every `free_page_ids` call that reached the allocator,
//! for tests that check which pages went back, in which order. An [`AllocatorLayer`]: it
//! changes the extend and the page free (every slot-level free is one), and everything else
//! passes through.

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use kvown_runtime::alloc::{
    AllocError, AllocatorLayer, ExtendShape, FreeOrder, KvAllocator, KvSlot, PageId,
};
use kvown_runtime::error::OutOfMemory;

/// The faults of a [`Faulty`], shared with the test that arms them. By default every free
/// passes and nothing else is freed.
#[derive(Debug, Clone, Default)]
pub struct Faults {
    /// How many more frees pass: `None` all of them, `Some(n)` `n` more, then every one is
    /// refused.
    frees_left: Rc<Cell<Option<usize>>>,
    /// A page the next free that passes also frees.
    smuggled: Rc<Cell<Option<PageId>>>,
    /// Whether the next free is lost: reported done, nothing freed.
    lose_next: Rc<Cell<bool>>,
    /// What goes wrong with the next extend allocation, if anything.
    next_extend: Rc<Cell<Option<ExtendFault>>>,
    /// The pages of each `free_page_ids` call passed on, in order, since the last take.
    freed_pages: Rc<RefCell<Vec<Vec<PageId>>>>,
}

/// How an extend allocation goes wrong (armed with [`Faults::fault_next_extend`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExtendFault {
    /// Refused with [`AllocError::OutOfMemory`], changing nothing, as a device out of memory
    /// would after the host's count said it fits.
    Refuse,
    /// The pages are taken, but the first page's slots are reported for the second page too,
    /// as a backend that mixes up its page table would: one page named twice, one nowhere.
    Alias,
    /// The pages are taken, but the first page's slots are reported past the end of the pool,
    /// as a backend with a corrupt page table would.
    Stray,
}

impl Faults {
    /// Sets how many more frees pass (`None`: all of them).
    pub fn set_frees_left(&self, frees_left: Option<usize>) {
        self.frees_left.set(frees_left);
    }

    /// Makes the next free that passes free `page` too, as a second owner of the allocator (or
    /// a bug in it) would: the page goes back to the free list while its holder still holds it.
    pub fn smuggle(&self, page: PageId) {
        self.smuggled.set(Some(page));
    }

    /// Makes the next free report success and free nothing, as a backend that drops a free
    /// would: its pages stay held by no one.
    pub fn lose_next_free(&self) {
        self.lose_next.set(true);
    }

    /// Makes the next extend allocation go wrong as `fault` says.
    pub fn fault_next_extend(&self, fault: ExtendFault) {
        self.next_extend.set(Some(fault));
    }

    /// Takes the pages of the `free_page_ids` calls passed on to the allocator since the last
    /// take: one entry per call, its pages in the order given.
    pub fn take_freed_pages(&self) -> Vec<Vec<PageId>> {
        self.freed_pages.take()
    }

    /// Runs `free` while the budget lasts, spending one free when it succeeds; otherwise
    /// refuses with [`AllocError::NotAllocated`] naming `first` (the first slot of the call's
    /// first page), changing nothing.
    fn spend(
        &self,
        first: Option<KvSlot>,
        page_size: usize,
        free: impl FnOnce() -> Result<(), AllocError>,
    ) -> Result<(), AllocError> {
        match self.frees_left.get() {
            Some(0) => {
                let slot = first.unwrap_or(0);
                Err(AllocError::NotAllocated {
                    slot,
                    page: slot / page_size as KvSlot,
                })
            }
            left => {
                free()?;
                self.frees_left.set(left.map(|n| n - 1));
                Ok(())
            }
        }
    }
}

/// `inner` as it is, except that frees and extend allocations go through `faults`.
#[derive(Debug)]
pub struct Faulty<A> {
    pub inner: A,
    pub faults: Faults,
}

impl<A: KvAllocator> AllocatorLayer for Faulty<A> {
    type Inner = A;

    fn inner(&self) -> &A {
        &self.inner
    }

    fn inner_mut(&mut self) -> &mut A {
        &mut self.inner
    }

    /// The extend under the armed [`ExtendFault`], if any (disarmed by this call).
    fn alloc_extend(
        &mut self,
        reqs: &[ExtendShape],
        out: &mut Vec<KvSlot>,
    ) -> Result<(), AllocError> {
        let fault = self.faults.next_extend.take();
        if fault == Some(ExtendFault::Refuse) {
            return Err(AllocError::OutOfMemory(OutOfMemory {
                requested: reqs.iter().map(|req| req.seq_len - req.prefix_len).sum(),
                available: self.inner.available_size(),
                evictable: 0,
            }));
        }
        let start = out.len();
        self.inner.alloc_extend(reqs, out)?;
        let page_size = self.inner.page_size();
        match fault {
            Some(ExtendFault::Alias) if out.len() >= start + 2 * page_size => {
                out.copy_within(start..start + page_size, start + page_size);
            }
            Some(ExtendFault::Stray) => {
                let past_the_pool = (self.inner.capacity() + 2 * page_size) as KvSlot;
                for slot in out[start..].iter_mut().take(page_size) {
                    *slot += past_the_pool;
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// The free while the budget lasts ([`Faults::spend`]), with the smuggled page, if any,
    /// freed after it; a lost free returns `Ok` at once. Records the pages freed.
    fn free_page_ids(&mut self, pages: &[PageId], order: FreeOrder<'_>) -> Result<(), AllocError> {
        if self.faults.lose_next.take() {
            return Ok(());
        }
        let page_size = self.inner.page_size();
        let first = pages.first().map(|&page| page * page_size as KvSlot);
        let inner = &mut self.inner;
        self.faults
            .spend(first, page_size, || inner.free_page_ids(pages, order))?;
        self.faults.freed_pages.borrow_mut().push(pages.to_vec());
        if let Some(page) = self.faults.smuggled.take() {
            self.inner
                .free_page_ids(&[page], FreeOrder::Given)
                .expect("the smuggled page is held");
        }
        Ok(())
    }
}
