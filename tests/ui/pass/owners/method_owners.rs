//! Method owners: `#[owners]` on an inherent impl (generic, too) and `#[owner]` on methods,
//! listed as `Type::method` (also through a module path). Non-owner methods stay in the block;
//! `Self`, `self` and `#[owner(token = cap)]` work as in free owners.

mod batch {
    #[kvown::guarded]
    #[derive(Debug, Default, Clone)]
    pub struct Req {
        #[owned_by(Batch::alloc_for_decode, Batch::retract, super::Pool::reset)]
        pub(crate) len: usize,
    }

    pub struct Batch<T> {
        pub reqs: Vec<Req>,
        pub tag: T,
    }

    #[kvown::owners]
    impl<T: Clone> Batch<T> {
        pub fn new(tag: T) -> Self {
            Self {
                reqs: vec![Req::default(); 2],
                tag,
            }
        }

        #[owner]
        pub fn alloc_for_decode(&mut self) -> T {
            for req in &mut self.reqs {
                *req.len_mut(owner) += 1;
            }
            self.tag.clone()
        }

        #[owner(token = cap)]
        pub fn retract(&mut self, index: usize) -> Req {
            let mut req = self.reqs.remove(index);
            req.set_len(cap, 0);
            req
        }

        pub fn total(&self) -> usize {
            self.reqs.iter().map(Req::len).sum()
        }
    }
}

pub struct Pool;

#[kvown::owners]
impl Pool {
    #[owner]
    fn reset(req: &mut batch::Req) {
        req.set_len(owner, 100);
    }
}

#[test]
fn compiles_and_runs() {
    let mut b = batch::Batch::new("decode");
    assert_eq!(b.alloc_for_decode(), "decode");
    b.alloc_for_decode();
    assert_eq!(b.total(), 4);
    let mut req = b.retract(0);
    assert_eq!((req.len(), b.total()), (0, 2));
    Pool::reset(&mut req);
    assert_eq!(req.len(), 100);
}
