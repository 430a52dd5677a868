//! An owned field's `#[deprecated]` is repeated on its accessors: reading it (or writing it, in
//! an owner) warns as a plain field access would, here an error under `deny`.

#![deny(deprecated)]

#[kvown::guarded]
#[derive(Debug, Default)]
pub struct Frame {
    #[owned_by(fill)]
    #[deprecated(note = "read `size` instead")]
    head: u8,
    pub size: u8,
}

#[kvown::owner]
pub fn fill(frame: &mut Frame) {
    frame.set_head(owner, 1);
}

fn main() {
    let mut frame = Frame::default();
    fill(&mut frame);
    let _ = frame.head();
}
