//! Slot and page arithmetic for one page size, with a shift fast path for powers of two.

use super::{KvSlot, PageId};

/// The page size of one allocator and the arithmetic that maps slots and positions to pages:
/// shifts and masks when the page size is a power of two, division otherwise. Public so that a
/// device backend planning the same allocations uses the same arithmetic.
///
/// # Examples
///
/// ```
/// use kvown_runtime::alloc::PageGeometry;
///
/// for page_size in [4, 6] { // a power of two (shifts) and not (division): the same answers
///     let geometry = PageGeometry::new(page_size);
///     assert_eq!(geometry.page_size(), page_size);
///     assert_eq!(geometry.page_of(geometry.first_slot(3) + 1), 3);
///     assert_eq!(geometry.offset(page_size + 1), 1);
///     assert_eq!(geometry.whole_pages(2 * page_size + 1), 2);
///     assert_eq!(geometry.pages_for(2 * page_size + 1), 3);
/// }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageGeometry {
    page_size: usize,
    shift: u32,
    power_of_two: bool,
}

impl PageGeometry {
    /// Geometry for `page_size` slots per page.
    ///
    /// # Panics
    /// When `page_size` is 0 (allocators refuse it first, with [`super::AllocError::ZeroPageSize`]).
    #[inline]
    pub fn new(page_size: usize) -> Self {
        assert!(page_size >= 1, "page size must be at least 1");
        Self {
            page_size,
            shift: page_size.trailing_zeros(),
            power_of_two: page_size.is_power_of_two(),
        }
    }

    /// Slots per page.
    #[inline]
    pub fn page_size(self) -> usize {
        self.page_size
    }

    /// Whether the page size is a power of two (its arithmetic is shifts and masks).
    #[inline]
    pub(crate) fn is_power_of_two(self) -> bool {
        self.power_of_two
    }

    /// The page that holds `slot`.
    #[inline]
    pub fn page_of(self, slot: KvSlot) -> usize {
        if self.power_of_two {
            (slot >> self.shift) as usize
        } else {
            slot as usize / self.page_size
        }
    }

    /// `n % page_size`: the offset of position or slot `n` inside its page.
    #[inline]
    pub fn offset(self, n: usize) -> usize {
        if self.power_of_two {
            n & (self.page_size - 1)
        } else {
            n % self.page_size
        }
    }

    /// `floor(n / page_size)`: the whole pages in `n` tokens.
    #[inline]
    pub fn whole_pages(self, n: usize) -> usize {
        if self.power_of_two {
            n >> self.shift
        } else {
            n / self.page_size
        }
    }

    /// Whether `n` (a position, length or slot) is a multiple of the page size.
    ///
    /// ```
    /// use kvown_runtime::alloc::PageGeometry;
    ///
    /// let geometry = PageGeometry::new(4);
    /// assert!(geometry.is_aligned(0) && geometry.is_aligned(8));
    /// assert!(!geometry.is_aligned(6));
    /// ```
    #[inline]
    pub fn is_aligned(self, n: usize) -> bool {
        self.offset(n) == 0
    }

    /// `n` rounded down to a multiple of the page size: the whole pages of `n` tokens, in
    /// tokens.
    ///
    /// ```
    /// use kvown_runtime::alloc::PageGeometry;
    ///
    /// let geometry = PageGeometry::new(6);
    /// assert_eq!(geometry.floor_align(13), 12);
    /// assert_eq!(geometry.floor_align(5), 0);
    /// ```
    #[inline]
    pub fn floor_align(self, n: usize) -> usize {
        n - self.offset(n)
    }

    /// `ceil(n / page_size)`: the pages that back `n` tokens, without overflow.
    #[inline]
    pub fn pages_for(self, n: usize) -> usize {
        self.whole_pages(n) + usize::from(self.offset(n) != 0)
    }

    /// The first slot of `page`. Callers only pass pages whose slots fit in `u32`.
    #[inline]
    pub fn first_slot(self, page: PageId) -> KvSlot {
        page * self.page_size as KvSlot
    }
}

/// Page arithmetic with the kind of page size fixed at compile time, for the hot loops: code
/// generic over it is compiled once with shifts and masks ([`PowerOfTwo`]) and once with
/// division ([`AnySize`]), so no iteration tests which one applies.
pub(crate) trait PageMath: Copy {
    /// The page that holds `slot`.
    fn page_of(self, slot: KvSlot) -> usize;
    /// `n % page_size`.
    fn offset(self, n: usize) -> usize;
    /// The first slot of `page`.
    fn first_slot(self, page: PageId) -> KvSlot;
}

/// [`PageMath`] for a power-of-two page size.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PowerOfTwo {
    shift: u32,
}

/// [`PageMath`] for any page size.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AnySize {
    page_size: usize,
}

/// The [`PageMath`] that fits one geometry.
pub(crate) enum Specialised {
    /// The page size is a power of two.
    PowerOfTwo(PowerOfTwo),
    /// Any other page size.
    AnySize(AnySize),
}

impl PageGeometry {
    /// The specialised arithmetic for this page size.
    #[inline]
    pub(crate) fn specialised(self) -> Specialised {
        if self.power_of_two {
            Specialised::PowerOfTwo(PowerOfTwo { shift: self.shift })
        } else {
            Specialised::AnySize(AnySize {
                page_size: self.page_size,
            })
        }
    }
}

impl PageMath for PowerOfTwo {
    #[inline(always)]
    fn page_of(self, slot: KvSlot) -> usize {
        (slot >> self.shift) as usize
    }

    #[inline(always)]
    fn offset(self, n: usize) -> usize {
        n & ((1 << self.shift) - 1)
    }

    #[inline(always)]
    fn first_slot(self, page: PageId) -> KvSlot {
        page << self.shift
    }
}

impl PageMath for AnySize {
    #[inline(always)]
    fn page_of(self, slot: KvSlot) -> usize {
        slot as usize / self.page_size
    }

    #[inline(always)]
    fn offset(self, n: usize) -> usize {
        n % self.page_size
    }

    #[inline(always)]
    fn first_slot(self, page: PageId) -> KvSlot {
        page * self.page_size as KvSlot
    }
}
