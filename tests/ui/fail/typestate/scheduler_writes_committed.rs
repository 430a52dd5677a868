//! A scheduler function that is not an owner cannot write the ladder: the record is reachable
//! only read-only, and its setters demand an owner's capability.

use kvown::batch::Req;

fn settle_after_forward(req: &mut Req) {
    req.kv().set_kv_committed_len(owner, 5);
}

fn main() {
    let mut req = Req::new(1, vec![1, 2, 3]);
    settle_after_forward(&mut req);
}
