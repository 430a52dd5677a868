//! The limit the README documents: with an owned field `from`, `Span::from` is its getter, so
//! the usual `Span::from(SpanInit { .. })` does not compile (use `.into()`).

#[kvown::guarded]
pub struct Span {
    #[owned_by(widen)]
    from: usize,
    to: usize,
}

#[kvown::owner]
pub fn widen(span: &mut Span) {
    span.set_from(owner, 0);
}

fn main() {
    let _span = Span::from(SpanInit { from: 3, to: 9 });
}
