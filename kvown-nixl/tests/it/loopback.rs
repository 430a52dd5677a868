//! Two processes on loopback: a prefill peer computes every prompt, this process (the decode
//! node) reads the K/V it lacks through NIXL and decodes. Per request, the decode node's K/V
//! equals the prefill node's (digests), and its output tokens equal a single node's.

use kvown_nixl::{AgentOptions, LoadedPeer, NixlTransfer, Prealloc, prealloc_or_wait, slot_runs};
use kvown_runtime::batch::{Req, TransferTicket, commit_transfer, init_next_round_input};
use kvown_runtime::ids::KvSlot;

use crate::agent_name;
use crate::nodes::{Geometry, LAYERS, Node, digest, prompts};
use crate::peer::{FromPeer, Peer, PeerConfig, ToPeer};

/// Requests in the workload.
const REQUESTS: usize = 12;
/// Output tokens per request.
const OUTPUTS: usize = 6;
/// Pages of every pool (room for the whole workload's cache).
const PAGES: usize = 128;

/// Every request's outputs computed on one node.
fn single_node(test: &str) -> Result<Vec<Vec<u32>>, String> {
    let geometry = Geometry { pages: PAGES };
    let mut node = Node::new(
        &agent_name(test, "single"),
        &AgentOptions::default(),
        geometry,
    )
    .map_err(|e| e.to_string())?;
    let mut outputs = Vec::new();
    for (rid, tokens) in prompts(REQUESTS).into_iter().enumerate() {
        let prefilled = node.prefill(rid as u64, &tokens)?;
        let mut req = prefilled.req;
        req.push_output(prefilled.first_token);
        outputs.push(node.decode(req, OUTPUTS)?);
        node.check([])?;
    }
    node.finish()?;
    Ok(outputs)
}

/// A prefill peer and this decode node of `PAGES` pages, the peer's metadata loaded here.
fn pair(test: &str) -> Result<(Peer, Node, LoadedPeer), String> {
    let peer = Peer::spawn(&PeerConfig::prefill(&agent_name(test, "prefill"), PAGES))?;
    let geometry = Geometry { pages: PAGES };
    let decode = Node::new(
        &agent_name(test, "decode"),
        &AgentOptions::default(),
        geometry,
    )
    .map_err(|e| e.to_string())?;
    let loaded = decode
        .agent
        .load_peer(&peer.metadata)
        .map_err(|e| e.to_string())?;
    Ok((peer, decode, loaded))
}

/// What the peer computed for a prompt, and the decode node's preallocation for its K/V.
struct Remote {
    /// The prompt's slots on the peer.
    slots: Vec<KvSlot>,
    /// The digest of the prompt's K/V on the peer.
    digest: u64,
    /// The decode node's row and slots for the positions it lacks.
    ticket: TransferTicket,
}

/// Has the peer compute `tokens` as request `rid`, then matches and preallocates the request on
/// `decode` (which must have room).
fn prefill_remote(
    peer: &mut Peer,
    decode: &mut Node,
    rid: u64,
    tokens: &[u32],
) -> Result<Remote, String> {
    let answer = peer.ask(&ToPeer::Prefill {
        rid,
        tokens: tokens.to_vec(),
    })?;
    let FromPeer::Prefilled {
        slots,
        first_token,
        digest,
        ..
    } = answer
    else {
        return Err(format!("request {rid}: {answer:?}"));
    };
    let mut req = Req::new(rid, tokens.to_vec());
    req.push_output(first_token);
    init_next_round_input(&mut req, &mut decode.cache, usize::MAX).map_err(|e| e.to_string())?;
    match prealloc_or_wait(req, &mut decode.cache) {
        Prealloc::Ready(ticket) => Ok(Remote {
            slots,
            digest,
            ticket,
        }),
        other => Err(format!("request {rid} was not preallocated: {other:?}")),
    }
}

/// The workload on a prefill peer and this decode node, runs merged or not; checks the digests
/// and outputs and returns nothing but failures.
fn two_nodes(test: &str, merge: bool) -> Result<(), String> {
    let expected = single_node(test)?;
    let (mut peer, mut decode, loaded) = pair(test)?;
    let mut link = NixlTransfer::new(&decode.agent, decode.pool.clone(), loaded)
        .map_err(|e| e.to_string())?
        .with_merged_runs(merge);
    let (mut moved, mut descriptors, mut partial) = (0, 0, 0);
    for (rid, tokens) in prompts(REQUESTS).into_iter().enumerate() {
        let rid = rid as u64;
        let Remote {
            slots,
            digest: prefill_digest,
            ticket,
        } = prefill_remote(&mut peer, &mut decode, rid, &tokens)?;
        let positions = ticket.positions();
        let src = &slots[positions.clone()];
        partial += usize::from(positions.start > 0);
        moved += positions.len();
        descriptors += slot_runs(src, ticket.destination(), merge).len() * 2 * LAYERS;
        let id = link
            .submit_tagged(src, ticket.destination(), Some(rid))
            .map_err(|e| e.to_string())?;
        link.wait(id).map_err(|e| e.to_string())?;
        let req = commit_transfer(ticket);
        let here = digest(&decode.pool, &decode.slots(&req, 0..tokens.len()));
        if here != prefill_digest {
            return Err(format!(
                "request {rid}: K/V digest {here:x} here, {prefill_digest:x} there"
            ));
        }
        let outputs = decode.decode(req, OUTPUTS)?;
        if outputs != expected[rid as usize] {
            return Err(format!(
                "request {rid}: outputs {outputs:?}, a single node {:?}",
                expected[rid as usize]
            ));
        }
        decode.check([])?;
        peer.check()?;
    }
    let stats = link.stats();
    let slot_bytes = decode.pool.descriptor().slot_bytes() as u64;
    if (stats.completed, stats.failed) != (REQUESTS as u64, 0)
        || stats.bytes != moved as u64 * slot_bytes
        || stats.descriptors != descriptors as u64
    {
        return Err(format!(
            "stats {stats:?}: expected {REQUESTS} completed, {} bytes, {descriptors} descriptors",
            moved as u64 * slot_bytes
        ));
    }
    let one_per_slot = moved * 2 * LAYERS;
    if (merge && descriptors >= one_per_slot) || (!merge && descriptors != one_per_slot) {
        return Err(format!(
            "{descriptors} descriptors for {moved} slots with merge = {merge}"
        ));
    }
    if partial == 0 {
        return Err("no request reused the decode node's prefix cache".into());
    }
    peer.finish()?;
    decode.finish()
}

/// Runs merged: fewer descriptors than slots, the same bytes.
pub fn merged_runs_move_every_byte_and_decode_as_one_node() -> Result<(), String> {
    two_nodes("loopback-merged", true)
}

/// One descriptor per slot, layer and tensor (NIXL told not to merge them): the same bytes.
pub fn one_descriptor_per_slot_moves_the_same_bytes() -> Result<(), String> {
    two_nodes("loopback-unmerged", false)
}

/// A prompt the decode node holds whole in its prefix cache reads nothing; the transfer is the
/// notice alone, and the prefill node lets the request go on it.
pub fn a_prompt_cached_whole_on_the_decode_node_moves_nothing_and_frees_the_source()
-> Result<(), String> {
    let test = "loopback-cached";
    let (mut peer, mut decode, loaded) = pair(test)?;
    let mut link =
        NixlTransfer::new(&decode.agent, decode.pool.clone(), loaded).map_err(|e| e.to_string())?;
    // Four whole pages: the second request's match covers its whole prompt.
    let tokens: Vec<u32> = (0..16).map(|t| 500 + t).collect();
    let mut moved = Vec::new();
    for rid in 0..2u64 {
        let Remote {
            slots,
            digest: prefill_digest,
            ticket,
        } = prefill_remote(&mut peer, &mut decode, rid, &tokens)?;
        moved.push(ticket.positions().len());
        let id = link
            .submit_tagged(&slots[ticket.positions()], ticket.destination(), Some(rid))
            .map_err(|e| e.to_string())?;
        link.wait(id).map_err(|e| e.to_string())?;
        let req = commit_transfer(ticket);
        let here = digest(&decode.pool, &decode.slots(&req, 0..tokens.len()));
        if here != prefill_digest {
            return Err(format!("request {rid}: the K/V differs"));
        }
        decode.decode(req, 2)?;
    }
    if moved != [16, 0] {
        return Err(format!("positions moved per request: {moved:?}"));
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let mut released = Vec::new();
    loop {
        let (held, let_go) = peer.check()?;
        released.extend(let_go);
        if held == 0 || std::time::Instant::now() > deadline {
            break;
        }
    }
    if released != [(0, "Read".to_string()), (1, "Read".to_string())] {
        return Err(format!("the prefill node released {released:?}"));
    }
    peer.finish()?;
    decode.finish()
}
