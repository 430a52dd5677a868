//! A guarded struct whose last field is a `?Sized` parameter (inline or in the where-clause),
//! owned or not: it is built sized from its init struct and used unsized behind a reference.

#[kvown::guarded(into_init)]
#[derive(Debug)]
pub struct Packet<T: ?Sized> {
    #[owned_by(stamp)]
    seq: u64,
    payload: T,
}

#[kvown::guarded]
pub struct Owned<T>
where
    T: ?Sized + AsRef<[u8]>,
{
    #[owned_by(fill)]
    len: usize,
    #[owned_by(fill)]
    tail: T,
}

#[kvown::owner]
pub fn stamp(p: &mut Packet<[u8]>, seq: u64) {
    p.set_seq(owner, seq);
    p.fields_mut().payload[0] = 1;
}

#[kvown::owner]
pub fn fill(o: &mut Owned<[u8]>) {
    o.tail_mut(owner)[0] = 9;
    let len = o.tail().len();
    o.set_len(owner, len);
}

pub fn sized_tail_setter(o: &mut Owned<[u8; 2]>, cap: &impl OwnedTailOwner) {
    o.set_tail(cap, [5, 6]);
}

#[test]
fn compiles_and_runs() {
    let mut packet = Packet::from(PacketInit {
        seq: 0,
        payload: [0u8; 4],
    });
    let unsized_packet: &mut Packet<[u8]> = &mut packet;
    stamp(unsized_packet, 7);
    assert_eq!(unsized_packet.seq(), 7);
    assert_eq!(packet.into_init().payload, [1, 0, 0, 0]);

    let mut owned = Owned::from(OwnedInit {
        len: 0,
        tail: [0u8; 3],
    });
    fill(&mut owned);
    assert_eq!((owned.len(), owned.tail()), (3, &[9, 0, 0]));
}
