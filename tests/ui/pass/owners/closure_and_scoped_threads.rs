//! The capability works inside closures and `std::thread::scope` threads of the owner's body
//! (the scope ends before the owner returns, so the borrow does not escape).

#[kvown::guarded]
#[derive(Default)]
pub struct Req {
    #[owned_by(alloc_batch)]
    len: usize,
}

#[kvown::owner]
pub fn alloc_batch(reqs: &mut [Req]) {
    let bump = |req: &mut Req| *req.len_mut(owner) += 1;
    for req in reqs.iter_mut() {
        bump(req);
    }
    let (left, right) = reqs.split_at_mut(1);
    std::thread::scope(|scope| {
        scope.spawn(|| left.iter_mut().for_each(|r| r.set_len(owner, r.len() + 10)));
        scope.spawn(|| {
            right
                .iter_mut()
                .for_each(|r| r.set_len(owner, r.len() + 100))
        });
    });
}

#[test]
fn compiles_and_runs() {
    let mut reqs: Vec<Req> = (0..3).map(|_| Req::default()).collect();
    alloc_batch(&mut reqs);
    let lens: Vec<usize> = reqs.iter().map(Req::len).collect();
    assert_eq!(lens, [11, 101, 101]);
}
