//! Raw identifiers as the struct's name, an owned field's name and a method owner's name: the
//! generated names (`ReqInit`, `set_type`, `type_mut`, `Batch_move`) drop the `r#`.

#[kvown::guarded]
#[derive(Debug, Default)]
pub struct r#Req {
    #[owned_by(alloc, Batch::r#move)]
    r#type: usize,
}

pub struct Batch;

#[kvown::owners]
impl Batch {
    #[owner]
    pub fn r#move(req: &mut Req) {
        *req.type_mut(owner) += 10;
    }
}

#[kvown::owner]
pub fn alloc(req: &mut r#Req) {
    req.set_type(owner, 1);
}

#[test]
fn compiles_and_runs() {
    let mut req = Req::from(ReqInit { r#type: 0 });
    alloc(&mut req);
    Batch::r#move(&mut req);
    assert_eq!(req.r#type(), 11);
}
