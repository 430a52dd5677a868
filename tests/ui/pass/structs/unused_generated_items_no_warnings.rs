//! A binary that never touches the generated init struct or the `fields_mut` view still
//! compiles under `deny(warnings)`: the generated items carry no dead-code noise.
#![deny(warnings)]

mod counters {
    #[kvown::guarded]
    #[derive(Debug, Default)]
    pub struct Counter {
        #[owned_by(bump)]
        count: u64,
    }

    #[kvown::owner]
    pub fn bump(counter: &mut Counter) -> u64 {
        *counter.count_mut(owner) += 1;
        counter.count()
    }
}

#[test]
fn compiles_and_runs() {
    let mut counter = counters::Counter::default();
    assert_eq!(counters::bump(&mut counter), 1);
}
