//! Disaggregated serving: a prefill node (its own allocator, prefix cache and pool) computes
//! each admitted prompt, this node preallocates the request's row and slots
//! (`prealloc_for_transfer`), the K/V moves through kvown's `KvTransfer` (a `LocalTransfer`
//! between the two pools by default, any other link through [`Server::with_transfer`]), its
//! digest is checked on both nodes, and the request is committed and decoded here.

use std::ops::Range;

use kvown_runtime::batch::{
    Req, ScheduleBatch, alloc_for_extend, cancel_transfer, commit_transfer, init_next_round_input,
    prealloc_for_transfer, prepare_for_extend, release_kv_cache,
};
use kvown_runtime::kv::{KvTransfer, LocalTransfer, TransferError, digest};

use super::{Node, ServeConfig, Server, StepOutput, timed};
use crate::error::{ModelError, ServeError};
use crate::forward_batch::ForwardBatch;
use crate::model::PagedLlama;
use crate::pool::TensorKvPool;

/// The link a disaggregated server moves K/V through, made from handles on the prefill node's
/// pool (the source) and this node's (the destination). It must end every transfer it accepts
/// (with an outcome from `poll`): the server polls until it does.
pub type TransferLink = Box<dyn KvTransfer + Send>;

/// The default link: a `LocalTransfer` copying between the two pools.
pub(super) fn local_link(
    prefill: TensorKvPool,
    decode: TensorKvPool,
) -> Result<TransferLink, TransferError> {
    Ok(Box::new(LocalTransfer::new(
        Box::new(prefill),
        Box::new(decode),
    )?))
}

/// The prefill node and its link to the decode node's pool.
pub(super) struct PrefillNode {
    pub(super) node: Node,
    link: TransferLink,
}

impl std::fmt::Debug for PrefillNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PrefillNode")
            .field("node", &self.node)
            .finish_non_exhaustive()
    }
}

impl PrefillNode {
    /// A prefill node with twice the decode node's slots, linked to `decode_pool` by `link`.
    pub(super) fn new(
        model: &PagedLlama,
        config: &ServeConfig,
        decode_pool: &TensorKvPool,
        link: impl FnOnce(TensorKvPool, TensorKvPool) -> Result<TransferLink, TransferError>,
    ) -> Result<PrefillNode, ServeError> {
        let node = Node::new(model, config, 2 * config.pool_tokens, config.max_running)?;
        let link = link(node.pool.share(), decode_pool.share())?;
        Ok(PrefillNode { node, link })
    }

    /// This node's slots of `positions` of `remote`.
    fn source_slots(&self, remote: &Req, positions: Range<usize>) -> Result<Vec<u32>, ServeError> {
        let row = remote.held_row()?;
        let slots = self
            .node
            .cache
            .req_to_token()
            .row(row)
            .map_err(|error| ServeError::Kv(error.into()))?;
        Ok(slots[positions].to_vec())
    }

    /// Moves the K/V of `src` (this node's slots) to `dst` (the decode node's) and polls until
    /// the transfer ends.
    fn send(&mut self, src: &[u32], dst: &[u32]) -> Result<(), ServeError> {
        let id = self.link.submit(src, dst)?;
        let mut done = Vec::new();
        loop {
            self.link.poll(&mut done);
            if let Some(index) = done.iter().position(|(ended, _)| *ended == id) {
                let (_, outcome) = done.swap_remove(index);
                return Ok(outcome?);
            }
            std::thread::yield_now();
        }
    }

    /// Checks that the decode node's rows `dst` of `decode` hash as this node's `src`.
    fn check_digest(
        &self,
        rid: u64,
        src: &[u32],
        dst: &[u32],
        decode: &TensorKvPool,
    ) -> Result<(), ServeError> {
        let (sent, received) = (digest(&self.node.pool, src)?, digest(decode, dst)?);
        if sent != received {
            return Err(ServeError::TransferCorrupt {
                rid,
                tokens: src.len(),
                sent,
                received,
            });
        }
        Ok(())
    }
}

impl Server {
    /// Computes the admitted prompts on the prefill node, samples each request's next token
    /// there, and moves their K/V into slots this node preallocates; they then run here.
    pub(super) fn extend_remotely(
        &mut self,
        admitted: Vec<Req>,
        out: &mut StepOutput,
    ) -> Result<(), ServeError> {
        let mut prefill = self.prefill.take().expect("a disaggregated server");
        let result = self.prefill_and_send(&mut prefill, admitted, out);
        self.prefill = Some(prefill);
        result?;
        self.release_finished(out)
    }

    fn prefill_and_send(
        &mut self,
        prefill: &mut PrefillNode,
        admitted: Vec<Req>,
        out: &mut StepOutput,
    ) -> Result<(), ServeError> {
        let mut ns = 0;
        let cache = &mut prefill.node.cache;
        let (batch, forward) = timed(&mut ns, || -> Result<_, ServeError> {
            let mut remote = Vec::with_capacity(admitted.len());
            for req in &admitted {
                let mut here = Req::try_new(req.rid(), req.fill_ids().to_vec())?;
                init_next_round_input(&mut here, cache, usize::MAX)?;
                remote.push(here);
            }
            // Admission kept the prompts within this node's pool, which holds no request
            // between steps: the allocation evicts what it needs.
            let batch = alloc_for_extend(prepare_for_extend(ScheduleBatch::new(remote)), cache)
                .map_err(|failure| failure.error)?;
            let forward = ForwardBatch::from_allocation(&batch, cache.req_to_token())
                .map_err(ModelError::from)?;
            Ok((batch, forward))
        })?;
        self.stats.prefill_tokens += forward.tokens().len() as u64;
        let logits = timed(&mut self.stats.model_ns, || {
            self.model.forward(&forward, &mut prefill.node.pool)
        })?;
        // After a failure the rest of the batch is not moved (the error stops the server), but
        // every request's slots on the prefill node are still given back.
        let mut failed = None;
        for (index, (mut req, mut remote)) in
            admitted.into_iter().zip(batch.into_reqs()).enumerate()
        {
            if failed.is_none() {
                let position = req.fill_ids().len() - 1;
                let token = self.sample(&req, position, logits.last(index), out);
                req.push_output(token);
                failed = self.receive(prefill, req, &remote, &mut ns).err();
            }
            timed(&mut ns, || {
                release_kv_cache(&mut remote, &mut prefill.node.cache, true)
            })?;
        }
        self.stats.kvown_ns += ns;
        failed.map_or(Ok(()), Err)
    }

    /// Preallocates `req` here, moves the K/V of the positions this node lacks from `remote`'s
    /// slots on the prefill node, checks it and commits the request into the running batch. A
    /// failed or corrupt transfer cancels the preallocation: nothing of `req` stays here.
    fn receive(
        &mut self,
        prefill: &mut PrefillNode,
        req: Req,
        remote: &Req,
        ns: &mut u64,
    ) -> Result<(), ServeError> {
        let rid = req.rid();
        let ticket = timed(ns, || prealloc_for_transfer(req, &mut self.node.cache))
            .map_err(|failure| failure.error)?;
        let moved = prefill
            .source_slots(remote, ticket.positions())
            .and_then(|src| {
                let dst = ticket.destination();
                timed(&mut self.stats.transfer_ns, || prefill.send(&src, dst))?;
                prefill.check_digest(rid, &src, dst, &self.node.pool)?;
                Ok(src.len())
            });
        match moved {
            Ok(tokens) => {
                let req = timed(ns, || commit_transfer(ticket));
                self.stats.transfers += 1;
                self.stats.transferred_tokens += tokens as u64;
                self.running.extend_reqs([req]);
                Ok(())
            }
            Err(error) => {
                timed(ns, || cancel_transfer(ticket, &mut self.node.cache))
                    .map_err(|failure| failure.error)?;
                Err(error)
            }
        }
    }
}
