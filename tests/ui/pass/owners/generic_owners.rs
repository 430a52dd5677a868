//! Generic owners with where-clauses and `impl Trait` arguments: the token type stays one
//! non-generic type per owner.

use std::fmt::Debug;

#[kvown::guarded]
#[derive(Default)]
pub struct Req {
    #[owned_by(extend_from, extend_each)]
    tokens: Vec<u32>,
}

#[kvown::owner]
pub fn extend_from<I>(req: &mut Req, items: I) -> usize
where
    I: IntoIterator,
    I::Item: Into<u32> + Debug,
{
    let tokens = req.tokens_mut(owner);
    tokens.extend(items.into_iter().map(Into::into));
    tokens.len()
}

#[kvown::owner]
pub fn extend_each(req: &mut Req, items: impl Iterator<Item = u8>, scale: impl Fn(u8) -> u32) {
    for item in items {
        req.tokens_mut(owner).push(scale(item));
    }
}

#[test]
fn compiles_and_runs() {
    let mut req = Req::default();
    assert_eq!(extend_from(&mut req, [1u8, 2, 3]), 3);
    assert_eq!(extend_from(&mut req, vec![4u16]), 4);
    extend_each(&mut req, [5u8].into_iter(), |x| u32::from(x) * 10);
    assert_eq!(req.tokens(), &[1, 2, 3, 4, 50]);
}
