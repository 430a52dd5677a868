//! A lint allowed (or expected) on the struct or on a field, also under `cfg_attr`, holds for
//! the copies of the field types that `#[guarded]` generates (the init struct, the view struct,
//! the accessors): a crate that denies `deprecated`, `unused_braces` or `private_interfaces`
//! builds when the struct or field says so. Before, the copies were linted out of reach of the
//! struct's and the fields' attributes. (`deprecated` and `unused_braces` the expansion now
//! allows in its copies anyway; `private_interfaces`, which only the copies trigger, is the one
//! that shows the user's attributes reaching them.)

#![deny(deprecated, unused_braces, private_interfaces)]

// A public accessor or view field of a crate-private type: the sealed field itself is private,
// so only the generated items meet the lint.
pub mod private {
    #[derive(Clone, Copy, Debug, Default, PartialEq)]
    pub(crate) struct Secret(pub u8);

    #[kvown::guarded]
    #[derive(Default)]
    pub struct OnTheField {
        #[owned_by(reveal)]
        #[allow(private_interfaces)]
        secret: Secret,
    }

    #[kvown::guarded]
    #[derive(Default)]
    #[cfg_attr(all(), allow(private_interfaces))]
    pub struct OnTheStruct {
        #[owned_by(reveal)]
        secret: Secret,
    }

    #[kvown::owner]
    pub fn reveal(field: &mut OnTheField, strukt: &mut OnTheStruct) -> u8 {
        field.set_secret(owner, Secret(1));
        strukt.set_secret(owner, Secret(2));
        field.secret().0 + strukt.secret().0
    }
}

#[deprecated(note = "use something else")]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Old(pub u8);

// On the struct: braces in an array length (linted again in the copies, where `Self` is
// replaced) and a deprecated field type.
#[kvown::guarded]
#[allow(unused_braces)]
#[expect(deprecated)]
pub struct Frame {
    #[owned_by(fill)]
    head: [u8; { Self::LEN }],
    tail: [u16; { Self::LEN / 2 }],
    legacy: Old,
}

impl Frame {
    pub const LEN: usize = 4;
}

// On the fields: `expect` is fulfilled by the field itself and only allows in the copies.
#[kvown::guarded]
#[derive(Debug, Default)]
pub struct Slot {
    #[owned_by(fill)]
    #[expect(deprecated)]
    old: Old,
    #[allow(deprecated)]
    spare: Old,
    plain: u8,
}

// Under `cfg_attr`, on the struct and on a field.
#[kvown::guarded]
#[cfg_attr(all(), allow(deprecated))]
#[derive(Debug, Default)]
pub struct Gated {
    #[owned_by(fill)]
    #[cfg_attr(not(any()), expect(deprecated))]
    old: Old,
    spare: Old,
}

#[kvown::owner]
#[allow(deprecated)]
pub fn fill(frame: &mut Frame, slot: &mut Slot) {
    frame.head_mut(owner)[0] = 1;
    slot.set_old(owner, Old(2));
}

#[allow(deprecated)]
#[test]
fn compiles_and_runs() {
    let mut frame = Frame::from(FrameInit {
        head: [0; Frame::LEN],
        tail: [0; 2],
        legacy: Old(0),
    });
    let mut slot = Slot::default();
    fill(&mut frame, &mut slot);
    let view = frame.fields_mut();
    view.tail[1] = 7;
    assert_eq!((frame.head()[0], frame.tail[1]), (1, 7));
    assert_eq!((*slot.old(), slot.spare, slot.plain), (Old(2), Old(0), 0));
    let (mut field, mut strukt) = Default::default();
    assert_eq!(private::reveal(&mut field, &mut strukt), 3);
    let gated = Gated::default();
    assert_eq!((*gated.old(), gated.spare), (Old(0), Old(0)));
}
