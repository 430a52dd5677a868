//! `Self` in the struct's where-clause and parameter bounds means the struct: the init and view
//! structs, which copy those predicates, get the struct's type in its place (as written there,
//! `Self` would be the init or view struct, which does not implement `Marked`).

pub trait Marked {}

#[kvown::guarded(into_init)]
#[derive(Debug, Default)]
pub struct Req<T: PartialEq<Self>>
where
    Self: Marked,
    Option<Self>: Sized,
{
    #[owned_by(grow)]
    len: u32,
    tag: T,
}

impl<T: PartialEq<Self>> Marked for Req<T> {}

#[derive(Debug, Default)]
pub struct Tag;

impl PartialEq<Req<Tag>> for Tag {
    fn eq(&self, _: &Req<Tag>) -> bool {
        true
    }
}

#[kvown::owner]
pub fn grow(req: &mut Req<Tag>) {
    *req.len_mut(owner) += 1;
}

#[test]
fn compiles_and_runs() {
    let mut req = Req::from(ReqInit { len: 1, tag: Tag });
    grow(&mut req);
    let view = req.fields_mut();
    assert_eq!(*view.len, 2);
    let init: ReqInit<Tag> = req.into_init();
    assert_eq!(init.len, 2);
}
