//! Planted bugs for kvown's mutation tests (feature `fault-injection`): each changes which K/V
//! the model reads the way a broken cache manager would, and the differential test must catch
//! it.

use std::collections::HashMap;

use kvown_runtime::batch::{Req, ScheduleBatch};
use kvown_runtime::ids::KvSlot;
use kvown_runtime::slots::ReqToTokenPool;

use crate::forward_batch::ForwardBatch;

/// A bug to plant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// At the first decode step of two or more requests, one entry of the first request's row
    /// names the slot another request's new token goes to.
    CrossRequestSlot,
    /// The first admission that hits the prefix cache extends from one page past the match:
    /// that page's K/V is never computed and its slots are read as they were.
    PrefixSkipsExtraPage,
    /// A retracted request, re-admitted, reads the slots it held before its retraction (freed
    /// then, and handed to other requests since) instead of the ones its re-prefill wrote.
    StaleSlotsAfterRetraction,
}

/// The fault and what it needs to remember.
#[derive(Debug)]
pub(crate) struct FaultState {
    fault: Fault,
    /// Times the fault changed a forward batch.
    pub(crate) fired: u32,
    /// Rows of retracted requests as they were before their retraction.
    before_retraction: HashMap<u64, Vec<KvSlot>>,
}

impl FaultState {
    pub(crate) fn new(fault: Fault) -> FaultState {
        FaultState {
            fault,
            fired: 0,
            before_retraction: HashMap::new(),
        }
    }

    /// Before a retraction: remembers the rows of `reqs` (under the stale-slots fault).
    pub(crate) fn before_retract(&mut self, reqs: &[Req], table: &ReqToTokenPool) {
        if self.fault != Fault::StaleSlotsAfterRetraction {
            return;
        }
        for req in reqs {
            if let Some(row) = req.kv().req_pool_idx().and_then(|row| table.row(row).ok()) {
                let committed = req.kv().kv_committed_len();
                self.before_retraction
                    .insert(req.rid(), row[..committed].to_vec());
            }
        }
    }

    /// On an extend's forward batch.
    pub(crate) fn on_extend(
        &mut self,
        batch: &ScheduleBatch,
        forward: &mut ForwardBatch,
        page_size: usize,
    ) {
        match self.fault {
            Fault::PrefixSkipsExtraPage if self.fired == 0 => {
                // A request's first extend since admission that starts past 0 starts at its
                // prefix-cache match.
                let victim = forward
                    .seqs()
                    .iter()
                    .zip(batch.reqs())
                    .position(|(seq, req)| {
                        req.kv().extend_batch_idx() == 1
                            && seq.start() > 0
                            && seq.extend.len() > page_size
                    });
                if let Some(seq) = victim {
                    forward.drop_leading_tokens(seq, page_size);
                    self.fired += 1;
                }
            }
            Fault::StaleSlotsAfterRetraction => {
                let spans: Vec<_> = forward.seqs().to_vec();
                for span in spans {
                    let Some(old) = self.before_retraction.remove(&span.rid) else {
                        continue;
                    };
                    let context = &mut forward.context_slots_mut()[span.context.clone()];
                    let mut changed = false;
                    for (slot, &stale) in context.iter_mut().zip(&old) {
                        changed |= *slot != stale;
                        *slot = stale;
                    }
                    self.fired += u32::from(changed);
                }
            }
            _ => {}
        }
    }

    /// On a decode step's forward batch.
    pub(crate) fn on_decode(
        &mut self,
        _batch: &ScheduleBatch,
        forward: &mut ForwardBatch,
        _page_size: usize,
    ) {
        if self.fault != Fault::CrossRequestSlot || self.fired > 0 || forward.seqs().len() < 2 {
            return;
        }
        let (victim, donor) = (forward.seqs()[0].clone(), forward.seqs()[1].clone());
        if victim.context.len() < 2 {
            return;
        }
        let foreign = forward.out_cache_loc()[donor.extend.start];
        forward.context_slots_mut()[victim.context.end - 2] = foreign;
        self.fired += 1;
    }
}
