//! Lowercase constants named like the parameters of the generated setters and `From` (`value`,
//! `init`, and `_owner`, the capability parameter's old name) leave the expansion as it is: a
//! parameter they captured would be a constant pattern (E0308, or E0005 when the types match).

#![allow(non_upper_case_globals)]

const value: usize = 7;
const init: usize = 9;
const _owner: usize = 8;

#[kvown::guarded]
#[derive(Debug, Default)]
pub struct Counter {
    #[owned_by(bump)]
    hits: usize,
    #[owned_by(bump)]
    label: String,
}

#[kvown::owner]
pub fn bump(counter: &mut Counter) {
    counter.set_hits(owner, counter.hits() + value);
    counter.label_mut(owner).push('!');
}

#[test]
fn compiles_and_runs() {
    let mut counter: Counter = CounterInit {
        hits: init,
        label: String::new(),
    }
    .into();
    bump(&mut counter);
    assert_eq!((counter.hits(), counter.label().as_str()), (16, "!"));
    assert_eq!(_owner, 8);
}
