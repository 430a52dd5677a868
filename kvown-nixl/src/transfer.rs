//! [`NixlTransfer`]: kvown's [`KvTransfer`] over NIXL, run by the decode node. Each transfer is
//! a NIXL READ of the prefill node's rows into the slots this node preallocated, one descriptor
//! per run of slots contiguous in both pools, per layer and tensor. Its completion is the READ's
//! own status; the prefill node learns of it from the notice the READ delivers.
//!
//! READ, not WRITE, because the node that owns the destination slots must be the one that
//! decides when nothing more can land in them: after a timeout this node releases its own
//! request (which cancels it) and only then gives the slots back (`cancel_transfer`). With a
//! WRITE, the prefill node would write into the decode node's memory, and the decode node could
//! never be sure a late write would not hit slots it had handed to another request.

use std::ffi::CString;
use std::time::{Duration, Instant};

use kvown_runtime::ids::KvSlot;
use kvown_runtime::kv::{KvTensor, KvTransfer, TransferError, TransferId};

use crate::agent::{Agent, c_name};
use crate::descs::XferList;
use crate::error::NixlError;
use crate::metadata::LoadedPeer;
use crate::notices::notice;
use crate::registered::RegisteredPool;
use crate::request::{Progress, RequestOptions, XferRequest};
use crate::runs::{SlotRun, slot_runs};

/// How long a transfer may take by default before it is cancelled.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// What the transfers of one [`NixlTransfer`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct TransferStats {
    /// Transfers that completed.
    pub completed: u64,
    /// Transfers that failed or timed out.
    pub failed: u64,
    /// Bytes the completed transfers moved.
    pub bytes: u64,
    /// Descriptors posted (one per run, layer and tensor).
    pub descriptors: u64,
    /// Sum over completed transfers of the time from their submit to the poll that saw them
    /// done (descriptor lists, NIXL's request, the data's move, its completion).
    pub busy: Duration,
}

/// One posted transfer.
struct InFlight {
    id: TransferId,
    request: XferRequest,
    /// When it was submitted.
    started: Instant,
    bytes: u64,
}

/// A decode node's link to one prefill node: READs from the peer's registered pool into this
/// node's.
pub struct NixlTransfer {
    agent: Agent,
    local: RegisteredPool,
    peer: LoadedPeer,
    peer_name: CString,
    merge: bool,
    timeout: Duration,
    next_id: u64,
    in_flight: Vec<InFlight>,
    ended: Vec<(TransferId, Result<(), NixlError>)>,
    stats: TransferStats,
}

impl std::fmt::Debug for NixlTransfer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NixlTransfer")
            .field("agent", &self.agent.name())
            .field("peer", &self.peer.agent)
            .field("in_flight", &self.in_flight.len())
            .field("stats", &self.stats)
            .finish()
    }
}

impl NixlTransfer {
    /// A link reading from `peer` (loaded by `agent`) into `local` (registered with `agent`).
    /// Runs of slots are merged and transfers time out after [`DEFAULT_TIMEOUT`].
    pub fn new(agent: &Agent, local: RegisteredPool, peer: LoadedPeer) -> Result<Self, NixlError> {
        local.descriptor().check_compatible(&peer.pool)?;
        if !local.registered_with(agent) {
            return Err(NixlError::PoolMismatch {
                detail: format!("the pool is not registered with agent {:?}", agent.name()),
            });
        }
        let link = NixlTransfer {
            agent: agent.clone(),
            local,
            peer_name: c_name(&peer.agent)?,
            peer,
            merge: true,
            timeout: DEFAULT_TIMEOUT,
            next_id: 0,
            in_flight: Vec::new(),
            ended: Vec::new(),
            stats: TransferStats::default(),
        };
        link.check_peer()?;
        Ok(link)
    }

    /// Cancels a transfer not done `timeout` after it was submitted.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// With `false`, one descriptor per slot (and NIXL told not to merge them): what
    /// transfers cost without runs.
    pub fn with_merged_runs(mut self, merge: bool) -> Self {
        self.merge = merge;
        self
    }

    /// The peer this link reads from.
    pub fn peer(&self) -> &LoadedPeer {
        &self.peer
    }

    /// What the link's transfers did so far.
    pub fn stats(&self) -> TransferStats {
        self.stats
    }

    /// Transfers posted and not yet seen to end.
    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// Descriptors a transfer of these slots posts (runs x layers x 2).
    pub fn descriptors(&self, src: &[KvSlot], dst: &[KvSlot]) -> usize {
        slot_runs(src, dst, self.merge).len() * 2 * self.peer.pool.layers()
    }

    /// Fails unless the agent still has this link's incarnation of the peer loaded.
    fn check_peer(&self) -> Result<(), NixlError> {
        match self.agent.peer_incarnation(&self.peer.agent) {
            Some(current) if current == self.peer.incarnation => Ok(()),
            Some(current) => Err(NixlError::PeerRestarted {
                agent: self.peer.agent.clone(),
                expected: self.peer.incarnation,
                current,
            }),
            None => Err(NixlError::UnknownPeer {
                agent: self.peer.agent.clone(),
            }),
        }
    }

    /// Fails unless every slot is inside its pool.
    fn check_slots(&self, src: &[KvSlot], dst: &[KvSlot]) -> Result<(), NixlError> {
        if src.len() != dst.len() {
            return Err(NixlError::LengthMismatch {
                src: src.len(),
                dst: dst.len(),
            });
        }
        for (side, slots, limit) in [
            ("source", src, self.peer.pool.slots),
            ("destination", dst, self.local.descriptor().slots),
        ] {
            if let Some(&slot) = slots.iter().find(|&&slot| slot as usize >= limit) {
                return Err(NixlError::SlotOutOfRange {
                    side,
                    slot,
                    slots: limit,
                });
            }
        }
        Ok(())
    }

    /// Starts reading the peer's rows of `src` (every layer, K and V) into this node's `dst`,
    /// pairwise; on completion the peer is notified with [`notice`]`(tag)`, or not at all
    /// with `None` (a request read in parts notifies with its last). Empty lists read nothing
    /// and send the notice alone. Refused, with nothing posted, when the lists differ in
    /// length, a slot is past its pool, or the peer is unknown or has restarted.
    pub fn submit_tagged(
        &mut self,
        src: &[KvSlot],
        dst: &[KvSlot],
        tag: Option<u64>,
    ) -> Result<TransferId, NixlError> {
        self.check_slots(src, dst)?;
        self.check_peer()?;
        let started = Instant::now();
        let id = TransferId(self.next_id);
        let runs = slot_runs(src, dst, self.merge);
        let bytes = (src.len() * self.peer.pool.slot_bytes()) as u64;
        let (request, descriptors) = match runs.is_empty() {
            // Nothing to read (the decode node had it all cached): the notice alone.
            true => {
                if let Some(tag) = tag {
                    self.agent.notify(&self.peer_name, &notice(tag))?;
                }
                (None, 0)
            }
            false => {
                let _pool = self.local.lock();
                let (request, descriptors) = self.read_request(&runs, tag)?;
                match request.post()? {
                    Progress::Done => (None, descriptors),
                    Progress::InProgress => (Some(request), descriptors),
                }
            }
        };
        self.next_id += 1;
        self.stats.descriptors += descriptors as u64;
        match request {
            Some(request) => self.in_flight.push(InFlight {
                id,
                request,
                started,
                bytes,
            }),
            None => {
                self.stats.completed += 1;
                self.stats.bytes += bytes;
                self.stats.busy += started.elapsed();
                self.ended.push((id, Ok(())));
            }
        }
        Ok(id)
    }

    /// The READ request of `runs`, with its descriptor count.
    fn read_request(
        &self,
        runs: &[SlotRun],
        tag: Option<u64>,
    ) -> Result<(XferRequest, usize), NixlError> {
        let api = self.agent.inner.api.as_ref();
        let (mut local, mut remote) = (XferList::new(api)?, XferList::new(api)?);
        let (here, there) = (self.local.descriptor(), &self.peer.pool);
        let mut descriptors = 0;
        for tensor in [KvTensor::K, KvTensor::V] {
            let row_bytes = there.row_bytes(tensor) as u64;
            for layer in 0..there.layers() {
                for run in runs {
                    let len = u64::from(run.len) * row_bytes;
                    local.push(here.row_address(layer, tensor, run.dst), len)?;
                    remote.push(there.row_address(layer, tensor, run.src), len)?;
                    descriptors += 1;
                }
            }
        }
        let message = tag.map(notice);
        let options = RequestOptions {
            notify: message.as_ref().map(|m| m.as_slice()),
            skip_merge: !self.merge,
        };
        let request = XferRequest::read(
            &self.agent.inner,
            &local,
            &remote,
            &self.peer_name,
            &options,
        )?;
        Ok((request, descriptors))
    }

    /// Appends the transfers that ended since the last call, each with its outcome: done,
    /// failed ([`NixlError::TransferFailed`]), or past its deadline, in which case its request
    /// is released (cancelled) before it is reported ([`NixlError::TimedOut`]).
    pub fn poll_outcomes(&mut self, done: &mut Vec<(TransferId, Result<(), NixlError>)>) {
        done.append(&mut self.ended);
        if self.in_flight.is_empty() {
            return;
        }
        let _pool = self.local.lock();
        let now = Instant::now();
        let mut index = 0;
        while index < self.in_flight.len() {
            let transfer = &self.in_flight[index];
            let outcome = match transfer.request.status() {
                Ok(Progress::InProgress) if now < transfer.started + self.timeout => {
                    index += 1;
                    continue;
                }
                Ok(Progress::InProgress) => Err(NixlError::TimedOut {
                    transfer: transfer.id,
                    after: self.timeout,
                }),
                Ok(Progress::Done) => Ok(()),
                Err(status) => Err(NixlError::TransferFailed {
                    transfer: transfer.id,
                    status,
                }),
            };
            // Dropping the request releases it (cancelling what may still be in flight).
            let transfer = self.in_flight.swap_remove(index);
            match outcome {
                Ok(()) => {
                    self.stats.completed += 1;
                    self.stats.bytes += transfer.bytes;
                    self.stats.busy += now.saturating_duration_since(transfer.started);
                }
                Err(_) => self.stats.failed += 1,
            }
            done.push((transfer.id, outcome));
        }
    }

    /// Polls until transfer `id` ends and returns its outcome; other transfers' outcomes stay
    /// for the next [`NixlTransfer::poll_outcomes`]. An id neither in flight nor ended (never
    /// returned, or already polled) is answered at once: `TransferFailed` with `NotFound`.
    pub fn wait(&mut self, id: TransferId) -> Result<(), NixlError> {
        loop {
            let mut done = Vec::new();
            self.poll_outcomes(&mut done);
            let mine = done.iter().position(|(ended, _)| *ended == id);
            let outcome = mine.map(|at| done.swap_remove(at).1);
            self.ended.extend(done);
            if let Some(outcome) = outcome {
                return outcome;
            }
            if !self.in_flight.iter().any(|transfer| transfer.id == id) {
                return Err(NixlError::TransferFailed {
                    transfer: id,
                    status: crate::error::NixlStatus::NotFound,
                });
            }
            std::thread::yield_now();
        }
    }
}

impl KvTransfer for NixlTransfer {
    /// [`NixlTransfer::submit_tagged`] with the transfer's own id as its tag.
    fn submit(&mut self, src: &[KvSlot], dst: &[KvSlot]) -> Result<TransferId, TransferError> {
        let tag = self.next_id;
        Ok(self.submit_tagged(src, dst, Some(tag))?)
    }

    fn poll(&mut self, done: &mut Vec<(TransferId, Result<(), TransferError>)>) {
        let mut outcomes = Vec::new();
        self.poll_outcomes(&mut outcomes);
        done.extend(
            outcomes
                .into_iter()
                .map(|(id, outcome)| (id, outcome.map_err(TransferError::from))),
        );
    }
}

/// The runtime's transfer error for a NIXL one: its own variants where they exist, the message
/// otherwise.
impl From<NixlError> for TransferError {
    fn from(error: NixlError) -> TransferError {
        match error {
            NixlError::LengthMismatch { src, dst } => TransferError::LengthMismatch { src, dst },
            NixlError::PoolMismatch { detail } => TransferError::PoolMismatch { detail },
            other => TransferError::Failed(other.to_string()),
        }
    }
}
