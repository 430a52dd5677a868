//! A sealed struct keeps the reach it was written with: `pub(crate)` / private structs, `pub` and
//! private plain fields, the init struct nameable where a literal was legal (the module and its
//! children), getters readable wherever the struct is.

mod kv {
    #[kvown::guarded]
    #[derive(Debug)]
    pub(crate) struct Entry {
        #[owned_by(commit)]
        len: usize,
        pub(crate) tag: &'static str,
        secret: u8,
    }

    #[kvown::owner]
    pub(crate) fn commit(entry: &mut Entry) {
        *entry.len_mut(owner) += 1;
    }

    pub(crate) fn make() -> Entry {
        Entry::from(EntryInit {
            len: 0,
            tag: "t",
            secret: 1,
        })
    }

    pub(crate) fn secret(entry: &Entry) -> u8 {
        entry.secret
    }

    pub(crate) mod child {
        pub(crate) fn make() -> super::Entry {
            super::Entry::from(super::EntryInit {
                len: 5,
                tag: "c",
                secret: 2,
            })
        }
    }
}

#[kvown::guarded]
struct Private {
    #[owned_by(touch)]
    n: u8,
}

#[kvown::owner]
fn touch(p: &mut Private) {
    p.set_n(owner, 1);
}

#[test]
fn compiles_and_runs() {
    let mut entry = kv::make();
    kv::commit(&mut entry);
    entry.tag = "changed";
    assert_eq!(
        (entry.len(), entry.tag, kv::secret(&entry)),
        (1, "changed", 1)
    );
    assert_eq!(kv::child::make().len(), 5);
    let mut p = Private::from(PrivateInit { n: 0 });
    touch(&mut p);
    assert_eq!(p.n(), 1);
}
