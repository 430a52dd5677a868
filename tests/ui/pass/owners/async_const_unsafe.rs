//! `async fn`, `const fn` and `unsafe fn` owners. A `const fn` owner writes through the `const`
//! accessors (`set_` is `const` for `Copy` fields, `_mut` always).

#[kvown::guarded]
#[derive(Debug, Default)]
pub struct Req {
    #[owned_by(commit_async, commit_const, commit_unsafe)]
    len: usize,
    #[owned_by(commit_const)]
    pages: [u32; 2],
}

#[kvown::owner]
pub async fn commit_async(req: &mut Req, len: usize) {
    std::future::ready(()).await;
    req.set_len(owner, len);
    std::future::ready(()).await;
    *req.len_mut(owner) += 1;
}

#[kvown::owner]
pub const fn commit_const(mut req: Req, len: usize) -> Req {
    req.set_len(owner, len);
    *req.len_mut(owner) += 1;
    req.pages_mut(owner)[1] = 7;
    req
}

/// # Safety
/// `len` must be a valid length (the test has no real requirement).
#[kvown::owner]
pub unsafe fn commit_unsafe(req: &mut Req, len: usize) {
    req.set_len(owner, len);
}

fn block_on<F: std::future::Future>(future: F) -> F::Output {
    let mut future = std::pin::pin!(future);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    loop {
        if let std::task::Poll::Ready(out) = future.as_mut().poll(&mut cx) {
            return out;
        }
    }
}

#[test]
fn compiles_and_runs() {
    let mut req = Req::default();
    block_on(commit_async(&mut req, 7));
    assert_eq!(req.len(), 8);
    unsafe { commit_unsafe(&mut req, 3) };
    assert_eq!(req.len(), 3);
    let req = commit_const(req, 9);
    assert_eq!((req.len(), req.pages()), (10, [0, 7]));
}
