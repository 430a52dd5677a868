//! A `?Sized` parameter used only behind `PhantomData`, a reference or a raw pointer: the struct
//! is built, converted, written and taken apart for unsized arguments (`Id<str>`,
//! `Id<dyn Shape>`, `View<str, [u8]>`). `Sized` bounds go only where a field holds the parameter
//! by value (`unsized_tail.rs`).

use std::marker::PhantomData;

pub trait Shape {}

#[kvown::guarded(into_init)]
#[derive(Debug)]
pub struct Id<T: ?Sized> {
    #[owned_by(Id::advance)]
    raw: u32,
    _of: PhantomData<T>,
}

#[kvown::owners]
impl<T: ?Sized> Id<T> {
    #[owner]
    pub fn advance(&mut self) {
        self.set_raw(owner, self.raw() + 1);
    }
}

#[kvown::guarded]
pub struct View<'a, T: ?Sized, U>
where
    U: ?Sized,
{
    #[owned_by(retarget)]
    target: &'a T,
    #[owned_by(retarget)]
    raw: *const U,
    hits: u32,
}

#[kvown::owner]
pub fn retarget<'a>(view: &mut View<'a, str, [u8]>, to: &'a str) {
    view.set_target(owner, to);
    view.set_raw(owner, to.as_bytes() as *const [u8]);
}

#[test]
fn compiles_and_runs() {
    let mut id: Id<str> = Id::from(IdInit {
        raw: 1,
        _of: PhantomData,
    });
    id.advance();
    let parts: IdInit<str> = id.into_init();
    assert_eq!(parts.raw, 2);

    let mut shape: Id<dyn Shape> = IdInit {
        raw: 7,
        _of: PhantomData,
    }
    .into();
    shape.advance();
    assert_eq!(shape.raw(), 8);
    assert_eq!(shape.fields_mut()._of, &mut PhantomData);

    let start = "start";
    let mut view = View::from(ViewInit {
        target: start,
        raw: start.as_bytes() as *const [u8],
        hits: 0,
    });
    retarget(&mut view, "next");
    *view.fields_mut().hits += 1;
    assert_eq!((view.target(), view.hits), ("next", 1));
    assert_eq!(view.raw().len(), 4);
}
