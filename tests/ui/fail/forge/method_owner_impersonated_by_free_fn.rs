//! `Batch::retract` is listed; a free owner named `Batch_retract` would define the token of
//! that method. `#[owner]` refuses a function whose name starts with an upper-case letter.

#[kvown::guarded]
pub struct Req {
    #[owned_by(Batch::retract)]
    len: usize,
}

pub struct Batch;

#[kvown::owner]
#[allow(non_snake_case)]
pub fn Batch_retract(req: &mut Req) {
    req.set_len(owner, 99);
}

fn main() {}
