//! A downstream crate that renames its `kvown` dependency to `ownership`: `::kvown` does not
//! exist here, so every attribute passes `crate = ownership`.
#![forbid(unsafe_code)]

/// A request whose committed length only `alloc_for_decode` and `Batch::extend` write.
#[ownership::guarded(crate = ownership)]
#[derive(Debug, Default)]
pub struct ReqKvInfo {
    #[owned_by(alloc_for_decode, Batch::extend)]
    kv_committed_len: usize,
}

/// Commits one decode token.
#[ownership::owner(crate = ownership)]
pub fn alloc_for_decode(req: &mut ReqKvInfo) {
    *req.kv_committed_len_mut(owner) += 1;
}

/// A batch of requests.
#[derive(Default)]
pub struct Batch {
    /// The requests.
    pub reqs: Vec<ReqKvInfo>,
}

#[ownership::owners(crate = ownership)]
impl Batch {
    /// Extends every request by `len` tokens.
    #[owner]
    pub fn extend(&mut self, len: usize) {
        for req in &mut self.reqs {
            req.set_kv_committed_len(owner, req.kv_committed_len() + len);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owners_write_through_the_renamed_crate() {
        let mut batch = Batch {
            reqs: vec![ReqKvInfo::default()],
        };
        batch.extend(2);
        alloc_for_decode(&mut batch.reqs[0]);
        assert_eq!(batch.reqs[0].kv_committed_len(), 3);
        ownership::audit_table!().unwrap().assert_matches(&[
            ("ReqKvInfo", "kv_committed_len", "alloc_for_decode", 1),
            ("ReqKvInfo", "kv_committed_len", "Batch::extend", 1),
        ]);
    }
}
