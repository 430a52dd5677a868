//! `--disaggregated`: the prefill node of a prefill/decode pair in one process. The engine is
//! the decode node; each admitted prompt is computed here (this node's own allocator, prefix
//! cache and K/V pool), its K/V moved by a [`LocalTransfer`] into the slots the decode node
//! preallocated for it (`prealloc_for_transfer`), and the request released here, its prompt
//! kept in this node's prefix cache.

use kvown::alloc::PagedAllocator;
use kvown::batch::Req;
use kvown::batch::init_next_round_input;
use kvown::batch::{
    ScheduleBatch, TransferTicket, alloc_for_extend, prepare_for_extend, release_kv_cache,
};
use kvown::cache::KvCache;
use kvown::kv::{KvTransfer, LocalTransfer};
use kvown::radix::TreePos;

use crate::kv_data::{KvStore, extended_tokens};
use crate::scheduler::{check_whole, evict_everything, timed};

/// The prefill node and the link to the decode node's pool.
pub struct PrefillNode {
    cache: KvCache<PagedAllocator>,
    kv: KvStore,
    link: LocalTransfer,
    /// Prompts whose K/V moved to the decode node.
    pub transfers: u64,
}

impl PrefillNode {
    /// A node over `cache`, storing K/V through `kv` (the sender's pool of `link`).
    pub fn new(cache: KvCache<PagedAllocator>, kv: KvStore, link: LocalTransfer) -> Self {
        PrefillNode {
            cache,
            kv,
            link,
            transfers: 0,
        }
    }

    /// Computes the prompts of `reqs` (the decode node's requests) here: matches this node's
    /// prefix cache, extends, stores the K/V of every token it computed. Returns this node's
    /// requests, holding their rows, and the tokens computed; `None` when this node's pool
    /// cannot take them now (nothing is held then). The kvown calls' time goes to `ns`.
    pub fn prefill(
        &mut self,
        reqs: &[Req],
        ns: &mut u64,
    ) -> Result<Option<(Vec<Req>, u64)>, String> {
        let mut remote = Vec::with_capacity(reqs.len());
        for req in reqs {
            let mut here = Req::new_in(req.namespace(), req.rid(), req.fill_ids().to_vec())
                .with_priority(req.priority());
            timed(ns, || {
                init_next_round_input(&mut here, &mut self.cache, usize::MAX)
            })
            .map_err(|e| format!("prefill node, init_next_round_input {}: {e}", req.rid()))?;
            remote.push(here);
        }
        let batch = ScheduleBatch::new(remote);
        let batch = match timed(ns, || {
            alloc_for_extend(prepare_for_extend(batch), &mut self.cache)
        }) {
            Ok(batch) => batch,
            Err(failure) => {
                for mut req in failure.batch.cancel().into_reqs() {
                    if req.last_node() != TreePos::ROOT {
                        timed(ns, || release_kv_cache(&mut req, &mut self.cache, false))
                            .map_err(|e| format!("prefill node, release {}: {e}", req.rid()))?;
                    }
                }
                return Ok(None);
            }
        };
        let stores = extended_tokens(&batch);
        self.kv.store(&stores)?;
        Ok(Some((batch.into_reqs(), stores.len() as u64)))
    }

    /// Moves the K/V of `remote`'s positions that `ticket` preallocated on the decode node,
    /// waits for the transfer, then releases `remote` here (its prompt stays in this node's
    /// prefix cache).
    pub fn send(
        &mut self,
        mut remote: Req,
        ticket: &TransferTicket,
        ns: &mut u64,
    ) -> Result<(), String> {
        let rid = remote.rid();
        let row = remote
            .kv()
            .req_pool_idx()
            .expect("a prefilled request holds a row");
        let src = self
            .cache
            .req_to_token()
            .row(row)
            .map_err(|e| e.to_string())?[ticket.positions()]
        .to_vec();
        let id = self
            .link
            .submit(&src, ticket.destination())
            .map_err(|e| format!("K/V transfer of request {rid}: {e}"))?;
        let mut done = Vec::new();
        while !done.iter().any(|(ended, _)| *ended == id) {
            self.link.poll(&mut done);
        }
        for (_, outcome) in done {
            outcome.map_err(|e| format!("K/V transfer of request {rid}: {e}"))?;
        }
        timed(ns, || release_kv_cache(&mut remote, &mut self.cache, true))
            .map_err(|e| format!("prefill node, release {rid}: {e}"))?;
        self.transfers += 1;
        Ok(())
    }

    /// The invariant checker: between steps this node holds no request.
    pub fn check(&self) -> Result<(), String> {
        self.cache
            .check(std::iter::empty::<&Req>())
            .map_err(|violation| format!("prefill node: {violation}"))
    }

    /// Empties the prefix cache and checks that every slot and row is back.
    pub fn finish(&mut self) -> Result<(), String> {
        self.check()?;
        evict_everything(&mut self.cache).map_err(|e| format!("prefill node: {e}"))?;
        check_whole(&self.cache).map_err(|e| format!("prefill node: {e}"))
    }
}
