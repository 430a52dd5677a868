//! The batched extend (sglang `alloc_extend`): every request checked, then its slots written,
//! three parts each.

use super::PageAllocator;
use crate::alloc::rules::{PageMarks, check_extend, check_latest, fill_extend, unmark_pages};
use crate::alloc::{AllocError, ExtendShape, KvSlot, ReuseOrder};

impl<R: ReuseOrder> PageAllocator<R> {
    /// [`KvAllocator::alloc_extend`](crate::alloc::KvAllocator::alloc_extend): validates the
    /// batch (its partial pages marked on the way, so that no two requests continue one), takes
    /// its new pages, and writes each request's slots.
    pub(super) fn extend(
        &mut self,
        reqs: &[ExtendShape],
        out: &mut Vec<KvSlot>,
    ) -> Result<(), AllocError> {
        let geometry = self.geometry;
        let (new_pages, new_tokens) = match self.check_extend_batch(reqs) {
            Ok(counts) => counts,
            Err(error) => {
                unmark_pages(
                    geometry,
                    &mut self.state,
                    reqs.iter().filter_map(|shape| shape.last_loc),
                );
                return Err(error);
            }
        };
        out.reserve(new_tokens);
        // The new pages move as one slice to the end of the deferred list, which has room for
        // every page (the free ones included), and leave it before the call returns.
        let Self {
            free,
            deferred,
            state,
            fill,
            ..
        } = self;
        let start = deferred.len();
        free.take_front_into(new_pages, deferred);
        let mut pages = &deferred[start..];
        // Also turns the partial pages `check_extend_batch` marked back to `Held`.
        for shape in reqs {
            fill_extend(geometry, shape, &mut pages, PageMarks { state, fill }, out);
        }
        debug_assert!(pages.is_empty(), "alloc_extend left pages unconsumed");
        deferred.truncate(start);
        Ok(())
    }

    /// Validates an extend batch and makes its new pages available: returns the new pages and
    /// new tokens. Marks each request's partial last page `Pending` (requests whose prefix ends
    /// at a page boundary, fresh prompts among them, mark nothing), so that a second request
    /// continuing it is refused; the caller turns the marks back to `Held`, on error too. Then
    /// checks each `last_loc` against its page's fill mark.
    #[inline]
    fn check_extend_batch(&mut self, reqs: &[ExtendShape]) -> Result<(usize, usize), AllocError> {
        let geometry = self.geometry;
        let mut new_pages = 0usize;
        let mut new_tokens = 0usize;
        for (request, shape) in reqs.iter().enumerate() {
            let pages = check_extend(geometry, &mut self.state, reqs, request)?;
            new_pages = new_pages.saturating_add(pages);
            new_tokens = new_tokens.saturating_add(shape.seq_len - shape.prefix_len);
        }
        for (request, shape) in reqs.iter().enumerate() {
            if let Some(last_loc) = shape.last_loc {
                check_latest(geometry, &self.fill, request, last_loc)?;
            }
        }
        // sglang's merge trigger: the paged allocator's `alloc_extend` merges when
        // `extend_num_tokens // page_size + bs + 1 > len(free_pages)`; the token allocator's
        // `alloc(extend_num_tokens)` when the tokens exceed the free list.
        let estimate = match R::FREED_FIRST {
            true => (new_tokens / geometry.page_size())
                .saturating_add(reqs.len())
                .saturating_add(1),
            false => new_pages,
        };
        self.ensure_free_within(new_pages, estimate)?;
        Ok((new_pages, new_tokens))
    }
}
