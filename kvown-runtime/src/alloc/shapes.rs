//! The batched extend and decode rules (sglang `alloc_extend_kernel` / `alloc_decode_kernel`)
//! as CPU code: per-request validation with page counts, and the slot writers.

use super::geometry::PageGeometry;
use super::{AllocError, DecodeShape, ExtendShape, KvSlot, PageId, PageState};

/// Whether `slot` lies in an allocated page.
#[inline]
fn is_held(state: &[PageState], geometry: PageGeometry, slot: KvSlot) -> bool {
    state.get(geometry.page_of(slot)) == Some(&PageState::Held)
}

impl ExtendShape {
    /// Checks the shape alone, as request `request` of a batch: `seq_len >= prefix_len`, and a
    /// `last_loc` exactly when there is a prefix. Returns the `last_loc` that a backend must
    /// still check against its pages (`None` for an empty prefix).
    pub fn validate(&self, request: usize) -> Result<Option<KvSlot>, AllocError> {
        let ExtendShape {
            prefix_len,
            seq_len,
            last_loc,
        } = *self;
        if seq_len < prefix_len {
            return Err(AllocError::PrefixExceedsSeq {
                request,
                prefix_len,
                seq_len,
            });
        }
        match (prefix_len, last_loc) {
            (0, None) => Ok(None),
            (0, Some(last_loc)) => Err(AllocError::UnexpectedLastLoc { request, last_loc }),
            (_, None) => Err(AllocError::MissingLastLoc {
                request,
                prefix_len,
            }),
            (_, Some(last_loc)) => Ok(Some(last_loc)),
        }
    }
}

/// Validates request `request` of an extend batch and returns its new pages,
/// `ceil(seq/ps) − ceil(pre/ps)`.
#[inline]
pub(crate) fn check_extend(
    geometry: PageGeometry,
    state: &[PageState],
    request: usize,
    shape: &ExtendShape,
) -> Result<usize, AllocError> {
    if let Some(last_loc) = shape.validate(request)? {
        check_last_loc(geometry, state, request, last_loc, shape.prefix_len)?;
    }
    Ok(geometry.pages_for(shape.seq_len) - geometry.pages_for(shape.prefix_len))
}

/// Validates request `request` of a decode batch and returns whether it opens a new page.
#[inline]
pub(crate) fn check_decode(
    geometry: PageGeometry,
    state: &[PageState],
    request: usize,
    seq_len: usize,
    last_loc: KvSlot,
) -> Result<bool, AllocError> {
    if seq_len < 2 {
        return Err(AllocError::DecodeSeqTooShort { request, seq_len });
    }
    let stored = seq_len - 1;
    check_last_loc(geometry, state, request, last_loc, stored)?;
    Ok(geometry.offset(stored) == 0)
}

/// The whole decode batch's validation in one branch-light pass: `Some(new pages)` when
/// every request passes [`check_decode`], `None` when some request fails it (the caller then
/// finds the first failure with [`check_decode`] for its typed error).
#[inline]
pub(crate) fn scan_decode(
    geometry: PageGeometry,
    state: &[PageState],
    reqs: &[DecodeShape],
) -> Option<usize> {
    let mut bad = false;
    let mut new_pages = 0usize;
    for shape in reqs {
        let stored = shape.seq_len.wrapping_sub(1);
        let last_loc = shape.last_loc;
        let held = state.get(geometry.page_of(last_loc)) == Some(&PageState::Held);
        let aligned = geometry.offset(last_loc as usize + 1) == geometry.offset(stored);
        bad |= (shape.seq_len < 2) | !held | !aligned;
        new_pages += usize::from(geometry.offset(stored) == 0);
    }
    (!bad).then_some(new_pages)
}

/// `last_loc` must be a slot of an allocated page at the page offset `prefix_len` implies.
#[inline]
fn check_last_loc(
    geometry: PageGeometry,
    state: &[PageState],
    request: usize,
    last_loc: KvSlot,
    prefix_len: usize,
) -> Result<(), AllocError> {
    if !is_held(state, geometry, last_loc) {
        return Err(AllocError::LastLocNotAllocated { request, last_loc });
    }
    if geometry.offset(last_loc as usize + 1) != geometry.offset(prefix_len) {
        return Err(AllocError::LastLocMismatch {
            request,
            last_loc,
            prefix_len,
            page_size: geometry.page_size(),
        });
    }
    Ok(())
}

/// Writes the slots of positions `[prefix_len, seq_len)` of one validated request, taking its
/// new pages from `pages` and marking them held. The three parts of §4.5: the rest of the old
/// partial page after `last_loc`, then new full pages in free-list order, then a partial last page.
#[inline]
pub(crate) fn fill_extend(
    geometry: PageGeometry,
    shape: &ExtendShape,
    pages: &mut impl Iterator<Item = PageId>,
    state: &mut [PageState],
    out: &mut Vec<KvSlot>,
) {
    let page_size = geometry.page_size();
    let offset = geometry.offset(shape.prefix_len);
    let extend_len = shape.seq_len - shape.prefix_len;
    let old_page_rest = match shape.last_loc {
        Some(last_loc) if offset != 0 => {
            let n1 = (page_size - offset).min(extend_len);
            out.extend(last_loc + 1..last_loc + 1 + n1 as KvSlot);
            n1
        }
        _ => 0,
    };
    let rest = extend_len - old_page_rest;
    let full_pages = geometry.whole_pages(rest);
    if page_size == 1 {
        for page in pages.by_ref().take(full_pages) {
            state[page as usize] = PageState::Held;
            out.push(page);
        }
        return;
    }
    for page in pages.by_ref().take(full_pages) {
        claim(geometry, page, page_size, state, out);
    }
    let tail = geometry.offset(rest);
    if tail > 0
        && let Some(page) = pages.next()
    {
        claim(geometry, page, tail, state, out);
    }
}

/// Marks `page` held and appends its first `len` slots.
#[inline]
fn claim(
    geometry: PageGeometry,
    page: PageId,
    len: usize,
    state: &mut [PageState],
    out: &mut Vec<KvSlot>,
) {
    state[page as usize] = PageState::Held;
    let first = geometry.first_slot(page);
    out.extend(first..first + len as KvSlot);
}
