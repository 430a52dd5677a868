//! [`NixlLoopback`]: kvown's [`KvTransfer`] between two pools of one process through two NIXL
//! agents, the NIXL twin of kvown's `LocalTransfer`. It serves a model whose pools are not host
//! memory kvown can register (candle tensors, say): each side stages its rows through a
//! [`RegisteredPool`] of the same layout.
//!
//! A transfer is: the source pool's rows copied into the prefill agent's registered pool (the
//! stage-out, a `LocalTransfer`), a [`NixlTransfer`] READ by the decode agent into its own
//! registered pool, the READ's notice taken by the prefill agent ([`Holds`]: the source may let
//! its rows go), then the rows copied into the destination pool (the stage-in). It ends when
//! the READ is done and its notice has arrived; a failed or timed-out READ, or a notice that
//! never comes, ends it in an error with the destination pool untouched.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use kvown_runtime::ids::KvSlot;
use kvown_runtime::kv::{KvPool, KvTransfer, LocalTransfer, TransferError, TransferId};

use crate::agent::{Agent, AgentOptions};
use crate::error::NixlError;
use crate::metadata::PeerMetadata;
use crate::notices::{Holds, Released};
use crate::registered::RegisteredPool;
use crate::transfer::{DEFAULT_TIMEOUT, NixlTransfer, TransferStats};

/// What a [`NixlLoopback`]'s transfers did so far.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LoopbackStats {
    /// The READs: completed, failed, bytes, descriptors, time.
    pub link: TransferStats,
    /// Notices the prefill agent took (one per completed READ).
    pub notices: u64,
    /// Time spent copying rows into and out of the registered pools.
    pub staging: Duration,
    /// Bytes copied into and out of the registered pools (twice the bytes read).
    pub staged_bytes: u64,
}

/// A live view of a [`NixlLoopback`]'s [`LoopbackStats`], for a caller that handed the
/// transfer itself to a server (as a `Box<dyn KvTransfer>`).
#[derive(Debug, Clone, Default)]
pub struct LoopbackCounters(Arc<Mutex<LoopbackStats>>);

impl LoopbackCounters {
    /// The stats as of the transfer's last call.
    pub fn get(&self) -> LoopbackStats {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Changes the stats in place.
    fn update(&self, change: impl FnOnce(&mut LoopbackStats)) {
        change(&mut self.0.lock().unwrap_or_else(PoisonError::into_inner));
    }
}

/// A READ posted and not yet ended.
struct Pending {
    id: TransferId,
    /// The notice's tag.
    tag: u64,
    /// The destination slots, staged in once the transfer ends.
    dst: Vec<KvSlot>,
    read: bool,
    noticed: bool,
}

/// Two NIXL agents in one process moving K/V from a prefill pool to a decode pool, each staged
/// through a registered host pool of its layout (which doubles each pool's memory, and adds a
/// copy of the request's rows on each side to every transfer).
pub struct NixlLoopback {
    prefill_agent: Agent,
    stage_out: LocalTransfer,
    link: NixlTransfer,
    stage_in: LocalTransfer,
    holds: Holds<TransferId>,
    next_tag: u64,
    pending: Vec<Pending>,
    ended: Vec<(TransferId, Result<(), TransferError>)>,
    /// The stats, shared with every [`LoopbackCounters`] handed out.
    counters: LoopbackCounters,
}

impl std::fmt::Debug for NixlLoopback {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NixlLoopback")
            .field("prefill_agent", &self.prefill_agent.name())
            .field("link", &self.link)
            .field("pending", &self.pending.len())
            .finish()
    }
}

/// A pool mismatch as NIXL's error (the runtime found it).
fn mismatch(error: TransferError) -> NixlError {
    NixlError::PoolMismatch {
        detail: error.to_string(),
    }
}

impl NixlLoopback {
    /// Links `prefill` (the source) to `decode` (the destination) through agents
    /// `{name}-prefill` and `{name}-decode` made with `options`, each registering a host pool
    /// of its side's layout; the prefill agent's metadata reaches the decode agent as the bytes
    /// a control channel would carry. READs merge slot runs and time out after
    /// [`DEFAULT_TIMEOUT`].
    ///
    /// # Errors
    /// [`NixlError::Unavailable`] without NIXL; [`NixlError::PoolMismatch`] when the pools hold
    /// different rows; any refusal of NIXL's while the agents are set up (nothing stays
    /// registered then).
    pub fn new(
        prefill: Box<dyn KvPool>,
        decode: Box<dyn KvPool>,
        name: &str,
        options: &AgentOptions,
    ) -> Result<NixlLoopback, NixlError> {
        let prefill_agent = Agent::with_options(&format!("{name}-prefill"), options)?;
        let decode_agent = Agent::with_options(&format!("{name}-decode"), options)?;
        let source = RegisteredPool::new(&prefill_agent, *prefill.layout(), prefill.dtype())?;
        let destination = RegisteredPool::new(&decode_agent, *decode.layout(), decode.dtype())?;
        let bytes = prefill_agent.metadata(source.descriptor())?.to_bytes();
        let peer = decode_agent.load_peer(&PeerMetadata::from_bytes(&bytes)?)?;
        let link = NixlTransfer::new(&decode_agent, destination.clone(), peer)?;
        let stage_out = LocalTransfer::new(prefill, Box::new(source)).map_err(mismatch)?;
        let stage_in = LocalTransfer::new(Box::new(destination), decode).map_err(mismatch)?;
        Ok(NixlLoopback {
            prefill_agent,
            stage_out,
            link,
            stage_in,
            holds: Holds::new(DEFAULT_TIMEOUT),
            next_tag: 0,
            pending: Vec::new(),
            ended: Vec::new(),
            counters: LoopbackCounters::default(),
        })
    }

    /// Ends a READ (and waits for its notice) at most `timeout` after it was submitted.
    pub fn with_timeout(mut self, timeout: Duration) -> NixlLoopback {
        self.link = self.link.with_timeout(timeout);
        self.holds = Holds::new(timeout);
        self
    }

    /// With `false`, one descriptor per slot ([`NixlTransfer::with_merged_runs`]).
    pub fn with_merged_runs(mut self, merge: bool) -> NixlLoopback {
        self.link = self.link.with_merged_runs(merge);
        self
    }

    /// What the transfers did so far.
    pub fn stats(&self) -> LoopbackStats {
        self.counters.get()
    }

    /// A live view of [`NixlLoopback::stats`] that outlives handing the transfer away.
    pub fn counters(&self) -> LoopbackCounters {
        self.counters.clone()
    }

    /// Copies rows `src` to `dst` through `stage` (one of the two staging copies), timed.
    fn stage(&mut self, out: bool, src: &[KvSlot], dst: &[KvSlot]) -> Result<(), TransferError> {
        let started = Instant::now();
        let stage = match out {
            true => &mut self.stage_out,
            false => &mut self.stage_in,
        };
        let id = stage.submit(src, dst)?;
        let mut done = Vec::new();
        stage.poll(&mut done);
        let outcome = match done.pop() {
            Some((ended, outcome)) if ended == id => outcome,
            _ => Err(TransferError::Failed(format!(
                "staging copy {id:?} did not end"
            ))),
        };
        let staged = match outcome {
            Ok(()) => (src.len() * self.link.peer().pool.slot_bytes()) as u64,
            Err(_) => 0,
        };
        self.counters.update(|stats| {
            stats.staging += started.elapsed();
            stats.staged_bytes += staged;
        });
        outcome
    }

    /// Ends the pending transfer at `index` with `outcome`, staging its rows in on success.
    fn end(&mut self, index: usize, outcome: Result<(), TransferError>) {
        let pending = self.pending.swap_remove(index);
        let outcome = outcome.and_then(|()| self.stage(false, &pending.dst, &pending.dst));
        self.ended.push((pending.id, outcome));
    }

    /// Takes the READs' outcomes and the prefill agent's notices, and ends what they finish.
    fn progress(&mut self) {
        let mut outcomes = Vec::new();
        self.link.poll_outcomes(&mut outcomes);
        for (id, outcome) in outcomes {
            let Some(index) = self.pending.iter().position(|p| p.id == id) else {
                continue;
            };
            match outcome {
                Ok(()) => self.pending[index].read = true,
                Err(error) => {
                    // The reader gave the request up: the source lets its rows go.
                    self.holds.drop_tag(self.pending[index].tag);
                    self.end(index, Err(error.into()));
                }
            }
        }
        let mut released = Vec::new();
        if let Err(error) = self.holds.poll(&self.prefill_agent, &mut released) {
            let message = format!("the prefill agent's notices: {error}");
            self.holds.reader_lost();
            for pending in std::mem::take(&mut self.pending) {
                let failed = TransferError::Failed(message.clone());
                self.ended.push((pending.id, Err(failed)));
            }
        }
        for (id, why) in released {
            let Some(index) = self.pending.iter().position(|p| p.id == id) else {
                continue;
            };
            match why {
                Released::Read => {
                    self.counters.update(|stats| stats.notices += 1);
                    self.pending[index].noticed = true;
                }
                Released::Expired | Released::Dropped | Released::ReaderLost => {
                    let error = TransferError::Failed(format!(
                        "transfer {} was read but its notice never reached the prefill agent \
                         ({why:?})",
                        id.0
                    ));
                    self.end(index, Err(error));
                }
            }
        }
        while let Some(index) = self.pending.iter().position(|p| p.read && p.noticed) {
            self.end(index, Ok(()));
        }
    }

    /// Brings the counters' copy of the READs' stats up to date.
    fn publish(&self) {
        let link = self.link.stats();
        self.counters.update(|stats| stats.link = link);
    }
}

impl KvTransfer for NixlLoopback {
    /// Stages `src` out of the prefill pool and posts the READ into the decode agent's `dst`.
    /// Refused, with nothing posted, for lists of different lengths or a slot past its pool.
    fn submit(&mut self, src: &[KvSlot], dst: &[KvSlot]) -> Result<TransferId, TransferError> {
        if src.len() != dst.len() {
            return Err(TransferError::LengthMismatch {
                src: src.len(),
                dst: dst.len(),
            });
        }
        self.stage(true, src, src)?;
        let tag = self.next_tag;
        let id = self.link.submit_tagged(src, dst, Some(tag))?;
        self.next_tag += 1;
        let noticed = match self.holds.hold(tag, id) {
            Ok(Some(_)) => {
                self.counters.update(|stats| stats.notices += 1);
                true
            }
            Ok(None) | Err(_) => false,
        };
        self.pending.push(Pending {
            id,
            tag,
            dst: dst.to_vec(),
            read: false,
            noticed,
        });
        self.publish();
        Ok(id)
    }

    fn poll(&mut self, done: &mut Vec<(TransferId, Result<(), TransferError>)>) {
        self.progress();
        done.append(&mut self.ended);
        self.publish();
    }
}
