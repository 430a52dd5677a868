//! A crate that renames kvown passes `crate = path` (serde-style) so expansions find the support
//! items. (The downstream crates under `examples/` check the same with a real renamed
//! dependency, where `::kvown` does not exist.) `renamed` is kvown under another name in the extern
//! prelude, as a renamed dependency is: `tests/ui.rs` declares it at its crate root.

#[renamed::guarded(crate = renamed)]
#[derive(Default)]
pub struct Req {
    #[owned_by(alloc, Batch::grow)]
    len: usize,
}

#[renamed::owner(crate = renamed)]
pub fn alloc(req: &mut Req) {
    req.set_len(owner, 1);
}

pub struct Batch(Req);

#[renamed::owners(crate = renamed)]
impl Batch {
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
    assert!(renamed::audit::AuditTable::collect().is_ok());
}
