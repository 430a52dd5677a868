//! `Batch::retract` is listed; an `#[owners] impl other::Batch` (another type whose last path
//! segment is `Batch`) in the struct's module would define the token `Batch_retract` there.
//! `#[owners]` refuses a self type that is not one identifier.

#[kvown::guarded]
pub struct Req {
    #[owned_by(Batch::retract)]
    len: usize,
}

pub struct Batch;

pub mod other {
    pub struct Batch;
}

#[kvown::owners]
impl other::Batch {
    #[owner]
    pub fn retract(req: &mut Req) {
        req.set_len(owner, 7);
    }
}

fn main() {}
