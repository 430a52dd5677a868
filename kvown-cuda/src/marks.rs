//! [`BatchMarks`]: which indices (rows, pages) the batch being planned has claimed, cleared in
//! O(1) per batch.

/// A stamp per index: an index is claimed by the current batch when its stamp equals the batch's
/// number. Starting a batch bumps the number, which unclaims every index at once; the stamps are
/// cleared only when the number wraps (every 2^32 - 1 batches).
#[derive(Debug, Clone)]
pub(crate) struct BatchMarks {
    stamps: Vec<u32>,
    batch: u32,
}

impl BatchMarks {
    /// Marks for indices `0..len`, none claimed.
    pub(crate) fn new(len: usize) -> Self {
        Self {
            stamps: vec![0; len],
            batch: 0,
        }
    }

    /// Starts a batch: no index is claimed.
    pub(crate) fn start(&mut self) {
        self.batch = self.batch.wrapping_add(1);
        if self.batch == 0 {
            self.stamps.fill(0);
            self.batch = 1;
        }
    }

    /// Claims `index` for the current batch: `false` when the batch had claimed it already.
    ///
    /// # Panics
    /// When `index` is out of range (callers validate indices first).
    pub(crate) fn claim(&mut self, index: usize) -> bool {
        let stamp = &mut self.stamps[index];
        let fresh = *stamp != self.batch;
        *stamp = self.batch;
        fresh
    }
}

#[cfg(test)]
mod tests {
    use super::BatchMarks;

    #[test]
    fn a_claim_lasts_for_its_batch_only() {
        let mut marks = BatchMarks::new(4);
        marks.start();
        assert!(marks.claim(2));
        assert!(!marks.claim(2));
        assert!(marks.claim(3));
        marks.start();
        assert!(marks.claim(2), "a new batch starts with nothing claimed");
        assert!(!marks.claim(2));
    }

    #[test]
    fn wrapping_the_batch_number_clears_every_stamp() {
        let mut marks = BatchMarks::new(2);
        marks.start();
        assert!(marks.claim(1));
        // 2^32 - 2 batches later the number wraps back to 1.
        marks.batch = u32::MAX;
        marks.start();
        assert_eq!(marks.batch, 1);
        assert!(
            marks.claim(1),
            "the stamp left by the earlier batch 1 must not count"
        );
        assert!(!marks.claim(1));
    }
}
