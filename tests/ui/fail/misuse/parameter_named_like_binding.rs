//! A parameter already named like the capability binding (`owner`, or the `token = ..` name).

#[kvown::guarded]
pub struct Req {
    #[owned_by(alloc, Batch::grow)]
    len: usize,
}

#[kvown::owner]
pub fn alloc(req: &mut Req, owner: u32) {
    let _ = (req, owner);
}

pub struct Batch;

#[kvown::owners]
impl Batch {
    #[owner(token = cap)]
    pub fn grow(&self, cap: usize) {
        let _ = cap;
    }
}

fn main() {}
