//! `--disaggregated`: the engine is the decode node of a prefill/decode pair. Each admitted
//! prompt is computed on a prefill node (its own allocator, prefix cache and K/V pool) by
//! [`PrefillNode`], its K/V moved into the slots the decode node preallocated for it
//! (`prealloc_for_transfer`), checked (a digest of the request's rows on both nodes), and the
//! request released on the prefill node, its prompt kept in that node's prefix cache.
//!
//! Two links ([`PrefillLink`]): `--transfer local` keeps the prefill node in this process and
//! copies rows with a `LocalTransfer` ([`local`]); `--transfer nixl` runs it as a second process
//! ([`process`]) and reads its rows through NIXL ([`nixl`]).

pub mod local;
pub mod nixl;
pub mod process;

use kvown::alloc::{KvSlot, PagedAllocator};
use kvown::batch::Req;
use kvown::batch::init_next_round_input;
use kvown::batch::{
    ScheduleBatch, TransferTicket, alloc_for_extend, prepare_for_extend, release_kv_cache,
};
use kvown::cache::KvCache;
use kvown::radix::{Namespace, TreePos};
use serde::{Deserialize, Serialize};

use crate::kv_data::{KvStore, extended_tokens};
use crate::scheduler::{check_whole, evict_everything, timed};

/// A prompt for the prefill node: the decode node's request as the prefill node recomputes it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Prompt {
    /// Request id.
    pub rid: u64,
    /// Its adapter (prefix-cache namespace).
    pub namespace: u32,
    /// Its priority.
    pub priority: i32,
    /// Its tokens.
    pub tokens: Vec<u32>,
    /// The tag of its transfer, unique per admission (a retracted request comes again).
    pub tag: u64,
}

/// The prefill node's computation: its cache and K/V store, with no link.
pub struct PrefillNode {
    cache: KvCache<PagedAllocator>,
    kv: KvStore,
}

impl PrefillNode {
    /// A node over `cache`, storing K/V through `kv`.
    pub fn new(cache: KvCache<PagedAllocator>, kv: KvStore) -> Self {
        PrefillNode { cache, kv }
    }

    /// Computes `prompts`: matches this node's prefix cache, extends, stores the K/V of every
    /// token it computed. Returns the requests, holding their rows, and the tokens computed;
    /// `None` when this node's pool cannot take them now (nothing is held then). The kvown
    /// calls' time goes to `ns`.
    pub fn prefill(
        &mut self,
        prompts: &[Prompt],
        ns: &mut u64,
    ) -> Result<Option<(Vec<Req>, u64)>, String> {
        let mut here = Vec::with_capacity(prompts.len());
        for prompt in prompts {
            let mut req = Req::new_in(
                Namespace(prompt.namespace),
                prompt.rid,
                prompt.tokens.clone(),
            )
            .with_priority(prompt.priority);
            timed(ns, || {
                init_next_round_input(&mut req, &mut self.cache, usize::MAX)
            })
            .map_err(|e| format!("prefill node, init_next_round_input {}: {e}", prompt.rid))?;
            here.push(req);
        }
        let batch = ScheduleBatch::new(here);
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

    /// The slots of a computed request's positions and the digest of their K/V.
    pub fn source(&self, req: &Req) -> Result<(Vec<KvSlot>, u64), String> {
        let row = req
            .kv()
            .req_pool_idx()
            .expect("a prefilled request holds a row");
        let slots = self
            .cache
            .req_to_token()
            .row(row)
            .map_err(|e| e.to_string())?[..req.fill_ids().len()]
            .to_vec();
        let digest = self.kv.digest(&slots)?;
        Ok((slots, digest))
    }

    /// Releases a request whose K/V moved (or will not): its prompt stays in the prefix cache.
    pub fn release(&mut self, mut req: Req, ns: &mut u64) -> Result<(), String> {
        let rid = req.rid();
        timed(ns, || release_kv_cache(&mut req, &mut self.cache, true))
            .map_err(|e| format!("prefill node, release {rid}: {e}"))
    }

    /// The invariant checker, `held` the requests whose K/V waits to be read.
    pub fn check<'a>(&self, held: impl IntoIterator<Item = &'a Req>) -> Result<(), String> {
        self.cache
            .check(held)
            .map_err(|violation| format!("prefill node: {violation}"))
    }

    /// Empties the prefix cache and checks that every slot and row is back.
    pub fn finish(&mut self) -> Result<(), String> {
        self.check([])?;
        evict_everything(&mut self.cache).map_err(|e| format!("prefill node: {e}"))?;
        check_whole(&self.cache).map_err(|e| format!("prefill node: {e}"))
    }
}

/// A computed prompt as the decode node sees it: where its K/V is on the prefill node.
pub struct Computed {
    /// Prefill-node slots of positions `0..prompt`.
    pub slots: Vec<KvSlot>,
    /// Digest of their K/V there.
    pub digest: u64,
    /// What the link needs to let it go.
    source: Source,
}

/// Who holds a computed request on the prefill node.
enum Source {
    /// The in-process prefill node's request.
    Here(Req),
    /// The prefill process holds it under this transfer tag.
    Process {
        /// The tag.
        tag: u64,
    },
}

/// What the transfers of a run did, for the summary.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct TransferReport {
    /// `local` (one process) or `nixl` (two processes).
    pub link: &'static str,
    /// Prompts whose K/V moved, each checked by digest on both nodes (a mismatch fails the
    /// run).
    pub transfers: u64,
    /// Bytes moved.
    pub bytes: u64,
    /// Descriptors posted (`nixl` only: one per run of contiguous slots, layer and tensor).
    pub descriptors: Option<u64>,
    /// Seconds from posting each transfer to seeing it done, summed.
    pub seconds: f64,
    /// `bytes` over `seconds`, in GB/s.
    pub gigabytes_per_second: f64,
    /// `seconds` per transfer, in microseconds.
    pub microseconds_per_transfer: f64,
}

impl TransferReport {
    /// No transfer yet, over `link`.
    fn new(link: &'static str) -> Self {
        TransferReport {
            link,
            transfers: 0,
            bytes: 0,
            descriptors: (link == "nixl").then_some(0),
            seconds: 0.0,
            gigabytes_per_second: 0.0,
            microseconds_per_transfer: 0.0,
        }
    }

    /// Counts one transfer of `bytes` that took `seconds`, after checking the decode node's
    /// digest (`here`) against the prefill node's.
    fn record(&mut self, bytes: u64, seconds: f64, here: u64, there: u64) -> Result<(), String> {
        if here != there {
            return Err(format!(
                "transfer {}: the decode node's K/V digest {here:#x} differs from the prefill \
                 node's {there:#x}",
                self.transfers
            ));
        }
        self.transfers += 1;
        self.bytes += bytes;
        self.seconds += seconds;
        self.gigabytes_per_second = self.bytes as f64 / self.seconds.max(f64::MIN_POSITIVE) / 1e9;
        self.microseconds_per_transfer = self.seconds * 1e6 / self.transfers as f64;
        Ok(())
    }
}

impl std::fmt::Display for TransferReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let how = match self.link {
            "nixl" => "prefill process -> decode node, NIXL READ",
            _ => "prefill node -> decode node in this process",
        };
        write!(
            f,
            "{} ({how}): {:.1} MiB",
            self.transfers,
            self.bytes as f64 / (1 << 20) as f64
        )?;
        if let Some(descriptors) = self.descriptors {
            write!(f, " in {descriptors} descriptors")?;
        }
        write!(
            f,
            ", {:.2} GB/s, {:.1} us per transfer; every K/V digest matched",
            self.gigabytes_per_second, self.microseconds_per_transfer
        )
    }
}

/// The decode node's link to its prefill node.
pub enum PrefillLink {
    /// `--transfer local`.
    Local(Box<local::LocalLink>),
    /// `--transfer nixl`.
    Nixl(Box<nixl::NixlLink>),
}

impl PrefillLink {
    /// Computes the prompts of `reqs` (the decode node's requests) on the prefill node; `None`
    /// when it cannot take them now.
    pub fn prefill(
        &mut self,
        reqs: &[Req],
        ns: &mut u64,
    ) -> Result<Option<(Vec<Computed>, u64)>, String> {
        match self {
            PrefillLink::Local(link) => link.prefill(reqs, ns),
            PrefillLink::Nixl(link) => link.prefill(reqs),
        }
    }

    /// Moves `computed`'s K/V of the positions `ticket` preallocated into the ticket's slots,
    /// waits for it, and checks the digest of the decode node's rows `decode_slots` (positions
    /// `0..prompt`, read through `decode`) against the prefill node's.
    pub fn send(
        &mut self,
        computed: Computed,
        ticket: &TransferTicket,
        decode: (&KvStore, &[KvSlot]),
        ns: &mut u64,
    ) -> Result<(), String> {
        match self {
            PrefillLink::Local(link) => link.send(computed, ticket, decode, ns),
            PrefillLink::Nixl(link) => link.send(computed, ticket, decode),
        }
    }

    /// The prefill node's invariant checker.
    pub fn check(&mut self) -> Result<(), String> {
        match self {
            PrefillLink::Local(link) => link.check(),
            PrefillLink::Nixl(link) => link.check(),
        }
    }

    /// Ends the prefill node: every slot and row must come back.
    pub fn finish(&mut self) -> Result<(), String> {
        match self {
            PrefillLink::Local(link) => link.finish(),
            PrefillLink::Nixl(link) => link.finish(),
        }
    }

    /// What the transfers did.
    pub fn report(&self) -> TransferReport {
        match self {
            PrefillLink::Local(link) => link.report(),
            PrefillLink::Nixl(link) => link.report(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::TransferReport;

    #[test]
    fn a_transfer_whose_digests_differ_fails_and_is_not_counted() {
        let mut report = TransferReport::new("local");
        report.record(1024, 0.5, 7, 7).unwrap();
        let error = report.record(2048, 0.5, 7, 8).unwrap_err();
        assert!(error.contains("differs from the prefill node's"), "{error}");
        assert_eq!((report.transfers, report.bytes), (1, 1024));
    }
}
