//! A private module: guarded items that are not public are documented as this module's own
//! with `cargo doc --document-private-items`.

/// How many events the journal has recorded; only [`record`] counts.
#[kvown::guarded]
#[derive(Debug, Default)]
struct Journal {
    #[owned_by(record)]
    events: u64,
}

/// Counts one event.
#[kvown::owner]
fn record(journal: &mut Journal) {
    *journal.events_mut(owner) += 1;
}

/// Records `n` events in a fresh journal and returns its count.
pub fn recorded(n: u64) -> u64 {
    let mut journal = Journal::from(JournalInit::default());
    for _ in 0..n {
        record(&mut journal);
    }
    journal.events()
}
