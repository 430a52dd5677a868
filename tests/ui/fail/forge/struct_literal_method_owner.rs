//! Forging a method owner's token (`Batch_alloc`) with a struct literal fails like a free one.

#[kvown::guarded]
pub struct Req {
    #[owned_by(Batch::alloc)]
    len: usize,
}

pub struct Batch {
    req: Req,
}

#[kvown::owners]
impl Batch {
    #[owner]
    pub fn alloc(&mut self) {
        self.req.set_len(owner, 1);
    }

    pub fn forge(&mut self) {
        let token = Batch_alloc { _seal: kvown::__private::OwnerSeal::new() };
        self.req.set_len(&token, 99);
    }
}

fn main() {}
