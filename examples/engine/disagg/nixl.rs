//! `--transfer nixl`: the prefill node runs as a second process ([`super::process`]), started
//! by this one; this (decode) node reads each request's K/V from it with a NIXL READ
//! (`kvown_nixl::NixlTransfer`). The control channel carries the prefill node's metadata and
//! the prompts; the K/V crosses only through NIXL.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kvown::alloc::KvSlot;
use kvown::batch::{Req, TransferTicket};
use kvown::kv::{KvLayout, KvPool};
use kvown_nixl::channel::{Channel, Listener};
use kvown_nixl::{Agent, NixlError, NixlTransfer, PeerMetadata, RegisteredPool};
use serde::{Deserialize, Serialize};

use super::process::Launch;
use super::{Computed, Prompt, Source, TransferReport};
use crate::kv_data::{self, KvStore};

/// How long the prefill process may take to start, or to answer a message.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(120);

/// Decode node to prefill process.
#[derive(Debug, Serialize, Deserialize)]
pub enum ToPrefill {
    /// Compute these prompts and hold their K/V until it is read.
    Prompts(Vec<Prompt>),
    /// Run the invariant checker.
    Check,
    /// Wait for the outstanding reads, empty the prefix cache, check that nothing leaked, exit.
    Finish,
}

/// Prefill process to decode node.
#[derive(Debug, Serialize, Deserialize)]
pub enum FromPrefill {
    /// Its `PeerMetadata`, as bytes: the first message.
    Metadata(Vec<u8>),
    /// The prompts are computed: per prompt, in order, the slots of its positions and the
    /// digest of their K/V; and the tokens computed.
    Computed {
        /// Per prompt: (slots, digest).
        sources: Vec<(Vec<KvSlot>, u64)>,
        /// Tokens computed (prefix-cache hits excluded).
        tokens: u64,
    },
    /// Its pool cannot take the prompts now.
    NoRoom,
    /// The checker's answer.
    Checked(Result<(), String>),
    /// The end-of-run check's answer.
    Finished(Result<(), String>),
}

/// The decode node's side: the prefill process, the control channel, and the NIXL link.
pub struct NixlLink {
    child: Child,
    channel: Channel,
    pool: RegisteredPool,
    link: NixlTransfer,
    next_tag: u64,
    report: TransferReport,
}

/// The command that runs this binary as the prefill process (a test binary runs its
/// prefill-process test instead, which does the same).
fn prefill_command() -> Result<Command, String> {
    let exe = std::env::current_exe().map_err(|e| format!("this binary's path: {e}"))?;
    let mut command = Command::new(exe);
    if cfg!(test) {
        command.args(super::process::TEST_ARGS);
    }
    Ok(command)
}

fn nixl_error(what: &str) -> impl Fn(NixlError) -> String + '_ {
    move |error| format!("--transfer nixl, {what}: {error}")
}

impl NixlLink {
    /// Registers a decode pool of `layout`, starts the prefill process with `flags` (the
    /// engine's own), and loads its metadata.
    pub fn start(flags: &[String], layout: KvLayout) -> Result<NixlLink, String> {
        let agent = Agent::new(&format!("kvown-engine-decode-{}", std::process::id()))
            .map_err(nixl_error("the decode agent"))?;
        let pool = RegisteredPool::new(&agent, layout, kv_data::DTYPE)
            .map_err(nixl_error("the decode pool"))?;
        let listener = Listener::bind_temp("kvown-engine").map_err(nixl_error("the channel"))?;
        let launch = Launch {
            socket: listener.path().to_path_buf(),
            flags: flags.to_vec(),
        };
        let mut child = prefill_command()?
            .env(super::process::LAUNCH_ENV, launch.to_env())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .map_err(|e| format!("--transfer nixl: starting the prefill process: {e}"))?;
        let mut channel = listener
            .accept_child(&mut child, ANSWER_TIMEOUT)
            .map_err(nixl_error("the prefill process"))?;
        let metadata = match channel.recv(Some(ANSWER_TIMEOUT)) {
            Ok(Some(FromPrefill::Metadata(bytes))) => {
                PeerMetadata::from_bytes(&bytes).map_err(nixl_error("its metadata"))?
            }
            other => return Err(format!("--transfer nixl: expected metadata, got {other:?}")),
        };
        let peer = agent
            .load_peer(&metadata)
            .map_err(nixl_error("loading its metadata"))?;
        let link = NixlTransfer::new(&agent, pool.clone(), peer).map_err(nixl_error("the link"))?;
        Ok(NixlLink {
            child,
            channel,
            pool,
            link,
            next_tag: 0,
            report: TransferReport::new("nixl"),
        })
    }

    /// The decode node's pool (registered with NIXL), for its K/V store.
    pub fn decode_pool(&self) -> Box<dyn KvPool> {
        Box::new(self.pool.clone())
    }

    fn ask(&mut self, message: &ToPrefill) -> Result<FromPrefill, String> {
        let lost = nixl_error("the prefill process");
        self.channel.send(message).map_err(&lost)?;
        match self.channel.recv(Some(ANSWER_TIMEOUT)).map_err(&lost)? {
            Some(answer) => Ok(answer),
            None => Err(format!(
                "--transfer nixl: the prefill process did not answer within {ANSWER_TIMEOUT:?}"
            )),
        }
    }

    /// Sends the prompts of `reqs` to the prefill process.
    pub fn prefill(&mut self, reqs: &[Req]) -> Result<Option<(Vec<Computed>, u64)>, String> {
        let prompts: Vec<Prompt> = reqs
            .iter()
            .map(|req| {
                self.next_tag += 1;
                Prompt {
                    rid: req.rid(),
                    namespace: req.namespace().0,
                    priority: req.priority(),
                    tokens: req.fill_ids().to_vec(),
                    tag: self.next_tag,
                }
            })
            .collect();
        match self.ask(&ToPrefill::Prompts(prompts.clone()))? {
            FromPrefill::NoRoom => Ok(None),
            FromPrefill::Computed { sources, tokens } if sources.len() == prompts.len() => {
                let computed = sources
                    .into_iter()
                    .zip(&prompts)
                    .map(|((slots, digest), prompt)| Computed {
                        slots,
                        digest,
                        source: Source::Process { tag: prompt.tag },
                    })
                    .collect();
                Ok(Some((computed, tokens)))
            }
            other => Err(format!("--transfer nixl: expected Computed, got {other:?}")),
        }
    }

    /// Reads the rows through NIXL (notifying the prefill process with the prompt's tag, on
    /// which it releases the request) and checks the digest.
    pub fn send(
        &mut self,
        computed: Computed,
        ticket: &TransferTicket,
        (decode, decode_slots): (&KvStore, &[KvSlot]),
    ) -> Result<(), String> {
        let Source::Process { tag } = computed.source else {
            unreachable!("a NIXL link's requests are held by the prefill process");
        };
        let rid = ticket.req().rid();
        let failed = |e: NixlError| format!("--transfer nixl: K/V of request {rid}: {e}");
        let src = &computed.slots[ticket.positions()];
        let before = self.link.stats();
        let start = Instant::now();
        let id = self
            .link
            .submit_tagged(src, ticket.destination(), Some(tag))
            .map_err(failed)?;
        self.link.wait(id).map_err(failed)?;
        let seconds = start.elapsed().as_secs_f64();
        let after = self.link.stats();
        let here = decode.digest(decode_slots)?;
        self.report
            .record(after.bytes - before.bytes, seconds, here, computed.digest)?;
        self.report.descriptors = Some(after.descriptors);
        Ok(())
    }

    /// The prefill process's checker (the requests whose K/V waits to be read count as held).
    pub fn check(&mut self) -> Result<(), String> {
        match self.ask(&ToPrefill::Check)? {
            FromPrefill::Checked(result) => result,
            other => Err(format!("--transfer nixl: expected Checked, got {other:?}")),
        }
    }

    /// Ends the prefill process after its end-of-run check.
    pub fn finish(&mut self) -> Result<(), String> {
        match self.ask(&ToPrefill::Finish)? {
            FromPrefill::Finished(result) => result?,
            other => return Err(format!("--transfer nixl: expected Finished, got {other:?}")),
        }
        let status = self
            .child
            .wait()
            .map_err(|e| format!("--transfer nixl: waiting for the prefill process: {e}"))?;
        match status.success() {
            true => Ok(()),
            false => Err(format!(
                "--transfer nixl: the prefill process exited with {status}"
            )),
        }
    }

    /// What the transfers did.
    pub fn report(&self) -> TransferReport {
        self.report
    }
}

impl Drop for NixlLink {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
