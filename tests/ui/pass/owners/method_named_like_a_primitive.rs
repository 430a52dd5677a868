//! A method owner named like a primitive type: its token keeps the `Type_method` name inside its
//! sealed module, so the type `u8` in the method's body is still the primitive.

#[kvown::guarded]
#[derive(Default)]
pub struct Req {
    #[owned_by(Batch::u8)]
    len: usize,
}

#[derive(Default)]
pub struct Batch {
    req: Req,
}

#[kvown::owners]
impl Batch {
    #[owner]
    pub fn u8(&mut self) -> u8 {
        let width: u8 = 8;
        self.req.set_len(owner, usize::from(width));
        width
    }
}

#[test]
fn compiles_and_runs() {
    let mut batch = Batch::default();
    assert_eq!(batch.u8(), 8);
    assert_eq!(batch.req.len(), 8);
}
