//! `guarded_vs_plain`: the same loop of field writes, through a guarded field's owner and to a
//! plain field. `black_box` on the struct each iteration forces a real load and store, so
//! neither loop folds into a closed form.

use std::hint::black_box;

/// A counter whose field only [`bump_guarded`] may write.
#[kvown::guarded]
#[derive(Debug, Default)]
pub struct GuardedCounter {
    /// The count.
    #[owned_by(bump_guarded)]
    count: u64,
}

/// The same counter, unguarded.
#[derive(Debug, Default)]
pub struct PlainCounter {
    /// The count.
    pub count: u64,
}

/// Adds `0 + 1 + … + (writes - 1)` to the guarded count, one owner write per step.
#[kvown::owner]
pub fn bump_guarded(counter: &mut GuardedCounter, writes: u64) -> u64 {
    for i in 0..writes {
        let counter = black_box(&mut *counter);
        *counter.count_mut(owner) += i;
    }
    counter.count()
}

/// Adds `0 + 1 + … + (writes - 1)` to the plain count, one write per step.
pub fn bump_plain(counter: &mut PlainCounter, writes: u64) -> u64 {
    for i in 0..writes {
        let counter = black_box(&mut *counter);
        counter.count += i;
    }
    counter.count
}
