//! The other process of a two-process test: this test binary, started again with
//! `KVOWN_NIXL_PEER` set to a [`PeerConfig`], runs a prefill node or a decode node driven over
//! the control channel. [`Peer`] is the parent's handle on it.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use kvown_nixl::channel::{Channel, Listener};
use kvown_nixl::{
    AgentOptions, Holds, NixlError, NixlTransfer, PeerMetadata, Prealloc, Released,
    prealloc_or_wait,
};
use kvown_runtime::batch::{Req, commit_transfer, init_next_round_input};
use serde::{Deserialize, Serialize};

use crate::nodes::{Geometry, Node, digest};

/// The environment variable that makes this binary a peer.
const PEER_ENV: &str = "KVOWN_NIXL_PEER";

/// How long a control message may take to be answered.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(60);

/// Which node the peer runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Role {
    /// Computes prompts and holds their K/V until it is read.
    Prefill,
    /// Reads K/V from the parent (a prefill node) into its own pool.
    Decode,
}

/// What the peer process is.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PeerConfig {
    /// Its node.
    pub role: Role,
    /// Its agent's name.
    pub agent: String,
    /// Pages in its pool.
    pub pages: usize,
    /// UCX transports for its agent (`None`: UCX's choice).
    pub transports: Option<String>,
    /// How long a prefill peer holds K/V nobody reads.
    pub hold_for: Duration,
}

impl PeerConfig {
    /// A prefill peer named `agent` with a pool of `pages`.
    pub fn prefill(agent: &str, pages: usize) -> PeerConfig {
        PeerConfig {
            role: Role::Prefill,
            agent: agent.to_string(),
            pages,
            transports: None,
            hold_for: Duration::from_secs(120),
        }
    }
}

/// Parent to peer.
#[derive(Debug, Serialize, Deserialize)]
pub enum ToPeer {
    /// The parent's metadata (a decode peer loads it).
    Metadata(Vec<u8>),
    /// Compute this prompt and hold its K/V (prefill peer).
    Prefill {
        /// Request id, also the transfer's tag.
        rid: u64,
        /// The prompt.
        tokens: Vec<u32>,
    },
    /// Let request `rid`'s K/V go: the decode node rejected it (prefill peer).
    Drop {
        /// The request.
        rid: u64,
    },
    /// Preallocate this request and read its K/V from the parent's `src` slots, in two halves
    /// (decode peer): [`FromPeer::HalfRead`] after the first, then the rest on
    /// [`ToPeer::Continue`].
    Read {
        /// Request id, also the transfer's tag.
        rid: u64,
        /// The prompt.
        tokens: Vec<u32>,
        /// The first output token.
        first_token: u32,
        /// The parent's slots of positions `0..prompt`.
        src: Vec<u32>,
    },
    /// Read the rest of the request (decode peer).
    Continue,
    /// Run the checker.
    Check,
    /// Wait for the reads to finish, empty the cache and check nothing leaked; then exit.
    Finish,
}

/// Peer to parent.
#[derive(Debug, Serialize, Deserialize)]
pub enum FromPeer {
    /// The peer's metadata, sent first.
    Metadata(Vec<u8>),
    /// A prompt computed and held.
    Prefilled {
        /// The request.
        rid: u64,
        /// Slots of positions `0..prompt`.
        slots: Vec<u32>,
        /// The first output token.
        first_token: u32,
        /// Digest of the K/V of `slots`.
        digest: u64,
    },
    /// The request could not be computed or preallocated.
    Refused {
        /// The request.
        rid: u64,
        /// Why.
        reason: String,
    },
    /// The first half of a request is read (decode peer); the notice is not sent yet.
    HalfRead {
        /// The request.
        rid: u64,
    },
    /// The read of a request completed and is committed (decode peer).
    Committed {
        /// The request.
        rid: u64,
        /// Digest of its K/V here, positions `0..prompt`.
        digest: u64,
    },
    /// The checker's answer.
    Checked {
        /// Requests held (prefill peer).
        held: usize,
        /// Requests let go since the last answer, and why.
        released: Vec<(u64, String)>,
        /// The checker's result.
        result: Result<(), String>,
    },
    /// The end-of-run check.
    Finished(Result<(), String>),
}

/// Whether this process was started as a peer; runs it if so and returns its exit code.
pub fn run_if_peer() -> Option<i32> {
    let config = std::env::var(PEER_ENV).ok()?;
    let config: PeerConfig = serde_json::from_str(&config).expect("a peer config");
    let socket = std::env::var("KVOWN_NIXL_PEER_SOCKET").expect("the control socket");
    Some(match serve(&config, socket.as_ref()) {
        Ok(()) => 0,
        Err(error) => {
            eprintln!("peer {}: {error}", config.agent);
            3
        }
    })
}

fn serve(config: &PeerConfig, socket: &std::path::Path) -> Result<(), String> {
    let options = AgentOptions {
        ucx_transports: config.transports.clone(),
    };
    let geometry = Geometry {
        pages: config.pages,
    };
    let mut node = Node::new(&config.agent, &options, geometry).map_err(|e| e.to_string())?;
    let mut channel = Channel::connect(socket).map_err(|e| e.to_string())?;
    channel
        .send(&FromPeer::Metadata(node.metadata().to_bytes()))
        .map_err(|e| e.to_string())?;
    match config.role {
        Role::Prefill => serve_prefill(&mut node, &mut channel, config.hold_for),
        Role::Decode => serve_decode(&mut node, &mut channel),
    }
}

/// The prefill peer's loop: compute, hold, release on notice, drop, expiry or the parent's end.
fn serve_prefill(node: &mut Node, channel: &mut Channel, hold_for: Duration) -> Result<(), String> {
    let mut holds: Holds<Req> = Holds::new(hold_for);
    let mut released: Vec<(u64, String)> = Vec::new();
    let let_go = |node: &mut Node, gone: Vec<(Req, Released)>, log: &mut Vec<(u64, String)>| {
        for (req, why) in gone {
            log.push((req.rid(), format!("{why:?}")));
            node.release(req);
        }
    };
    loop {
        let message = match channel.recv::<ToPeer>(Some(Duration::from_millis(1))) {
            Ok(message) => message,
            Err(NixlError::PeerLost { .. }) => {
                let gone = holds.reader_lost();
                let_go(node, gone, &mut released);
                return node.finish();
            }
            Err(error) => return Err(error.to_string()),
        };
        let mut gone = Vec::new();
        holds
            .poll(&node.agent, &mut gone)
            .map_err(|e| e.to_string())?;
        let_go(node, gone, &mut released);
        let answer = match message {
            None => continue,
            Some(ToPeer::Prefill { rid, tokens }) => match node.prefill(rid, &tokens) {
                Ok(prefilled) => {
                    let answer = FromPeer::Prefilled {
                        rid,
                        slots: prefilled.slots,
                        first_token: prefilled.first_token,
                        digest: prefilled.digest,
                    };
                    match holds.hold(rid, prefilled.req) {
                        Ok(None) => {}
                        Ok(Some(gone)) => let_go(node, vec![gone], &mut released),
                        Err(req) => return Err(format!("request {} held twice", req.rid())),
                    }
                    answer
                }
                Err(reason) => FromPeer::Refused { rid, reason },
            },
            Some(ToPeer::Drop { rid }) => {
                let gone = holds.drop_tag(rid).into_iter().collect();
                let_go(node, gone, &mut released);
                continue;
            }
            Some(ToPeer::Check) => FromPeer::Checked {
                held: holds.len(),
                released: std::mem::take(&mut released),
                result: node.check(holds.items()),
            },
            Some(ToPeer::Finish) => {
                let deadline = std::time::Instant::now() + ANSWER_TIMEOUT;
                while !holds.is_empty() && std::time::Instant::now() < deadline {
                    let mut gone = Vec::new();
                    holds
                        .poll(&node.agent, &mut gone)
                        .map_err(|e| e.to_string())?;
                    let_go(node, gone, &mut released);
                }
                let result = match holds.len() {
                    0 => node.finish(),
                    held => Err(format!("{held} requests still held at the end")),
                };
                let done = result.is_ok();
                channel
                    .send(&FromPeer::Finished(result))
                    .map_err(|e| e.to_string())?;
                return if done {
                    Ok(())
                } else {
                    Err("finish failed".into())
                };
            }
            Some(other) => return Err(format!("a prefill peer got {other:?}")),
        };
        channel.send(&answer).map_err(|e| e.to_string())?;
    }
}

/// The decode peer's loop: load the parent's metadata, then preallocate, read (in two halves)
/// and commit.
fn serve_decode(node: &mut Node, channel: &mut Channel) -> Result<(), String> {
    let Some(ToPeer::Metadata(bytes)) = channel.recv(None).map_err(|e| e.to_string())? else {
        return Err("the parent's metadata first".into());
    };
    let metadata = PeerMetadata::from_bytes(&bytes).map_err(|e| e.to_string())?;
    let peer = node.agent.load_peer(&metadata).map_err(|e| e.to_string())?;
    let mut link =
        NixlTransfer::new(&node.agent, node.pool.clone(), peer).map_err(|e| e.to_string())?;
    loop {
        let message = channel.recv::<ToPeer>(None).map_err(|e| e.to_string())?;
        let Some(ToPeer::Read {
            rid,
            tokens,
            first_token,
            src,
        }) = message
        else {
            return Err(format!("a decode peer got {message:?}"));
        };
        let mut req = Req::new(rid, tokens.clone());
        req.push_output(first_token);
        init_next_round_input(&mut req, &mut node.cache, usize::MAX).map_err(|e| e.to_string())?;
        let ticket = match prealloc_or_wait(req, &mut node.cache) {
            Prealloc::Ready(ticket) => ticket,
            Prealloc::Wait { error, .. } | Prealloc::Reject { error, .. } => {
                let reason = error.to_string();
                channel
                    .send(&FromPeer::Refused { rid, reason })
                    .map_err(|e| e.to_string())?;
                continue;
            }
        };
        // Two chunks, as an engine reading K/V while it is computed would: the first without a
        // notice, then (once the parent says so) the rest, whose notice tells the source.
        let positions = ticket.positions();
        let half = positions.len() / 2;
        let (src, dst) = (&src[positions], ticket.destination());
        let first = link
            .submit_tagged(&src[..half], &dst[..half], None)
            .map_err(|e| e.to_string())?;
        link.wait(first).map_err(|e| e.to_string())?;
        channel
            .send(&FromPeer::HalfRead { rid })
            .map_err(|e| e.to_string())?;
        match channel.recv::<ToPeer>(None).map_err(|e| e.to_string())? {
            Some(ToPeer::Continue) => {}
            other => return Err(format!("expected Continue, got {other:?}")),
        }
        let rest = link
            .submit_tagged(&src[half..], &dst[half..], Some(rid))
            .map_err(|e| e.to_string())?;
        link.wait(rest).map_err(|e| e.to_string())?;
        let req = commit_transfer(ticket);
        let digest = digest(&node.pool, &node.slots(&req, 0..tokens.len()));
        node.release(req);
        channel
            .send(&FromPeer::Committed { rid, digest })
            .map_err(|e| e.to_string())?;
    }
}

/// The parent's handle on a peer process: killed (if still running) on drop.
pub struct Peer {
    child: Child,
    /// The control channel to it.
    pub channel: Channel,
    /// The metadata it sent.
    pub metadata: PeerMetadata,
}

impl Peer {
    /// Starts this binary as a peer of `config` and waits for its metadata.
    pub fn spawn(config: &PeerConfig) -> Result<Peer, String> {
        let listener = Listener::bind_temp("kvown-nixl-it").map_err(|e| e.to_string())?;
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let mut child = Command::new(exe)
            .env(PEER_ENV, serde_json::to_string(config).expect("a config"))
            .env("KVOWN_NIXL_PEER_SOCKET", listener.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .map_err(|e| format!("starting the peer: {e}"))?;
        let mut channel = listener
            .accept_child(&mut child, ANSWER_TIMEOUT)
            .map_err(|e| e.to_string())?;
        let metadata = match channel.recv(Some(ANSWER_TIMEOUT)) {
            Ok(Some(FromPeer::Metadata(bytes))) => {
                PeerMetadata::from_bytes(&bytes).map_err(|e| e.to_string())?
            }
            other => return Err(format!("the peer's metadata: {other:?}")),
        };
        Ok(Peer {
            child,
            channel,
            metadata,
        })
    }

    /// Sends `message` without waiting for an answer.
    pub fn send(&mut self, message: &ToPeer) -> Result<(), String> {
        self.channel.send(message).map_err(|e| e.to_string())
    }

    /// The next message from the peer.
    pub fn answer(&mut self) -> Result<FromPeer, String> {
        match self.channel.recv(Some(ANSWER_TIMEOUT)) {
            Ok(Some(answer)) => Ok(answer),
            Ok(None) => Err("the peer did not answer in time".into()),
            Err(error) => Err(error.to_string()),
        }
    }

    /// Sends `message` and returns the answer.
    pub fn ask(&mut self, message: &ToPeer) -> Result<FromPeer, String> {
        self.send(message)?;
        self.answer()
    }

    /// The peer's checker; fails unless it passes. Returns the requests held and those let go.
    pub fn check(&mut self) -> Result<(usize, Vec<(u64, String)>), String> {
        match self.ask(&ToPeer::Check)? {
            FromPeer::Checked {
                held,
                released,
                result,
            } => result.map(|()| (held, released)),
            other => Err(format!("expected Checked, got {other:?}")),
        }
    }

    /// Ends the peer after its end-of-run check, which must pass.
    pub fn finish(mut self) -> Result<(), String> {
        match self.ask(&ToPeer::Finish)? {
            FromPeer::Finished(result) => result?,
            other => return Err(format!("expected Finished, got {other:?}")),
        }
        let status = self.child.wait().map_err(|e| e.to_string())?;
        match status.success() {
            true => Ok(()),
            false => Err(format!("the peer exited with {status}")),
        }
    }

    /// Sends `signal` to the peer process.
    pub fn signal(&self, signal: i32) {
        // SAFETY: a signal to our own child, which has not been reaped (the handle is alive).
        let sent = unsafe { libc::kill(self.child.id() as libc::pid_t, signal) };
        assert_eq!(sent, 0, "signal {signal} to the peer");
    }

    /// Kills the peer (SIGKILL) and reaps it; the channel stays, to see its end.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
