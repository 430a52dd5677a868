//! The capability cannot be stored in a static.

#[kvown::guarded]
pub struct Req {
    #[owned_by(alloc)]
    len: usize,
}

#[kvown::owner]
pub fn alloc(req: &mut Req) {
    req.set_len(owner, 1);
}

use std::sync::Mutex;

static STASH: Mutex<Option<&'static stash>> = Mutex::new(None);

#[kvown::owner(token = cap)]
pub fn stash(req: &mut Req) {
    let _ = req;
    *STASH.lock().unwrap() = Some(cap);
}

fn main() {}
