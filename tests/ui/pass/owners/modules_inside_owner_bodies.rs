//! A module declared inside an owner's body keeps its meaning when the owner is sealed one
//! module deeper: `pub(super)` and `super::` paths that reach the owner's module are re-rooted,
//! `self::` paths and paths between the nested modules are not; `self::super::` is `super::`.

mod app {
    #[kvown::guarded]
    #[derive(Default)]
    pub struct Req {
        #[owned_by(alloc)]
        len: usize,
    }

    fn base() -> usize {
        1
    }

    #[kvown::owner]
    pub fn alloc(req: &mut Req) {
        mod helpers {
            pub(super) fn two() -> usize {
                super::base() + self::inner::one()
            }

            mod inner {
                use super::super::base as outer_base;

                pub(super) fn one() -> usize {
                    super::super::base() + outer_base() - 1
                }
            }

            pub(in super::super) fn three() -> usize {
                two() + 1
            }

            pub(in self::super) fn four() -> usize {
                use self::super::base;
                self::super::base() + base() + self::three() + 1
            }
        }
        use helpers::two;
        req.set_len(owner, two() + helpers::three() + helpers::four());
    }
}

use app::{Req, alloc};

#[test]
fn compiles_and_runs() {
    let mut req = Req::default();
    alloc(&mut req);
    assert_eq!(req.len(), 11);
}
