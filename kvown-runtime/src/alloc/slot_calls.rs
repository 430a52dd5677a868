//! [`SlotCalls`]: the slot-level calls of every allocator, built on its page calls.

use super::geometry::PageGeometry;
use super::rules::{push_slot_run, push_slot_runs};
use super::{AllocError, DecodeRow, FreeOrder, KvAllocator, KvSlot, PageId};
use crate::shared_error::PageOutOfRange;
use crate::slots::ReqToTokenPool;

/// The slot-level calls, for every [`KvAllocator`] (a blanket implementation): whole pages as
/// slots (`alloc`), frees of the pages that hold some slots (`free`, `free_segment(s)`), and a
/// decode by rows of the request-to-token table. Each is one page call of the allocator, so it
/// is all or nothing as that call is, and a layer that changes the page calls
/// ([`AllocatorLayer`](super::AllocatorLayer)) changes these too.
///
/// ```
/// use kvown_runtime::alloc::{AllocError, KvAllocator, PagedAllocator, SlotCalls};
///
/// let mut allocator = PagedAllocator::new(32, 4, false)?;
/// let mut row = Vec::new();
/// allocator.alloc(12, &mut row)?; // pages 1, 2, 3: slots 4..16
/// assert_eq!(row[..5], [4, 5, 6, 7, 8]);
/// // Positions 4..12 of the row: pages 2 and 3, back at the head in row order.
/// allocator.free_segment(&row[4..], 4)?;
/// assert_eq!(allocator.free_pages().take(2).collect::<Vec<_>>(), [2, 3]);
/// // A slot of a page freed already: a typed error naming it, nothing changed.
/// assert!(matches!(allocator.free(&[5, 9]), Err(AllocError::DoubleFree { slot: 9, page: 2, .. })));
/// assert!(allocator.is_page_allocated(1));
/// # Ok::<(), AllocError>(())
/// ```
pub trait SlotCalls: KvAllocator {
    /// Allocates `num_tokens` slots (a multiple of the page size) as whole pages, in free-list
    /// order ([`KvAllocator::alloc_page_ids`], each page's slots appended in order). On error
    /// (unaligned, out of memory) nothing is taken and `out` is untouched.
    fn alloc(&mut self, num_tokens: usize, out: &mut Vec<KvSlot>) -> Result<(), AllocError>;

    /// Frees the pages that contain `slots`, each once, in a plain free's order
    /// ([`FreeOrder::Unordered`]; sglang `free`). The errors name the first slot of the page at
    /// fault.
    fn free(&mut self, slots: &[KvSlot]) -> Result<(), AllocError>;

    /// Frees `row[start_pos .. start_pos + slots.len()]` of one request, page by page in row
    /// order ([`FreeOrder::Given`]): one slot names each page (the first, then every slot at a
    /// page boundary of the row), and every other slot must lie in its page
    /// ([`AllocError::SegmentNotPaged`]).
    fn free_segment(&mut self, slots: &[KvSlot], start_pos: usize) -> Result<(), AllocError>;

    /// Frees several segments of one request's row in one call (sglang `free_segments`):
    /// segments that meet inside a page free that page once (with the earlier segment). All or
    /// nothing. The free list ends as consecutive [`SlotCalls::free_segment`] calls leave it:
    /// with LIFO reuse outside a free group, the last segment's pages first
    /// ([`FreeOrder::Segments`]).
    ///
    /// # Examples
    ///
    /// ```
    /// # use kvown_runtime::alloc::{KvAllocator, PagedAllocator, SlotCalls};
    /// let mut allocator = PagedAllocator::new(32, 4, false)?;
    /// let mut row = Vec::new();
    /// allocator.alloc(12, &mut row)?; // pages 1, 2, 3
    /// // Positions 2..6 and 8..12: pages 1 and 2 (from position 2), then page 3.
    /// allocator.free_segments(&[(&row[2..6], 2), (&row[8..], 8)])?;
    /// let head: Vec<_> = allocator.free_pages().take(3).collect();
    /// assert_eq!(head, [3, 1, 2], "the last segment's pages first");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    fn free_segments(&mut self, segments: &[(&[KvSlot], usize)]) -> Result<(), AllocError>;

    /// [`KvAllocator::alloc_decode`] for requests given by their rows, writing the
    /// request-to-token table too: request `i` of `reqs` gets its new slot at position `len` of
    /// its row, and `out[i]` is that slot. Its shape comes from the table (the last stored
    /// token's slot at `len - 1`); each row may appear once ([`DecodeRow::read_shapes`] names
    /// the errors). All or nothing: on error neither `table` nor `out` changed.
    ///
    /// # Examples
    ///
    /// ```
    /// # use kvown_runtime::alloc::{DecodeRow, PagedAllocator, SlotCalls};
    /// # use kvown_runtime::slots::ReqToTokenPool;
    /// let mut allocator = PagedAllocator::new(32, 4, false)?;
    /// let mut table = ReqToTokenPool::new(4, 16)?;
    /// let row = table.alloc(1)?[0];
    /// let mut slots = Vec::new();
    /// allocator.alloc(4, &mut slots)?;
    /// table.write(row, 0, &slots)?; // 4 tokens stored: the next one opens a page
    /// let mut out = Vec::new();
    /// let reqs = [DecodeRow { row, len: 4 }];
    /// allocator.alloc_decode_table(reqs.into_iter(), &mut table, &mut out)?;
    /// assert_eq!(out, [8], "the first slot of page 2");
    /// assert_eq!(table.row(row)?[4], 8);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    fn alloc_decode_table<I>(
        &mut self,
        reqs: I,
        table: &mut ReqToTokenPool,
        out: &mut Vec<KvSlot>,
    ) -> Result<(), AllocError>
    where
        Self: Sized,
        I: ExactSizeIterator<Item = DecodeRow> + Clone;
}

impl<A: KvAllocator + ?Sized> SlotCalls for A {
    #[inline(always)]
    fn alloc(&mut self, num_tokens: usize, out: &mut Vec<KvSlot>) -> Result<(), AllocError> {
        let page_size = self.page_size();
        if !num_tokens.is_multiple_of(page_size) {
            return Err(AllocError::UnalignedAlloc {
                num_tokens,
                page_size,
            });
        }
        let pages = num_tokens / page_size;
        let start = out.len();
        // Page ids are slots' type: they go to `out` first.
        self.alloc_page_ids(pages, out)?;
        if page_size == 1 {
            return Ok(());
        }
        if pages == 1 {
            let page = out[start];
            out.truncate(start);
            push_slot_run(out, page * page_size as KvSlot, page_size);
            return Ok(());
        }
        runs_for_ids(out, start, page_size);
        Ok(())
    }

    #[inline]
    fn free(&mut self, slots: &[KvSlot]) -> Result<(), AllocError> {
        let Some(&last) = slots.last() else {
            return self.free_page_ids(&[], FreeOrder::Unordered);
        };
        let geometry = PageGeometry::new(self.page_size());
        // The page of the last slot: the range test then needs no load of it and starts at
        // `slots[0]`, so its vector loads line up with the stores that wrote the slots (a
        // freshly allocated page is usually freed from the start of its run).
        let page = geometry.page_of(last);
        if slots.len() <= geometry.page_size() && run_in_page(geometry, slots, page) {
            return self
                .free_page_ids(&[page as PageId], FreeOrder::Unordered)
                .map_err(|error| name_slot(self, error, slots.iter().copied()));
        }
        let mut pages = Vec::with_capacity(slots.len().div_ceil(geometry.page_size()) + 1);
        let mut rest = slots;
        while let Some(&first) = rest.first() {
            let page = geometry.page_of(first);
            pages.push(page as PageId);
            // A run of up to a page of slots in the same page is skipped after one
            // vectorisable check, starting at `first` so that its loads line up with the
            // stores that wrote the slots.
            let run = &rest[..rest.len().min(geometry.page_size())];
            let same = if all_in_page(geometry, run, page) {
                run.len()
            } else {
                1 + run[1..]
                    .iter()
                    .take_while(|&&slot| geometry.page_of(slot) == page)
                    .count()
            };
            rest = &rest[same..];
        }
        self.free_page_ids(&pages, FreeOrder::Unordered)
            .map_err(|error| name_slot(self, error, slots.iter().copied()))
    }

    fn free_segment(&mut self, slots: &[KvSlot], start_pos: usize) -> Result<(), AllocError> {
        self.free_segments(&[(slots, start_pos)])
    }

    fn free_segments(&mut self, segments: &[(&[KvSlot], usize)]) -> Result<(), AllocError> {
        let geometry = PageGeometry::new(self.page_size());
        // Each segment spans at most one page more than its whole pages.
        let most: usize = segments
            .iter()
            .map(|(slots, _)| geometry.whole_pages(slots.len()) + 2)
            .sum();
        let mut pages = Vec::with_capacity(most);
        let mut ends = Vec::with_capacity(segments.len());
        for &(slots, start_pos) in segments {
            if let Err(misplaced) = segment_pages(geometry, slots, start_pos, &mut pages) {
                return Err(refuse_segments(self, segments, pages, misplaced));
            }
            ends.push(pages.len());
        }
        let order = match segments.len() {
            1 => FreeOrder::Given,
            _ => FreeOrder::Segments(&ends),
        };
        self.free_page_ids(&pages, order)
            .map_err(|error| name_slot(self, error, segment_heads(geometry, segments)))
    }

    fn alloc_decode_table<I>(
        &mut self,
        reqs: I,
        table: &mut ReqToTokenPool,
        out: &mut Vec<KvSlot>,
    ) -> Result<(), AllocError>
    where
        Self: Sized,
        I: ExactSizeIterator<Item = DecodeRow> + Clone,
    {
        let shapes = DecodeRow::read_shapes(reqs.clone(), table)?;
        let start = out.len();
        self.alloc_decode(&shapes, out)?;
        for (req, &slot) in reqs.zip(&out[start..]) {
            table.set_held(req.row, req.len, slot);
        }
        Ok(())
    }
}

/// Replaces the page ids `out[start..]` by their slot runs of `page_size` slots. Up to 4 KiB of
/// ids move to the stack and their runs are appended a chunk at a time; more are replaced in
/// place ([`expand_page_ids`]), in an `out` zeroed to its full length first. Not inlined: the
/// one-page `alloc` that inlines into its caller keeps a small frame.
#[inline(never)]
fn runs_for_ids(out: &mut Vec<KvSlot>, start: usize, page_size: usize) {
    const STACKED_IDS: usize = 1024;
    let pages = out.len() - start;
    if pages <= STACKED_IDS {
        let mut ids = [0; STACKED_IDS];
        ids[..pages].copy_from_slice(&out[start..]);
        out.truncate(start);
        push_slot_runs(out, &ids[..pages], page_size);
        return;
    }
    out.resize(start + pages * page_size, 0);
    expand_page_ids(&mut out[start..], page_size);
}

/// Replaces the page ids at the front of `buf` (one per run of `page_size` slots that `buf`
/// holds) by their slot runs, from the last page back, so that no id is overwritten before it
/// is read. Runs of the common page sizes (16, 32, 64) are fixed-length arrays: a few straight
/// vector stores each.
#[inline]
fn expand_page_ids(buf: &mut [KvSlot], page_size: usize) {
    fn fixed<const N: usize>(buf: &mut [KvSlot]) {
        let (runs, _) = buf.as_chunks_mut::<N>();
        for index in (0..runs.len()).rev() {
            let first = runs[index / N][index % N] * N as KvSlot;
            runs[index] = std::array::from_fn(|i| first + i as KvSlot);
        }
    }
    match page_size {
        16 => fixed::<16>(buf),
        32 => fixed::<32>(buf),
        64 => fixed::<64>(buf),
        _ => {
            for index in (0..buf.len() / page_size).rev() {
                let first = buf[index] * page_size as KvSlot;
                let run = &mut buf[index * page_size..][..page_size];
                for (slot, offset) in run.iter_mut().zip(0..) {
                    *slot = first + offset;
                }
            }
        }
    }
}

/// Appends the page of each chunk of one segment, `row[start_pos .. start_pos + slots.len()]`,
/// to `pages`: the page of the chunk's first slot (the segment's first slot, then every slot at
/// a page boundary of the row). `Err` is the segment's first slot outside its chunk's page,
/// after its chunk's page was appended.
fn segment_pages(
    geometry: PageGeometry,
    slots: &[KvSlot],
    start_pos: usize,
    pages: &mut Vec<PageId>,
) -> Result<(), AllocError> {
    let mut chunk_start = 0;
    let mut chunk_len = geometry.page_size() - geometry.offset(start_pos);
    // The whole pages of the common sizes (16, 32, 64) at a length known at compile time: one
    // straight-line check each.
    if chunk_len == geometry.page_size() {
        chunk_start = match chunk_len {
            16 => whole_pages::<16>(slots, pages),
            32 => whole_pages::<32>(slots, pages),
            64 => whole_pages::<64>(slots, pages),
            _ => 0,
        };
    }
    while chunk_start < slots.len() {
        let chunk_end = (chunk_start + chunk_len).min(slots.len());
        let page = geometry.page_of(slots[chunk_start]);
        pages.push(page as PageId);
        // The whole chunk, first slot included (trivially in `page`): a whole page of slots
        // vectorises without a remainder.
        if !all_in_page(geometry, &slots[chunk_start..chunk_end], page) {
            return Err(segment_not_paged(
                geometry,
                slots,
                chunk_start..chunk_end,
                page,
            ));
        }
        chunk_start = chunk_end;
        chunk_len = geometry.page_size();
    }
    Ok(())
}

/// The pages of the leading whole pages of `slots` (pages of `N` slots, a power of two), each
/// named by its first slot, appended to `pages` up to the first one with a slot outside it:
/// how many slots they cover. One pass ORs every chunk's differences from its page's first
/// slot into one array of `N` lanes, which stay in vector registers, and tests them once; then
/// the pages are read as one slice. Only when some chunk fails is the first one looked for.
/// (Folding each chunk to one number on the way made a chain through every chunk: W2's release
/// phase took 30-40% longer.)
#[inline]
fn whole_pages<const N: usize>(slots: &[KvSlot], pages: &mut Vec<PageId>) -> usize {
    let (chunks, _) = slots.as_chunks::<N>();
    let outside = |chunk: &[KvSlot; N]| {
        let first = chunk[0] & !(N as KvSlot - 1);
        chunk
            .iter()
            .fold(0, |differ, &slot| differ | (slot ^ first))
    };
    let mut lanes = [0; N];
    for chunk in chunks {
        let first = chunk[0] & !(N as KvSlot - 1);
        for (lane, &slot) in lanes.iter_mut().zip(chunk) {
            *lane |= slot ^ first;
        }
    }
    let whole = if lanes.iter().fold(0, |differ, &lane| differ | lane) < N as KvSlot {
        chunks.len()
    } else {
        chunks
            .iter()
            .position(|chunk| outside(chunk) >= N as KvSlot)
            .unwrap_or(chunks.len())
    };
    pages.extend(chunks[..whole].iter().map(|chunk| chunk[0] / N as KvSlot));
    whole * N
}

/// The slots that name the pages of `segments` (each chunk's first slot), in order.
fn segment_heads<'a>(
    geometry: PageGeometry,
    segments: &'a [(&'a [KvSlot], usize)],
) -> impl Iterator<Item = KvSlot> + 'a {
    segments.iter().flat_map(move |&(slots, start_pos)| {
        let first_chunk = geometry.page_size() - geometry.offset(start_pos);
        let heads = (first_chunk..slots.len()).step_by(geometry.page_size());
        slots
            .first()
            .copied()
            .into_iter()
            .chain(heads.map(|i| slots[i]))
    })
}

/// The error of a segment free whose segment has a slot outside its chunk's page (`misplaced`),
/// after `pages` were found before it, its own chunk's page last. The allocator checks those
/// pages first, as a free marks each chunk's page before it checks the chunk's slots: a page
/// of them at fault is the error. A dry run finds out: the page list ends with page 0, which
/// every allocator refuses, so the call changes nothing.
#[cold]
#[inline(never)]
fn refuse_segments<A: KvAllocator + ?Sized>(
    allocator: &mut A,
    segments: &[(&[KvSlot], usize)],
    mut pages: Vec<PageId>,
    misplaced: AllocError,
) -> AllocError {
    pages.push(0);
    match allocator.free_page_ids(&pages, FreeOrder::Given) {
        Err(AllocError::PageOutOfRange(PageOutOfRange { page: 0, .. })) | Ok(()) => misplaced,
        Err(error) => {
            let geometry = PageGeometry::new(allocator.page_size());
            name_slot(allocator, error, segment_heads(geometry, segments))
        }
    }
}

/// A page call's error, named as the slot call that made it names its pages: by the first of
/// `naming` in the page at fault (a page the allocator does not have is a reserved or
/// out-of-range slot).
#[cold]
#[inline(never)]
fn name_slot<A: KvAllocator + ?Sized>(
    allocator: &A,
    error: AllocError,
    mut naming: impl Iterator<Item = KvSlot>,
) -> AllocError {
    let page_size = allocator.page_size();
    let mut named = |page: PageId| {
        naming
            .find(|&slot| slot / page_size as KvSlot == page)
            .unwrap_or(page * page_size as KvSlot)
    };
    match error {
        AllocError::PageOutOfRange(PageOutOfRange { page: 0, .. }) => AllocError::ReservedSlot {
            slot: named(0),
            page_size,
        },
        AllocError::PageOutOfRange(PageOutOfRange { page, pages }) => AllocError::SlotOutOfRange {
            slot: named(page),
            slot_end: pages as u64 * page_size as u64,
        },
        AllocError::DoubleFree { page, state, .. } => AllocError::DoubleFree {
            slot: named(page),
            page,
            state,
        },
        AllocError::NotAllocated { page, .. } => AllocError::NotAllocated {
            slot: named(page),
            page,
        },
        other => other,
    }
}

/// Whether every slot of `slots` lies in `page` (a page whose slots fit in `u32`): a `u32`
/// range test folded without early exit, which LLVM vectorises.
#[inline]
fn all_in_page(geometry: PageGeometry, slots: &[KvSlot], page: usize) -> bool {
    let first = geometry.first_slot(page as PageId);
    let page_size = geometry.page_size() as KvSlot;
    if geometry.is_power_of_two() {
        // A slot lies in the page when it differs from its first slot below the page size's
        // bit: one OR of XORs, cheaper to vectorise than a range test.
        return slots
            .iter()
            .fold(0, |differ, &slot| differ | (slot ^ first))
            < page_size;
    }
    !slots.iter().fold(false, |outside, &slot| {
        outside | (slot.wrapping_sub(first) >= page_size)
    })
}

/// The error of a segment whose `chunk` (the positions of `slots` that must lie in `page`) has
/// a slot outside it: the first such slot.
#[cold]
#[inline(never)]
fn segment_not_paged(
    geometry: PageGeometry,
    slots: &[KvSlot],
    mut chunk: std::ops::Range<usize>,
    page: usize,
) -> AllocError {
    let offset = chunk
        .find(|&i| geometry.page_of(slots[i]) != page)
        .expect("all_in_page found a slot outside the page");
    AllocError::SegmentNotPaged {
        offset,
        slot: slots[offset],
        expected_page: page,
    }
}

/// [`all_in_page`] for the one-page free, with runs of the common page sizes (16, 32, 64)
/// tested at a length known at compile time: straight-line vector code with no loop and no
/// remainder (W1_k1: 186 -> 159 instructions per page, with [`push_slot_run`] on the allocating
/// side). Only there: in `segment_pages` the same dispatch cost W2 about 1,300 more instructions
/// per step than the loop (LLVM's fixed-length code for that chunk was the longer).
#[inline]
fn run_in_page(geometry: PageGeometry, slots: &[KvSlot], page: usize) -> bool {
    fn fixed<const N: usize>(slots: &[KvSlot]) -> &[KvSlot] {
        <&[KvSlot; N]>::try_from(slots).map_or(slots, |run| run.as_slice())
    }
    match slots.len() {
        16 => all_in_page(geometry, fixed::<16>(slots), page),
        32 => all_in_page(geometry, fixed::<32>(slots), page),
        64 => all_in_page(geometry, fixed::<64>(slots), page),
        _ => all_in_page(geometry, slots, page),
    }
}
