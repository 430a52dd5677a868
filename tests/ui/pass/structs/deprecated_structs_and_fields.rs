//! A `#[deprecated]` guarded struct or field compiles in a crate that denies `deprecated`: the
//! code `#[guarded]` derives from it (the init and view structs, `From`, the accessors, the
//! re-export out of the hidden module) does not count as a use. Uses still warn, through the
//! accessors too (`fail/misuse/deprecated_field_warns_through_its_accessors.rs`).

#![deny(deprecated)]

#[kvown::guarded]
#[derive(Debug, Default)]
pub struct Frame {
    #[owned_by(fill)]
    #[deprecated(note = "read `size` instead")]
    head: u8,
    #[deprecated(note = "unowned, deprecated")]
    pub tail: u8,
    pub size: u8,
}

#[kvown::guarded]
#[deprecated(note = "use `Frame`")]
#[derive(Debug, Default)]
pub struct Old {
    #[owned_by(fill)]
    len: u8,
}

#[kvown::owner]
#[allow(deprecated)]
pub fn fill(frame: &mut Frame, old: &mut Old) {
    frame.set_head(owner, 1);
    *frame.head_mut(owner) += 1;
    old.set_len(owner, 3);
}

#[allow(deprecated)]
#[test]
fn compiles_and_runs() {
    let mut frame = Frame::from(FrameInit {
        head: 0,
        tail: 0,
        size: 4,
    });
    let mut old = Old::default();
    fill(&mut frame, &mut old);
    *frame.fields_mut().tail = 5;
    assert_eq!(
        (frame.head(), frame.tail, frame.size, old.len()),
        (2, 5, 4, 3)
    );
}
