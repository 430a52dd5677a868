//! Field types and generics are compiled inside the seal, where owned fields are accessible:
//! an item in an array length's block could write `Req::len` for a function that is not its
//! owner (here registered with `inventory` and called from `not_an_owner`), and so could the
//! items a macro call there expands to. Both are refused, each at its place.

pub struct Sneak(pub fn(&mut Req));
kvown::__private::inventory::collect!(Sneak);

macro_rules! four {
    () => {
        4
    };
}

#[kvown::guarded]
pub struct Req<const N: usize = { four!() }> {
    #[owned_by(grow)]
    len: u32,
    pad: [u8; {
        fn sneak<const N: usize>(r: &mut Req<N>) { r.len = 99; }
        kvown::__private::inventory::submit!(Sneak(sneak::<4>));
        4
    }],
    tail: [u8; four!()],
}

#[kvown::owner]
pub fn grow(r: &mut Req) {
    r.set_len(owner, 1);
}

fn not_an_owner(r: &mut Req) {
    let sneak = kvown::__private::inventory::iter::<Sneak>.into_iter().next().unwrap();
    (sneak.0)(r);
}

fn main() {
    let mut r = Req::from(ReqInit { len: 0, pad: [0; 4], tail: [0; 4] });
    not_an_owner(&mut r);
    assert_eq!(r.len(), 99);
}
