//! Generic guarded structs: type, lifetime and const parameters, bounds, where-clauses, defaults.

use std::fmt::Debug;

#[kvown::guarded(into_init)]
#[derive(Debug, Clone, PartialEq)]
pub struct Slots<'a, T: Clone + Debug, const N: usize, U = u8>
where
    T: PartialEq,
{
    #[owned_by(fill)]
    values: [T; N],
    #[owned_by(fill)]
    label: &'a str,
    extra: Option<U>,
}

#[kvown::owner]
pub fn fill<'a, T: Clone + Debug + PartialEq, const N: usize>(
    slots: &mut Slots<'a, T, N>,
    value: T,
    label: &'a str,
) {
    for slot in slots.values_mut(owner).iter_mut() {
        *slot = value.clone();
    }
    slots.set_label(owner, label);
}

#[test]
fn compiles_and_runs() {
    let mut slots: Slots<'_, String, 3> = Slots::from(SlotsInit {
        values: Default::default(),
        label: "empty",
        extra: None,
    });
    fill(&mut slots, "x".to_string(), "full");
    assert_eq!(slots.values(), &["x", "x", "x"]);
    assert_eq!(slots.label(), "full");
    slots.extra = Some(3);
    let copy = slots.clone();
    assert_eq!(copy, slots);
    let parts = copy.into_init();
    assert_eq!((parts.label, parts.extra), ("full", Some(3)));
}
