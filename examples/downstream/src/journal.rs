//! A private module: guarded items that are not public are documented as this module's own
//! with `cargo doc --document-private-items`.

/// How many events the journal has recorded; only [`record`] counts, and
/// [`Journal::clear`] starts over. `into_init` (asked for: the journal has no destructor) takes a
/// finished journal apart.
#[kvown::guarded(into_init)]
#[derive(Debug, Default)]
struct Journal {
    #[owned_by(record, Journal::clear)]
    events: u64,
}

#[kvown::owners]
impl Journal {
    /// Forgets every event.
    #[owner]
    fn clear(&mut self) {
        self.set_events(owner, 0);
    }
}

/// Counts one event.
#[kvown::owner]
fn record(journal: &mut Journal) {
    *journal.events_mut(owner) += 1;
}

/// Records `n` events in a fresh journal and returns its count.
pub fn recorded(n: u64) -> u64 {
    let mut journal = Journal::from(JournalInit::default());
    record(&mut journal);
    journal.clear();
    for _ in 0..n {
        record(&mut journal);
    }
    journal.into_init().events
}
