//! The token of `Type::method` is `Type_method`: `#[owners]` refuses a type name that is not
//! UpperCamelCase without `_`, since `Batch_x::y` and `Batch::x_y` would share the token
//! `Batch_x_y`, and a lower-case type's token would look like a free function's.

#![allow(non_camel_case_types)]

#[kvown::guarded]
pub struct Req {
    #[owned_by(Batch::x_y)]
    len: usize,
}

pub struct Batch;
pub struct Batch_x;
pub struct batch;

#[kvown::owners]
impl Batch_x {
    #[owner]
    pub fn y(req: &mut Req) {
        req.set_len(owner, 1);
    }
}

#[kvown::owners]
impl batch {
    #[owner]
    pub fn retract(req: &mut Req) {
        req.set_len(owner, 2);
    }
}

fn main() {}
