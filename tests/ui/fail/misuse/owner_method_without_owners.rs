//! `#[owner]` on a method needs `#[owners]` on its impl block.

#[kvown::guarded]
pub struct Req {
    #[owned_by(Batch::alloc)]
    len: usize,
}

pub struct Batch {
    req: Req,
}

impl Batch {
    #[kvown::owner]
    pub fn alloc(&mut self) {
        self.req.set_len(owner, 1);
    }
}

fn main() {}
