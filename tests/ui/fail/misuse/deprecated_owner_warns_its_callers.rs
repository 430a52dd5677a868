//! The re-export `#[owner]` makes of a `#[deprecated]` owner is allowed
//! (`pass/owners/deprecated_owners.rs`), not its uses: a caller is warned as for any
//! deprecated function (here an error, under `deny`).

#![deny(deprecated)]

#[kvown::guarded]
#[derive(Debug, Default)]
pub struct Frame {
    #[owned_by(fill)]
    head: u8,
}

#[kvown::owner]
#[deprecated(note = "use something else")]
pub fn fill(frame: &mut Frame) {
    frame.set_head(owner, 1);
}

fn main() {
    let mut frame = Frame::default();
    fill(&mut frame);
}
