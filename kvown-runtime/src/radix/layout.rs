//! The tree's page arithmetic without hardware division on its hot paths.
//!
//! A node stores its key page by page, each page as `page_size` token ids followed by its page
//! id, so finding how many pages a node holds divides its word count by `page_size + 1`, which
//! is never a power of two for the usual page sizes. A hardware divide takes tens of cycles, and
//! inserting a page used to take about four of them (finding its page id, checking its
//! alignment, indexing it, appending it); [`KeyLayout`] hands out the allocator's
//! [`PageGeometry`] for the page size's own arithmetic (shifts and masks for powers of two) and
//! does the division by `page_size + 1` itself, with a precomputed reciprocal. Caching prompts
//! (the W3c workload) ran 6-7% faster for it (`benches/README.md`).

use crate::alloc::PageGeometry;

/// The page size of one tree and the arithmetic of its keys: pages of `page_size` tokens,
/// stored as `page_size + 1` words each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct KeyLayout {
    geometry: PageGeometry,
    /// `page_size + 1`: a page's tokens and its page id.
    words_per_page: usize,
    /// `ceil(2^64 / words_per_page)`: `(n * reciprocal) >> 64` is `n / words_per_page` for every
    /// `n < 2^32` (Lemire, Kaser and Kurz, "Faster remainder by direct computation", Software:
    /// Practice and Experience 49(6), 2019, theorem 1 with N = 32 and F = 64).
    reciprocal: u64,
}

impl KeyLayout {
    /// The layout of pages of `page_size` tokens.
    ///
    /// # Panics
    /// If `page_size` is 0 or `page_size + 1` overflows.
    pub(super) fn new(page_size: usize) -> KeyLayout {
        assert!(page_size > 0, "radix cache page size must be at least 1");
        let words_per_page = page_size
            .checked_add(1)
            .expect("radix cache page size leaves room for its page id");
        // `words_per_page >= 2`, so the quotient is below 2^63 and the increment cannot overflow.
        let reciprocal = u64::MAX / words_per_page as u64 + 1;
        KeyLayout {
            geometry: PageGeometry::new(page_size),
            words_per_page,
            reciprocal,
        }
    }

    /// The page size's own arithmetic (page of a slot, offsets, alignment, whole pages).
    #[inline(always)]
    pub(super) fn geometry(self) -> PageGeometry {
        self.geometry
    }

    /// Words a page takes in a node: its tokens and its page id.
    #[inline(always)]
    pub(super) fn words_per_page(self) -> usize {
        self.words_per_page
    }

    /// The pages stored in `words` words of a node.
    #[inline(always)]
    pub(super) fn pages_in_words(self, words: usize) -> usize {
        match u32::try_from(words) {
            Ok(words) => ((u128::from(self.reciprocal) * u128::from(words)) >> 64) as usize,
            // A node of 2^32 words or more (page size 1 and a key near `u32::MAX` tokens).
            Err(_) => words / self.words_per_page,
        }
    }

    /// The words that store the whole pages of `tokens` tokens.
    #[inline(always)]
    pub(super) fn key_words(self, tokens: usize) -> usize {
        self.geometry.whole_pages(tokens) * self.words_per_page
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn pages_in_words_divides_exactly_at_the_edges() {
        for page_size in [1, 2, 3, 4, 15, 16, 17, 31, 32, 63, 64, 255, 256, 1 << 20] {
            let layout = KeyLayout::new(page_size);
            let d = page_size + 1;
            let top = u32::MAX as usize;
            let edges = [0, 1, d - 1, d, d + 1, 2 * d - 1, 2 * d, top - 1, top];
            for words in edges.into_iter().chain(top / d * d - 1..=top / d * d + 1) {
                assert_eq!(layout.pages_in_words(words), words / d, "{words} / {d}");
            }
            // Past `u32::MAX` words the layout divides the plain way.
            for words in [top + 1, top + d, 1 << 40] {
                assert_eq!(layout.pages_in_words(words), words / d, "{words} / {d}");
            }
        }
    }

    proptest! {
        #[test]
        fn pages_in_words_is_division(page_size in 1usize..=u32::MAX as usize - 1, words in any::<u32>()) {
            let layout = KeyLayout::new(page_size);
            prop_assert_eq!(layout.pages_in_words(words as usize), words as usize / (page_size + 1));
        }

        #[test]
        fn key_words_are_whole_pages_of_words(page_size in 1usize..=100, n in 0usize..1 << 24) {
            let layout = KeyLayout::new(page_size);
            prop_assert_eq!(layout.key_words(n), n / page_size * (page_size + 1));
        }
    }
}
