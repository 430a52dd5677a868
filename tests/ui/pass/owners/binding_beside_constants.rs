//! A constant, static or unit struct named like the capability binding in the owner's module
//! does not turn the generated `let owner = ..` into a pattern: the binding still binds.

#![allow(non_upper_case_globals, non_camel_case_types, dead_code)]

pub mod with_const {
    pub const owner: u8 = 1;

    #[kvown::guarded]
    #[derive(Default)]
    pub struct Req {
        #[owned_by(grow, Batch::shrink)]
        len: u32,
    }

    #[kvown::owner]
    pub fn grow(req: &mut Req) {
        req.set_len(owner, req.len() + 1);
    }

    pub struct Batch;

    #[kvown::owners]
    impl Batch {
        #[owner]
        pub fn shrink(req: &mut Req) {
            *req.len_mut(owner) -= 1;
        }
    }
}

pub mod with_static_and_unit_struct {
    pub static owner: u8 = 1;
    pub struct cap;

    #[kvown::guarded]
    #[derive(Default)]
    pub struct Req {
        #[owned_by(grow, reset)]
        len: u32,
    }

    #[kvown::owner]
    pub fn grow(req: &mut Req) {
        req.set_len(owner, 2);
    }

    #[kvown::owner(token = cap)]
    pub fn reset(req: &mut Req) {
        req.set_len(cap, 0);
    }
}

#[test]
fn compiles_and_runs() {
    let mut req = with_const::Req::default();
    with_const::grow(&mut req);
    with_const::grow(&mut req);
    with_const::Batch::shrink(&mut req);
    with_const::Batch::shrink(&mut req);
    assert_eq!(req.len(), 0);

    let mut req = with_static_and_unit_struct::Req::default();
    with_static_and_unit_struct::grow(&mut req);
    assert_eq!(req.len(), 2);
    with_static_and_unit_struct::reset(&mut req);
    assert_eq!(req.len(), 0);
}
