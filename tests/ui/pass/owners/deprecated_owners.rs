//! A `#[deprecated]` owner compiles in a crate that denies `deprecated`: `#[owner]` re-exports
//! a free owner function (with its capability token, which shares its name) from the owner's
//! hidden module, and that re-export is not a use of it. Its callers are still warned
//! (`fail/misuse/deprecated_owner_warns_its_callers.rs`).

#![deny(deprecated)]

#[kvown::guarded]
#[derive(Debug, Default)]
pub struct Frame {
    #[owned_by(fill, Batch::go)]
    head: u8,
}

#[kvown::owner]
#[deprecated(note = "use `Batch::go`")]
pub fn fill(frame: &mut Frame) {
    frame.set_head(owner, 1);
}

pub struct Batch;

#[kvown::owners]
impl Batch {
    #[owner]
    #[deprecated(note = "use something else")]
    pub fn go(frame: &mut Frame) {
        frame.set_head(owner, 2);
    }
}

#[allow(deprecated)]
#[test]
fn compiles_and_runs() {
    let mut frame = Frame::default();
    fill(&mut frame);
    assert_eq!(frame.head(), 1);
    Batch::go(&mut frame);
    assert_eq!(frame.head(), 2);
}
