//! A module that glob-imports its parent (`use super::*`, as test modules do) may define owners
//! and guarded structs with the names of the parent's: the parent's hidden modules come in
//! through the glob, and the child's own (macro-expanded) ones must not be ambiguous with them.

#[kvown::guarded]
#[derive(Default)]
pub struct Req {
    #[owned_by(alloc, Batch::go)]
    len: u32,
}

#[kvown::owner]
pub fn alloc(r: &mut Req) {
    r.set_len(owner, 1);
}

pub struct Batch;

#[kvown::owners]
impl Batch {
    #[owner]
    pub fn go(r: &mut Req) {
        r.set_len(owner, 2);
    }
}

pub mod child {
    // Every name the glob brings is shadowed below: its presence is what is tested.
    #[allow(unused_imports)]
    use super::*;

    #[kvown::guarded]
    #[derive(Default)]
    pub struct Req {
        #[owned_by(alloc, Batch::go)]
        len: u32,
    }

    #[kvown::owner]
    pub fn alloc(r: &mut Req) {
        r.set_len(owner, 10);
    }

    pub struct Batch;

    #[kvown::owners]
    impl Batch {
        #[owner]
        pub fn go(r: &mut Req) {
            r.set_len(owner, 20);
        }
    }

    pub fn call_both(parent: &mut super::Req, own: &mut Req) {
        super::alloc(parent);
        alloc(own);
    }
}

#[test]
fn compiles_and_runs() {
    let (mut parent, mut own) = (Req::default(), child::Req::default());
    child::call_both(&mut parent, &mut own);
    assert_eq!((parent.len(), own.len()), (1, 10));
    Batch::go(&mut parent);
    child::Batch::go(&mut own);
    assert_eq!((parent.len(), own.len()), (2, 20));
}
