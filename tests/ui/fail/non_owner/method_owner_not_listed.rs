//! A method owner (`Type::method`) that is not listed cannot write; the message names its token.

#[kvown::guarded]
pub struct Req {
    #[owned_by(Batch::alloc)]
    len: usize,
}

pub struct Batch {
    reqs: Vec<Req>,
}

#[kvown::owners]
impl Batch {
    #[owner]
    pub fn alloc(&mut self) {
        for req in &mut self.reqs {
            req.set_len(owner, 1);
        }
    }

    #[owner]
    pub fn retract(&mut self) {
        for req in &mut self.reqs {
            req.set_len(owner, 0);
        }
    }
}

fn main() {}
