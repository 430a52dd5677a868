//! Slot runs: a transfer's `(source, destination)` slot pairs cut into runs that are contiguous
//! in both pools, each of which becomes one descriptor per layer and tensor.

use kvown_runtime::ids::KvSlot;

/// `len` consecutive slots from `src` in the source pool go to as many from `dst` in the
/// destination pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotRun {
    /// First source slot.
    pub src: KvSlot,
    /// First destination slot.
    pub dst: KvSlot,
    /// Slots in the run.
    pub len: u32,
}

/// The runs of the pairs `(src[i], dst[i])`, in order. With `merge`, each run is as long as
/// both lists stay contiguous (`src[i + 1] == src[i] + 1` and the same for `dst`); without,
/// every pair is its own run. The lists have the same length (the caller checks).
pub fn slot_runs(src: &[KvSlot], dst: &[KvSlot], merge: bool) -> Vec<SlotRun> {
    let mut runs: Vec<SlotRun> = Vec::new();
    for (&s, &d) in src.iter().zip(dst) {
        match runs.last_mut() {
            Some(run)
                if merge
                    && run.src.checked_add(run.len) == Some(s)
                    && run.dst.checked_add(run.len) == Some(d) =>
            {
                run.len += 1;
            }
            _ => runs.push(SlotRun {
                src: s,
                dst: d,
                len: 1,
            }),
        }
    }
    runs
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn contiguous_pairs_merge_and_a_break_in_either_list_starts_a_run() {
        let runs = slot_runs(&[4, 5, 6, 7, 9, 10], &[20, 21, 30, 31, 32, 33], true);
        let expected = [(4, 20, 2), (6, 30, 2), (9, 32, 2)];
        let got: Vec<_> = runs.iter().map(|r| (r.src, r.dst, r.len)).collect();
        assert_eq!(got, expected);
        assert_eq!(slot_runs(&[4, 5], &[20, 21], false).len(), 2);
        assert!(slot_runs(&[], &[], true).is_empty());
        // The end of the slot range does not wrap into a run.
        assert_eq!(slot_runs(&[u32::MAX, 0], &[1, 2], true).len(), 2);
    }

    proptest! {
        /// Runs expand back to exactly the pairs, and merged runs are maximal: no run could
        /// extend into the next.
        #[test]
        fn runs_cover_the_pairs_exactly_and_merged_runs_are_maximal(
            pairs in prop::collection::vec((0u32..64, 0u32..64), 0..48),
            merge: bool,
        ) {
            let (src, dst): (Vec<_>, Vec<_>) = pairs.iter().copied().unzip();
            let runs = slot_runs(&src, &dst, merge);
            let expanded: Vec<_> = runs
                .iter()
                .flat_map(|r| (0..r.len).map(move |i| (r.src + i, r.dst + i)))
                .collect();
            prop_assert_eq!(expanded, pairs);
            for window in runs.windows(2) {
                let (a, b) = (window[0], window[1]);
                let extends = a.src + a.len == b.src && a.dst + a.len == b.dst;
                prop_assert!(!(merge && extends));
            }
        }
    }
}
