//! Which pages the tree holds: one bit per page id, so that an insert can refuse a page the tree
//! already caches (or names twice) in O(1) per page instead of corrupting the tree.

use std::fmt;

use crate::ids::PageId;

/// A set of page ids as a bit vector, one bit per id up to the largest ever held: 1/8 byte per
/// pool page in a `KvCache`, up to 512 MiB for a tree used on its own with page ids near
/// `u32::MAX`. It grows on demand and never shrinks.
#[derive(Clone, Default, PartialEq, Eq)]
pub(super) struct PageIndex {
    words: Vec<u64>,
}

impl PageIndex {
    /// Whether `page` is in the set.
    #[inline(always)]
    pub(super) fn contains(&self, page: PageId) -> bool {
        let (word, bit) = locate(page);
        self.words.get(word).is_some_and(|&w| w & bit != 0)
    }

    /// Adds `page`; returns whether it was absent.
    #[inline(always)]
    pub(super) fn insert(&mut self, page: PageId) -> bool {
        let (word, bit) = locate(page);
        if word >= self.words.len() {
            self.grow(word);
        }
        let absent = self.words[word] & bit == 0;
        self.words[word] |= bit;
        absent
    }

    /// Removes `page`; returns whether it was present.
    #[inline(always)]
    pub(super) fn remove(&mut self, page: PageId) -> bool {
        let (word, bit) = locate(page);
        let Some(w) = self.words.get_mut(word) else {
            return false;
        };
        let present = *w & bit != 0;
        *w &= !bit;
        present
    }

    /// Makes room for the bits of word `word` (rarely: the index grows to the pool's size once).
    #[cold]
    #[inline(never)]
    fn grow(&mut self, word: usize) {
        self.words.resize(word + 1, 0);
    }

    /// The pages in the set, in increasing order.
    pub(super) fn iter(&self) -> impl Iterator<Item = PageId> + '_ {
        self.words.iter().enumerate().flat_map(|(index, &word)| {
            (0..u64::BITS)
                .filter(move |bit| word & (1 << bit) != 0)
                .map(move |bit| index as PageId * u64::BITS + bit)
        })
    }

    /// Heap bytes of the bit vector.
    pub(super) fn heap_bytes(&self) -> usize {
        self.words.capacity() * size_of::<u64>()
    }
}

/// The word and the bit within it that stand for `page`.
#[inline(always)]
fn locate(page: PageId) -> (usize, u64) {
    ((page / u64::BITS) as usize, 1 << (page % u64::BITS))
}

impl fmt::Debug for PageIndex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.iter()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::PageIndex;
    use crate::ids::PageId;

    #[test]
    fn holds_each_page_once_across_word_boundaries() {
        let mut index = PageIndex::default();
        assert!(!index.contains(0) && !index.contains(PageId::MAX));
        for page in [0, 63, 64, 65, 200] {
            assert!(index.insert(page), "{page} was absent");
        }
        assert!(!index.insert(64), "64 is held already");
        assert_eq!(index.iter().count(), 5);
        assert_eq!(index.iter().collect::<Vec<_>>(), [0, 63, 64, 65, 200]);
        assert!(index.contains(63) && !index.contains(62) && !index.contains(201));
        assert!(index.remove(63));
        assert!(!index.remove(63), "63 is gone already");
        assert!(!index.remove(10_000), "beyond the bits: never held");
        assert_eq!(index.iter().count(), 4);
        assert_eq!(format!("{index:?}"), "{0, 64, 65, 200}");
        assert_eq!(index.heap_bytes(), index.words.capacity() * 8);
        assert_eq!(index.words.len(), 4, "grown to the word of page 200");
    }
}
