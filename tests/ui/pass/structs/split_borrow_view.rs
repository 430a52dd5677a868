//! `fields_mut()` borrows every field at once (owned fields shared, others mutable), restoring the
//! split borrow that getters alone would prevent; owned fields are read through `&T` or by value.

#[kvown::guarded]
#[derive(Default)]
pub struct Req {
    #[owned_by(alloc)]
    pages: Vec<u32>,
    #[owned_by(alloc, read = ref)]
    len: u64,
    #[owned_by(alloc, read = copy)]
    span: Span,
    scratch: Vec<u32>,
    hits: u32,
}

#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Span {
    pub start: u32,
    pub end: u32,
}

#[kvown::owner]
pub fn alloc(req: &mut Req) {
    req.pages_mut(owner).extend([1, 2, 3]);
    req.set_len(owner, 3);
    req.set_span(owner, Span { start: 1, end: 3 });
}

#[test]
fn compiles_and_runs() {
    let mut req = Req::default();
    alloc(&mut req);
    let view = req.fields_mut();
    for page in view.pages {
        view.scratch.push(page * 10);
        *view.hits += 1;
    }
    assert_eq!(*view.len, 3);
    let len: &u64 = req.len();
    let span: Span = req.span();
    assert_eq!((*len, span), (3, Span { start: 1, end: 3 }));
    assert_eq!((req.scratch.as_slice(), req.hits), (&[10, 20, 30][..], 3));
}
