//! `std::thread::spawn` needs `'static`: the capability cannot move into the thread.

#[kvown::guarded]
pub struct Req {
    #[owned_by(alloc)]
    len: usize,
}

#[kvown::owner]
pub fn alloc(req: &mut Req) {
    req.set_len(owner, 1);
}

#[kvown::owner]
pub fn spawn_writer() {
    std::thread::spawn(move || {
        let _capability: &spawn_writer = owner;
    });
}

fn main() {}
