//! Everything the macros generate compiles under `#![forbid(unsafe_code)]` and strict lints.

#![forbid(unsafe_code)]
#![deny(warnings, clippy::all)]

#[kvown::guarded]
#[derive(Default)]
pub struct Req {
    #[owned_by(alloc, Batch::grow)]
    len: usize,
}

/// Owner.
#[kvown::owner]
pub fn alloc(req: &mut Req) {
    req.set_len(owner, 1);
}

/// Batch.
pub struct Batch(pub Req);

#[kvown::owners]
impl Batch {
    /// Owner method.
    #[owner]
    pub fn grow(&mut self) {
        *self.0.len_mut(owner) += 1;
    }
}

#[test]
fn compiles_and_runs() {
    let mut batch = Batch(Req::default());
    alloc(&mut batch.0);
    batch.grow();
    assert_eq!(batch.0.len(), 2);
}
