//! `--transfer local`: the prefill node in this process, its K/V copied into the decode node's
//! pool by a [`LocalTransfer`].

use std::time::Instant;

use kvown::alloc::KvSlot;
use kvown::batch::{Req, TransferTicket};
use kvown::kv::{KvPool, KvTransfer, LocalTransfer, SharedPool, new_host_pool};

use super::{Computed, PrefillNode, Prompt, Source, TransferReport};
use crate::cli::Args;
use crate::kv_data::{self, KvStore};
use crate::workload::Job;

/// The in-process prefill node and the link into the decode node's pool.
pub struct LocalLink {
    node: PrefillNode,
    link: LocalTransfer,
    report: TransferReport,
}

/// A prefill node on the host, of the decode node's geometry, whose K/V a `LocalTransfer`
/// moves into `decode_pool`; returns the decode node's handle on that pool and the link.
pub fn pair(
    args: &Args,
    jobs: &[Job],
    decode_pool: Box<dyn KvPool>,
) -> Result<(Box<dyn KvPool>, LocalLink), String> {
    let (allocator, table, tree) = crate::host_bookkeeping(args, jobs)?;
    let cache = crate::new_cache(args, allocator, table, tree, ())?;
    let layout = *decode_pool.layout();
    let prefill_pool = new_host_pool(layout, kv_data::DTYPE)
        .map_err(|e| format!("the prefill node's KV pool: {e}"))?;
    let (decode, prefill) = (SharedPool::new(decode_pool), SharedPool::new(prefill_pool));
    let link = LocalTransfer::new(Box::new(prefill.clone()), Box::new(decode.clone()))
        .map_err(|e| e.to_string())?;
    let node = PrefillNode::new(cache, KvStore::new(Box::new(prefill)));
    let report = TransferReport::new("local");
    Ok((Box::new(decode), LocalLink { node, link, report }))
}

impl LocalLink {
    /// [`PrefillNode::prefill`] of the requests' prompts.
    pub fn prefill(
        &mut self,
        reqs: &[Req],
        ns: &mut u64,
    ) -> Result<Option<(Vec<Computed>, u64)>, String> {
        let prompts: Vec<Prompt> = reqs
            .iter()
            .map(|req| Prompt {
                rid: req.rid(),
                namespace: req.namespace().0,
                priority: req.priority(),
                tokens: req.fill_ids().to_vec(),
                tag: req.rid(),
            })
            .collect();
        let Some((held, tokens)) = self.node.prefill(&prompts, ns)? else {
            return Ok(None);
        };
        let computed = held
            .into_iter()
            .map(|req| {
                let (slots, digest) = self.node.source(&req)?;
                Ok(Computed {
                    slots,
                    digest,
                    source: Source::Here(req),
                })
            })
            .collect::<Result<_, String>>()?;
        Ok(Some((computed, tokens)))
    }

    /// Copies the rows, checks the digest and releases the prefill node's request.
    pub fn send(
        &mut self,
        computed: Computed,
        ticket: &TransferTicket,
        (decode, decode_slots): (&KvStore, &[KvSlot]),
        ns: &mut u64,
    ) -> Result<(), String> {
        let Source::Here(req) = computed.source else {
            unreachable!("a local link computes its requests here");
        };
        let rid = req.rid();
        let src = &computed.slots[ticket.positions()];
        let start = Instant::now();
        let id = self
            .link
            .submit(src, ticket.destination())
            .map_err(|e| format!("K/V transfer of request {rid}: {e}"))?;
        let mut done = Vec::new();
        while !done.iter().any(|(ended, _)| *ended == id) {
            self.link.poll(&mut done);
        }
        for (_, outcome) in done {
            outcome.map_err(|e| format!("K/V transfer of request {rid}: {e}"))?;
        }
        let seconds = start.elapsed().as_secs_f64();
        let bytes = (src.len() * kv_data::SLOT_BYTES) as u64;
        let here = decode.digest(decode_slots)?;
        self.report.record(bytes, seconds, here, computed.digest)?;
        self.node.release(req, ns)
    }

    /// The prefill node's checker: between steps it holds no request.
    pub fn check(&mut self) -> Result<(), String> {
        self.node.check([])
    }

    /// [`PrefillNode::finish`].
    pub fn finish(&mut self) -> Result<(), String> {
        self.node.finish()
    }

    /// What the transfers did.
    pub fn report(&self) -> TransferReport {
        self.report
    }
}
