//! Owners in nested modules keep their meaning after being sealed: `super::` and `self::` paths,
//! private items and private imports of their module, `macro_rules!` defined before them, and
//! owner paths written relative (`self::`, `super::`), absolute (`crate::`) or plain.

pub mod req {
    #[kvown::guarded]
    #[derive(Default)]
    pub struct Req {
        #[owned_by(
            super::sched::alloc,
            crate::pass::owners::super_paths_and_private_items::sched::retract,
            self::local_reset
        )]
        pub(super) len: usize,
    }

    #[kvown::owner]
    pub(crate) fn local_reset(req: &mut Req) {
        req.set_len(owner, 0);
    }
}

pub mod sched {
    use std::collections::BTreeMap as Map;

    use super::req::Req;

    const PAGE: usize = 16;

    fn pages(len: usize) -> usize {
        len.div_ceil(PAGE)
    }

    macro_rules! twice {
        ($e:expr) => {
            $e * 2
        };
    }

    pub struct Stats {
        pub(super) allocs: usize,
    }

    #[kvown::owner]
    pub fn alloc(req: &mut Req, stats: &mut Stats, len: usize) -> usize {
        let mut seen: Map<usize, usize> = Map::new();
        seen.insert(len, pages(len));
        stats.allocs += 1;
        req.set_len(owner, twice!(len));
        self::pages(req.len()) + super::sched::pages(0) + seen.len() - 1
    }

    #[kvown::owner]
    pub(crate) fn retract(req: &mut Req) {
        *req.len_mut(owner) -= PAGE;
    }
}

#[test]
fn compiles_and_runs() {
    let mut req = req::Req::default();
    let mut stats = sched::Stats { allocs: 0 };
    assert_eq!(sched::alloc(&mut req, &mut stats, 20), 3);
    assert_eq!((req.len(), stats.allocs), (40, 1));
    sched::retract(&mut req);
    assert_eq!(req.len(), 24);
    req::local_reset(&mut req);
    assert_eq!(req.len(), 0);
}
