//! An owned field named `from` gets a `from(&self)` getter, which `Span::from(..)` names instead
//! of `From::from`: the init struct converts with `.into()` or `<Span as From<_>>::from`, and
//! the generated `From` impl itself never calls `Span::from`.

#[kvown::guarded(into_init)]
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Span {
    #[owned_by(widen)]
    from: usize,
    to: usize,
}

#[kvown::owner]
pub fn widen(span: &mut Span) {
    span.set_from(owner, 0);
    *span.from_mut(owner) += 1;
}

#[test]
fn compiles_and_runs() {
    let mut span: Span = SpanInit { from: 3, to: 9 }.into();
    widen(&mut span);
    assert_eq!((span.from(), span.fields_mut().to), (1, &mut 9));
    let again = <Span as From<_>>::from(SpanInit { from: 1, to: 9 });
    assert_eq!(again, span);
    let init: SpanInit = span.into_init();
    assert_eq!((init.from, init.to), (1, 9));
}
