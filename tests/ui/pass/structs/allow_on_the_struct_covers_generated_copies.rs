//! A lint allowed on the struct holds for the copies of its field types that `#[guarded]`
//! generates: with `Self` replaced in the init struct, the view struct and the accessors, rustc
//! linted the braces of `[u8; { Self::LEN }]` there again, out of the struct's `allow`, so a
//! crate that denies `unused_braces` could not build.

#![deny(unused_braces)]

#[kvown::guarded]
#[allow(unused_braces)]
pub struct Frame {
    #[owned_by(fill)]
    head: [u8; { Self::LEN }],
    tail: [u16; { Self::LEN / 2 }],
}

impl Frame {
    pub const LEN: usize = 4;
}

#[kvown::owner]
pub fn fill(frame: &mut Frame) {
    frame.head_mut(owner)[0] = 1;
}

fn main() {
    let mut frame = Frame::from(FrameInit {
        head: [0; Frame::LEN],
        tail: [0; 2],
    });
    fill(&mut frame);
    let view = frame.fields_mut();
    view.tail[1] = 7;
    assert_eq!((frame.head()[0], frame.tail[1]), (1, 7));
}
