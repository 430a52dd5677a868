//! The faults a prefill/decode pair must survive. Each ends in a typed error, and the node that
//! survives passes its checker and gets every slot and row back.

use std::time::{Duration, Instant};

use kvown_nixl::{
    AgentOptions, Holds, LoadedPeer, NixlError, NixlTransfer, PeerMetadata, Prealloc, Released,
    prealloc_or_wait,
};
use kvown_runtime::batch::init_next_round_input;
use kvown_runtime::batch::{Req, TransferTicket, cancel_transfer, commit_transfer};
use kvown_runtime::error::KvError;
use kvown_runtime::error::OutOfMemory;

use crate::agent_name;
use crate::nodes::{Geometry, Node, digest, prompts};
use crate::peer::{FromPeer, Peer, PeerConfig, Role, ToPeer};

/// Pages of a roomy pool.
const PAGES: usize = 128;

/// What a prefill peer answered for one prompt.
struct Computed {
    slots: Vec<u32>,
    first_token: u32,
    digest: u64,
}

/// Asks `peer` to compute `tokens` as request `rid`.
fn compute(peer: &mut Peer, rid: u64, tokens: &[u32]) -> Result<Computed, String> {
    let answer = peer.ask(&ToPeer::Prefill {
        rid,
        tokens: tokens.to_vec(),
    })?;
    match answer {
        FromPeer::Prefilled {
            slots,
            first_token,
            digest,
            ..
        } => Ok(Computed {
            slots,
            first_token,
            digest,
        }),
        other => Err(format!("request {rid}: {other:?}")),
    }
}

/// The decode node's request for a computed prompt, matched and run through the prealloc rule.
fn prealloc(
    decode: &mut Node,
    rid: u64,
    tokens: &[u32],
    computed: &Computed,
) -> Result<Prealloc, String> {
    let mut req = Req::new(rid, tokens.to_vec());
    req.push_output(computed.first_token);
    init_next_round_input(&mut req, &mut decode.cache, usize::MAX).map_err(|e| e.to_string())?;
    Ok(prealloc_or_wait(req, &mut decode.cache))
}

/// The ticket of a preallocation that must succeed.
fn ready(prealloc: Prealloc) -> Result<TransferTicket, String> {
    match prealloc {
        Prealloc::Ready(ticket) => Ok(ticket),
        other => Err(format!("expected a preallocation, got {other:?}")),
    }
}

/// Reads `ticket`'s K/V from `computed`'s slots, commits, and checks the digest.
fn transfer(
    decode: &Node,
    link: &mut NixlTransfer,
    ticket: TransferTicket,
    computed: &Computed,
) -> Result<Req, String> {
    let rid = ticket.req().rid();
    let src = &computed.slots[ticket.positions()];
    let id = link
        .submit_tagged(src, ticket.destination(), Some(rid))
        .map_err(|e| e.to_string())?;
    link.wait(id).map_err(|e| e.to_string())?;
    let req = commit_transfer(ticket);
    let here = digest(&decode.pool, &decode.slots(&req, 0..computed.slots.len()));
    match here == computed.digest {
        true => Ok(req),
        false => Err(format!(
            "request {rid}: the K/V read differs from the source's"
        )),
    }
}

/// Preallocates request `rid` on the decode node and reads its K/V: [`transfer`].
fn read(
    decode: &mut Node,
    link: &mut NixlTransfer,
    rid: u64,
    tokens: &[u32],
    computed: &Computed,
) -> Result<Req, String> {
    let ticket = ready(prealloc(decode, rid, tokens, computed)?)?;
    transfer(decode, link, ticket, computed)
}

/// A decode node of `pages` (agent `options`) linked to a new prefill peer of `config`.
fn pair(
    test: &str,
    pages: usize,
    options: &AgentOptions,
    config: &PeerConfig,
) -> Result<(Peer, Node, NixlTransfer), String> {
    let peer = Peer::spawn(config)?;
    let decode = Node::new(&agent_name(test, "decode"), options, Geometry { pages })
        .map_err(|e| e.to_string())?;
    let loaded = decode
        .agent
        .load_peer(&peer.metadata)
        .map_err(|e| e.to_string())?;
    let link =
        NixlTransfer::new(&decode.agent, decode.pool.clone(), loaded).map_err(|e| e.to_string())?;
    Ok((peer, decode, link))
}

/// Cancels `ticket` and checks that the decode node holds nothing for it.
fn cancel(decode: &mut Node, ticket: TransferTicket) -> Result<(), String> {
    let req = cancel_transfer(ticket, &mut decode.cache).map_err(|f| f.error.to_string())?;
    if req.kv().holds_kv() {
        return Err("a cancelled request still holds K/V".into());
    }
    decode.check([])
}

/// The decode process is killed mid-transfer, with half of a request's K/V read: the prefill
/// node (this process) sees its control channel end ([`NixlError::PeerLost`]), no notice for
/// that request, and releases what it held; its checker passes and every slot comes back.
pub fn decode_killed_mid_transfer_leaves_the_prefill_node_whole() -> Result<(), String> {
    let test = "decode-killed";
    let mut prefill = Node::new(
        &agent_name(test, "prefill"),
        &AgentOptions::default(),
        Geometry { pages: PAGES },
    )
    .map_err(|e| e.to_string())?;
    let config = PeerConfig {
        role: Role::Decode,
        ..PeerConfig::prefill(&agent_name(test, "decode"), PAGES)
    };
    let mut decode = Peer::spawn(&config)?;
    decode.send(&ToPeer::Metadata(prefill.metadata().to_bytes()))?;
    let mut holds: Holds<Req> = Holds::new(Duration::from_secs(120));
    let mut released = Vec::new();
    let tokens = prompts(2);
    for (rid, tokens) in tokens.iter().enumerate() {
        let rid = rid as u64;
        let computed = prefill.prefill(rid, tokens)?;
        holds.hold(rid, computed.req).map_err(|_| "held twice")?;
        decode.send(&ToPeer::Read {
            rid,
            tokens: tokens.clone(),
            first_token: computed.first_token,
            src: computed.slots.clone(),
        })?;
        // The decode node reads the first half of the request, then waits for a go-ahead
        // (without which it would go on reading at once): the kill lands between the halves.
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut half_read = None;
        while half_read.is_none() && Instant::now() < deadline {
            holds
                .poll(&prefill.agent, &mut released)
                .map_err(|e| e.to_string())?;
            half_read = decode
                .channel
                .recv::<FromPeer>(Some(Duration::from_millis(1)))
                .map_err(|e| e.to_string())?;
        }
        match half_read {
            Some(FromPeer::HalfRead { rid: read }) if read == rid => {}
            other => return Err(format!("expected HalfRead, got {other:?}")),
        }
        if rid == 1 {
            decode.signal(libc::SIGKILL);
            break;
        }
        decode.send(&ToPeer::Continue)?;
        // The first request completes: serve the READ until the decode node commits it and its
        // notice arrives.
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut committed = None;
        while (committed.is_none() || !holds.is_empty()) && Instant::now() < deadline {
            holds
                .poll(&prefill.agent, &mut released)
                .map_err(|e| e.to_string())?;
            if let Some(answer) = decode
                .channel
                .recv::<FromPeer>(Some(Duration::from_millis(1)))
                .map_err(|e| e.to_string())?
            {
                committed = Some(answer);
            }
        }
        match committed {
            Some(FromPeer::Committed { digest, .. }) if digest == computed.digest => {}
            other => return Err(format!("request 0: {other:?}")),
        }
    }
    match decode
        .channel
        .recv::<FromPeer>(Some(Duration::from_secs(60)))
    {
        Err(NixlError::PeerLost { .. }) => {}
        other => {
            return Err(format!(
                "expected the channel to end (PeerLost), got {other:?}"
            ));
        }
    }
    holds
        .poll(&prefill.agent, &mut released)
        .map_err(|e| e.to_string())?;
    released.extend(holds.reader_lost());
    let why: Vec<(u64, Released)> = released
        .iter()
        .map(|(req, why)| (req.rid(), *why))
        .collect();
    if why != [(0, Released::Read), (1, Released::ReaderLost)] {
        return Err(format!("released {why:?}"));
    }
    for (req, _) in released {
        prefill.release(req);
    }
    prefill.finish()
}

/// The prefill process is killed after the decode node preallocated: the READ fails (or
/// times out), the decode node cancels the ticket, learns from the channel that the peer is
/// gone and forgets it; a transfer to it is then refused before anything is posted.
pub fn prefill_killed_after_preallocation_cancels_on_the_decode_node() -> Result<(), String> {
    let test = "prefill-killed";
    let config = PeerConfig::prefill(&agent_name(test, "prefill"), PAGES);
    let (mut peer, mut decode, link) = pair(test, PAGES, &AgentOptions::default(), &config)?;
    let mut link = link.with_timeout(Duration::from_secs(10));
    let tokens = &prompts(1)[0];
    let computed = compute(&mut peer, 0, tokens)?;
    let ticket = ready(prealloc(&mut decode, 0, tokens, &computed)?)?;
    peer.kill();
    let outcome = link
        .submit_tagged(
            &computed.slots[ticket.positions()],
            ticket.destination(),
            Some(0),
        )
        .and_then(|id| link.wait(id));
    match outcome {
        Err(
            NixlError::TransferFailed { .. } | NixlError::TimedOut { .. } | NixlError::Call { .. },
        ) => {}
        other => return Err(format!("a read from a dead peer: {other:?}")),
    }
    cancel(&mut decode, ticket)?;
    match peer.channel.recv::<FromPeer>(Some(Duration::from_secs(10))) {
        Err(NixlError::PeerLost { .. }) => {}
        other => return Err(format!("expected PeerLost, got {other:?}")),
    }
    decode
        .agent
        .forget_peer(&peer.metadata.agent)
        .map_err(|e| e.to_string())?;
    let ticket = ready(prealloc(&mut decode, 1, tokens, &computed)?)?;
    match link.submit_tagged(
        &computed.slots[ticket.positions()],
        ticket.destination(),
        Some(1),
    ) {
        Err(NixlError::UnknownPeer { .. }) => {}
        other => return Err(format!("a transfer to a forgotten peer: {other:?}")),
    }
    cancel(&mut decode, ticket)?;
    decode.finish()
}

/// The decode node is out of slots. The rule: a request that fits the pool waits (it holds
/// nothing, the prefill node keeps its K/V) and is preallocated once running requests release
/// theirs; one that can never fit is rejected and the prefill node told to drop its K/V.
pub fn decode_out_of_slots_waits_or_rejects() -> Result<(), String> {
    let test = "out-of-slots";
    let config = PeerConfig::prefill(&agent_name(test, "prefill"), PAGES);
    // 12 pages of 4: two requests of 30 tokens (8 pages each) do not fit at once.
    let (mut peer, mut decode, mut link) = pair(test, 12, &AgentOptions::default(), &config)?;
    let tail = |rid: u32, len: u32| -> Vec<u32> { (0..len).map(|i| 1_000 * rid + i).collect() };
    let (first, second, huge) = (tail(1, 30), tail(2, 30), tail(3, 60));
    let computed = compute(&mut peer, 1, &first)?;
    let running = read(&mut decode, &mut link, 1, &first, &computed)?;
    let waiting = compute(&mut peer, 2, &second)?;
    match prealloc(&mut decode, 2, &second, &waiting)? {
        Prealloc::Wait {
            req,
            error: KvError::OutOfMemory(_),
        } if !req.kv().holds_kv() => {}
        other => return Err(format!("expected Wait(OutOfMemory), got {other:?}")),
    }
    decode.check([&running])?;
    let (held, _) = peer.check()?;
    if held == 0 {
        return Err("the prefill node let go of a waiting request's K/V".into());
    }
    // The running request finishes; the waiting one now fits.
    decode.decode(running, 2)?;
    let req = read(&mut decode, &mut link, 2, &second, &waiting)?;
    decode.decode(req, 2)?;
    let never = compute(&mut peer, 3, &huge)?;
    match prealloc(&mut decode, 3, &huge, &never)? {
        Prealloc::Reject {
            req,
            error: KvError::OutOfMemory(OutOfMemory { requested, .. }),
        } if !req.kv().holds_kv() && requested > 48 => {}
        other => return Err(format!("expected Reject(OutOfMemory), got {other:?}")),
    }
    peer.send(&ToPeer::Drop { rid: 3 })?;
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut released = Vec::new();
    loop {
        let (held, let_go) = peer.check()?;
        released.extend(let_go);
        if held == 0 || Instant::now() > deadline {
            break;
        }
    }
    if !released.contains(&(3, "Dropped".to_string())) {
        return Err(format!(
            "the rejected request was not dropped: {released:?}"
        ));
    }
    peer.finish()?;
    decode.finish()
}

/// Metadata that is not a peer's, a peer never loaded, and a stale copy of a peer that
/// restarted are refused with typed errors; the restarted peer's new metadata is loaded in
/// place of the old, and transfers from it move the right bytes.
pub fn unknown_or_stale_metadata_is_refused_and_a_restarted_peer_reloaded() -> Result<(), String> {
    let test = "stale";
    let options = AgentOptions::default();
    let mut decode = Node::new(
        &agent_name(test, "decode"),
        &options,
        Geometry { pages: PAGES },
    )
    .map_err(|e| e.to_string())?;
    if !matches!(
        PeerMetadata::from_bytes(b"garbage"),
        Err(NixlError::BadMetadata { .. })
    ) {
        return Err("garbage was read as metadata".into());
    }
    let config = PeerConfig::prefill(&agent_name(test, "prefill"), PAGES);
    let mut first = Peer::spawn(&config)?;
    let mut broken = first.metadata.clone();
    broken.nixl = vec![7; 64];
    match decode.agent.load_peer(&broken) {
        Err(NixlError::BadMetadata { .. }) => {}
        other => return Err(format!("a corrupt NIXL blob: {other:?}")),
    }
    let unloaded = LoadedPeer {
        agent: first.metadata.agent.clone(),
        incarnation: first.metadata.incarnation,
        pool: first.metadata.pool.clone(),
    };
    match NixlTransfer::new(&decode.agent, decode.pool.clone(), unloaded) {
        Err(NixlError::UnknownPeer { .. }) => {}
        other => return Err(format!("a link to an unloaded peer: {other:?}")),
    }
    let loaded = decode
        .agent
        .load_peer(&first.metadata)
        .map_err(|e| e.to_string())?;
    let mut old_link =
        NixlTransfer::new(&decode.agent, decode.pool.clone(), loaded).map_err(|e| e.to_string())?;
    let tokens = prompts(3);
    let computed = compute(&mut first, 0, &tokens[0])?;
    let req = read(&mut decode, &mut old_link, 0, &tokens[0], &computed)?;
    decode.decode(req, 2)?;
    // The prefill process restarts under the same name.
    first.kill();
    let stale = first.metadata.clone();
    let mut second = Peer::spawn(&config)?;
    let reloaded = decode
        .agent
        .load_peer(&second.metadata)
        .map_err(|e| e.to_string())?;
    if reloaded.incarnation <= stale.incarnation {
        return Err("the restarted peer is not newer".into());
    }
    let computed = compute(&mut second, 1, &tokens[1])?;
    let ticket = ready(prealloc(&mut decode, 1, &tokens[1], &computed)?)?;
    match old_link.submit_tagged(
        &computed.slots[ticket.positions()],
        ticket.destination(),
        Some(1),
    ) {
        Err(NixlError::PeerRestarted { .. }) => {}
        other => {
            return Err(format!(
                "a link to the restarted peer's predecessor: {other:?}"
            ));
        }
    }
    match decode.agent.load_peer(&stale) {
        Err(NixlError::StaleMetadata { .. }) => {}
        other => return Err(format!("the predecessor's metadata again: {other:?}")),
    }
    if decode.agent.peer_incarnation(&stale.agent) != Some(reloaded.incarnation) {
        return Err("refusing stale metadata changed the loaded peer".into());
    }
    let mut link = NixlTransfer::new(&decode.agent, decode.pool.clone(), reloaded)
        .map_err(|e| e.to_string())?;
    let req = transfer(&decode, &mut link, ticket, &computed)?;
    decode.decode(req, 2)?;
    second.finish()?;
    decode.finish()
}

/// The prefill process stops (SIGSTOP) with a READ posted over TCP, which needs its progress:
/// the transfer times out ([`NixlError::TimedOut`]), its NIXL request is released and the
/// ticket cancelled. Resumed, the prefill node got no notice and drops the request when told;
/// the next transfer works.
pub fn a_transfer_that_never_completes_times_out_and_is_cancelled() -> Result<(), String> {
    let test = "never-completes";
    let options = AgentOptions {
        ucx_transports: Some("tcp".into()),
    };
    let config = PeerConfig::prefill(&agent_name(test, "prefill"), PAGES);
    let (mut peer, mut decode, link) = pair(test, PAGES, &options, &config)?;
    let timeout = Duration::from_millis(300);
    let mut link = link.with_timeout(timeout);
    let tokens = prompts(2);
    let computed = compute(&mut peer, 0, &tokens[0])?;
    let ticket = ready(prealloc(&mut decode, 0, &tokens[0], &computed)?)?;
    let free_before = decode.cache.available_size();
    peer.signal(libc::SIGSTOP);
    let outcome = link
        .submit_tagged(
            &computed.slots[ticket.positions()],
            ticket.destination(),
            Some(0),
        )
        .and_then(|id| link.wait(id));
    peer.signal(libc::SIGCONT);
    match outcome {
        Err(NixlError::TimedOut { after, .. }) if after == timeout => {}
        other => return Err(format!("expected TimedOut, got {other:?}")),
    }
    if link.in_flight() != 0 {
        return Err("the timed-out request is still in flight".into());
    }
    cancel(&mut decode, ticket)?;
    if decode.cache.available_size() <= free_before {
        return Err("cancelling gave no slot back".into());
    }
    peer.send(&ToPeer::Drop { rid: 0 })?;
    let (held, released) = peer.check()?;
    if held != 0 || released != [(0, "Dropped".to_string())] {
        return Err(format!(
            "the prefill node after the drop: {held} held, released {released:?}"
        ));
    }
    let computed = compute(&mut peer, 1, &tokens[1])?;
    let req = read(&mut decode, &mut link, 1, &tokens[1], &computed)?;
    decode.decode(req, 2)?;
    peer.finish()?;
    decode.finish()
}
