//! A parameter pattern that binds the capability binding's name inside a tuple, a struct
//! pattern or as a raw identifier: the capability would silently shadow it.

#[kvown::guarded]
pub struct Req {
    #[owned_by(alloc, fill, Batch::grow)]
    len: usize,
}

pub struct Pair {
    pub owner: u32,
    pub n: u32,
}

#[kvown::owner]
pub fn alloc(req: &mut Req, (owner, n): (usize, usize)) {
    req.set_len(owner, n);
}

#[kvown::owner]
pub fn fill(req: &mut Req, Pair { owner, .. }: Pair, r#owner2: u32) {
    let _ = (req, owner, owner2);
}

pub struct Batch;

#[kvown::owners]
impl Batch {
    #[owner(token = cap)]
    pub fn grow(&self, [r#cap, _]: [usize; 2]) {
        let _ = cap;
    }
}

fn main() {}
