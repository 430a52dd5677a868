//! `#[derive(Debug, Clone, PartialEq, Default)]` keep working. Construction goes through the
//! generated init struct (`ReqInit`, renamed with `init = ..`), which mirrors `Debug`, `Clone`
//! and `Default`, so `..Default::default()` works; `into_init` (asked for with
//! `#[guarded(into_init)]`) takes a value apart again.

#[kvown::guarded(into_init)]
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Req {
    #[owned_by(alloc)]
    len: usize,
    #[owned_by(alloc)]
    pages: Vec<u32>,
    rid: u64,
}

#[kvown::guarded(init = PartsOfSlot, into_init)]
#[derive(Debug, Default)]
pub struct Slot {
    #[owned_by(alloc)]
    index: u32,
}

#[kvown::owner]
pub fn alloc(req: &mut Req, slot: &mut Slot) {
    req.set_len(owner, 3);
    req.pages_mut(owner).push(slot.index());
    slot.set_index(owner, slot.index() + 1);
}

#[test]
fn compiles_and_runs() {
    let mut req = Req::from(ReqInit {
        rid: 9,
        ..Default::default()
    });
    let mut slot = Slot::from(PartsOfSlot { index: 4 });
    alloc(&mut req, &mut slot);
    let twin = req.clone();
    assert_eq!(twin, req);
    assert!(Req::default() < req);
    assert_eq!(format!("{req:?}"), "Req { len: 3, pages: [4], rid: 9 }");
    let init = req.into_init();
    assert_eq!(
        format!("{init:?}"),
        "ReqInit { len: 3, pages: [4], rid: 9 }"
    );
    assert_eq!(init.clone().pages, vec![4]);
    assert_eq!(slot.index(), 5);
    let _: PartsOfSlot = slot.into_init();
}
