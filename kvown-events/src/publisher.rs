//! The publisher: event batches on a ZMQ PUB socket, as vLLM's and sglang's `ZmqEventPublisher`
//! send them, and its replay service for subscribers that joined late or lost messages.
//!
//! Each batch is the 3-frame message `[topic, sequence number (8 bytes, big-endian), payload]`,
//! the sequence numbers counting up from 0 without gaps. The last batches are kept, and a
//! replay request on the ROUTER socket, `[start (8 bytes, big-endian)]` (after an empty
//! delimiter frame when the client is a REQ or a DEALER that sends one, as vLLM's and Dynamo's
//! do), is answered by every kept batch numbered `start` or later, then an end marker, in the
//! dialect's framing ([`Dialect::replay_topic_frame`]): `[topic, sequence number, payload]`
//! each and `[empty, `[`REPLAY_END`]`, empty]` (vLLM 0.26 on, sglang 0.5.22 on), or
//! `[sequence number, payload]` and `[`[`REPLAY_END`]`, empty]` (before).

use std::collections::VecDeque;

use kvown_runtime::radix::CacheEvent;

use crate::dialect::Dialect;
use crate::encoder::EventEncoder;
use crate::error::PublishError;

/// The sequence frame of the message that ends a replay: -1 as a big-endian `i64`.
pub const REPLAY_END: [u8; 8] = (-1i64).to_be_bytes();

/// Where and how a publisher sends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublisherConfig {
    /// The PUB socket's endpoint; `tcp://127.0.0.1:*` binds a free port
    /// ([`EventPublisher::endpoint`] tells which).
    pub endpoint: String,
    /// The replay ROUTER socket's endpoint; `None` serves no replays.
    pub replay_endpoint: Option<String>,
    /// The first frame of every message (subscribers filter on its prefix); vLLM's default is
    /// empty.
    pub topic: String,
    /// How many of the last batches are kept for replays (vLLM's `buffer_steps`); 0 keeps
    /// none.
    pub replay_buffer_batches: usize,
    /// The PUB socket's send high-water mark in messages: past it, messages to a slow
    /// subscriber are dropped (it sees a gap and asks for a replay).
    pub send_high_water_mark: i32,
}

impl Default for PublisherConfig {
    /// Loopback, a free port for each socket, empty topic, vLLM's buffer and high-water mark.
    fn default() -> PublisherConfig {
        PublisherConfig {
            endpoint: "tcp://127.0.0.1:*".to_owned(),
            replay_endpoint: Some("tcp://127.0.0.1:*".to_owned()),
            topic: String::new(),
            replay_buffer_batches: 10_000,
            send_high_water_mark: 100_000,
        }
    }
}

/// A bound PUB socket (and replay socket) sending numbered event batches of one encoder.
pub struct EventPublisher {
    encoder: EventEncoder,
    socket: zmq::Socket,
    endpoint: String,
    replay: Option<(zmq::Socket, String)>,
    topic: Vec<u8>,
    next_seq: u64,
    kept: VecDeque<(u64, Vec<u8>)>,
    keep: usize,
    scratch: Vec<u8>,
}

impl std::fmt::Debug for EventPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventPublisher")
            .field("dialect", &self.encoder.dialect())
            .field("endpoint", &self.endpoint)
            .field("replay_endpoint", &self.replay_endpoint())
            .field("next_seq", &self.next_seq)
            .field("kept", &self.kept.len())
            .finish()
    }
}

impl EventPublisher {
    /// Binds the PUB socket (and the replay socket) of `config` in `context`, to publish
    /// batches of `encoder` (whose dialect also frames the replay replies).
    pub fn bind(
        context: &zmq::Context,
        config: &PublisherConfig,
        encoder: EventEncoder,
    ) -> Result<EventPublisher, PublishError> {
        let socket = bound(context, zmq::PUB, "PUB", &config.endpoint)?;
        socket
            .set_sndhwm(config.send_high_water_mark)
            .map_err(|source| socket_error("setting the send high-water mark", source))?;
        let endpoint = last_endpoint(&socket)?;
        let replay = match &config.replay_endpoint {
            Some(replay_endpoint) => {
                let replay = bound(context, zmq::ROUTER, "replay ROUTER", replay_endpoint)?;
                let endpoint = last_endpoint(&replay)?;
                Some((replay, endpoint))
            }
            None => None,
        };
        Ok(EventPublisher {
            encoder,
            socket,
            endpoint,
            replay,
            topic: config.topic.as_bytes().to_vec(),
            next_seq: 0,
            kept: VecDeque::with_capacity(config.replay_buffer_batches.min(1 << 16)),
            keep: config.replay_buffer_batches,
            scratch: Vec::new(),
        })
    }

    /// The encoder of its batches.
    pub fn encoder(&self) -> &EventEncoder {
        &self.encoder
    }

    /// The PUB socket's endpoint, its port resolved: what subscribers connect to.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The replay socket's endpoint, its port resolved.
    pub fn replay_endpoint(&self) -> Option<&str> {
        self.replay.as_ref().map(|(_, endpoint)| endpoint.as_str())
    }

    /// The sequence number the next batch gets (the number of batches sent so far).
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// Encodes `events` as one batch stamped `timestamp` and sends it; returns its sequence
    /// number, or `None` for no events (nothing is sent). Fails without sending or numbering
    /// anything when the events cannot be encoded or the socket refuses the message.
    pub fn publish_events(
        &mut self,
        timestamp: f64,
        events: &[CacheEvent],
    ) -> Result<Option<u64>, PublishError> {
        if events.is_empty() {
            return Ok(None);
        }
        let mut payload = std::mem::take(&mut self.scratch);
        let sent = self
            .encoder
            .encode(timestamp, events, &mut payload)
            .map_err(PublishError::from)
            .and_then(|()| self.send(&payload));
        match sent {
            Ok(seq) => {
                self.keep_for_replay(seq, payload);
                Ok(Some(seq))
            }
            Err(error) => {
                self.scratch = payload;
                Err(error)
            }
        }
    }

    /// Sends an already encoded batch (of the encoder's dialect); returns its sequence number.
    pub fn publish_payload(&mut self, payload: &[u8]) -> Result<u64, PublishError> {
        let seq = self.send(payload)?;
        self.keep_for_replay(seq, payload.to_vec());
        Ok(seq)
    }

    /// Answers the replay requests waiting on the replay socket, without blocking; returns how
    /// many it answered. Call it regularly (after each publish, and while idle). A malformed
    /// request (not an 8-byte start, after the client's routing frames) is dropped unanswered.
    pub fn serve_replay(&mut self) -> Result<usize, PublishError> {
        let Some((replay, _)) = &self.replay else {
            return Ok(0);
        };
        let mut served = 0;
        loop {
            let frames = match replay.recv_multipart(zmq::DONTWAIT) {
                Ok(frames) => frames,
                Err(zmq::Error::EAGAIN) => return Ok(served),
                Err(source) => return Err(socket_error("receiving a replay request", source)),
            };
            let Some((start, prefix)) = parse_replay_request(&frames) else {
                continue;
            };
            let framing = ReplayFraming::of(self.encoder.dialect(), &self.topic);
            for (seq, payload) in self.kept.iter().filter(|(seq, _)| *seq >= start) {
                let seq = seq.to_be_bytes();
                let reply = framing.reply(prefix, &seq, payload);
                replay
                    .send_multipart(reply, 0)
                    .map_err(|source| socket_error("sending a replayed batch", source))?;
            }
            let end = framing.end(prefix);
            replay
                .send_multipart(end, 0)
                .map_err(|source| socket_error("ending a replay", source))?;
            served += 1;
        }
    }

    /// Sends `[topic, next_seq, payload]` and numbers it.
    fn send(&mut self, payload: &[u8]) -> Result<u64, PublishError> {
        let seq = self.next_seq;
        let frames = [&self.topic[..], &seq.to_be_bytes()[..], payload];
        self.socket
            .send_multipart(frames, 0)
            .map_err(|source| socket_error("sending a batch", source))?;
        self.next_seq += 1;
        Ok(seq)
    }

    /// Keeps `payload` as batch `seq` for replays, dropping the oldest past the buffer's size
    /// and reusing its allocation for the next batch.
    fn keep_for_replay(&mut self, seq: u64, payload: Vec<u8>) {
        if self.keep == 0 {
            self.scratch = payload;
            return;
        }
        if self.kept.len() == self.keep
            && let Some((_, oldest)) = self.kept.pop_front()
        {
            self.scratch = oldest;
        }
        self.kept.push_back((seq, payload));
    }
}

/// How a dialect frames replay replies.
struct ReplayFraming<'a> {
    /// The topic frame, when the dialect sends one.
    topic: Option<&'a [u8]>,
}

impl<'a> ReplayFraming<'a> {
    fn of(dialect: Dialect, topic: &'a [u8]) -> ReplayFraming<'a> {
        ReplayFraming {
            topic: dialect.replay_topic_frame().then_some(topic),
        }
    }

    /// A replayed batch: the client's `prefix`, the topic if sent, `seq`, `payload`.
    fn reply<'b>(
        &'b self,
        prefix: &'b [Vec<u8>],
        seq: &'b [u8],
        payload: &'b [u8],
    ) -> Vec<&'b [u8]> {
        let mut frames: Vec<&[u8]> = prefix.iter().map(Vec::as_slice).collect();
        frames.extend(self.topic);
        frames.extend([seq, payload]);
        frames
    }

    /// The end of a replay: the client's `prefix`, an empty topic if topics are sent,
    /// [`REPLAY_END`], an empty payload.
    fn end<'b>(&self, prefix: &'b [Vec<u8>]) -> Vec<&'b [u8]> {
        let mut frames: Vec<&[u8]> = prefix.iter().map(Vec::as_slice).collect();
        frames.extend(self.topic.map(|_| &[][..]));
        frames.extend([&REPLAY_END[..], &[]]);
        frames
    }
}

/// The start of a replay request and the frames to echo before each reply (the client's
/// identity, and its empty delimiter when it sent one).
fn parse_replay_request(frames: &[Vec<u8>]) -> Option<(u64, &[Vec<u8>])> {
    let (start, prefix) = frames.split_last()?;
    let valid_prefix = match prefix {
        [_identity] => true,
        [_identity, delimiter] => delimiter.is_empty(),
        _ => false,
    };
    let start: [u8; 8] = start.as_slice().try_into().ok()?;
    valid_prefix.then_some((u64::from_be_bytes(start), prefix))
}

/// A socket of `kind` bound to `endpoint`.
fn bound(
    context: &zmq::Context,
    kind: zmq::SocketType,
    role: &'static str,
    endpoint: &str,
) -> Result<zmq::Socket, PublishError> {
    let bind_error = |source| PublishError::Bind {
        role,
        endpoint: endpoint.to_owned(),
        source,
    };
    let socket = context.socket(kind).map_err(bind_error)?;
    socket
        .set_linger(0)
        .map_err(|source| socket_error("setting linger", source))?;
    socket.bind(endpoint).map_err(bind_error)?;
    Ok(socket)
}

/// The endpoint `socket` is bound to, its port resolved.
fn last_endpoint(socket: &zmq::Socket) -> Result<String, PublishError> {
    match socket.get_last_endpoint() {
        Ok(Ok(endpoint)) => Ok(endpoint),
        Ok(Err(_)) => Err(socket_error(
            "reading the bound endpoint",
            zmq::Error::EINVAL,
        )),
        Err(source) => Err(socket_error("reading the bound endpoint", source)),
    }
}

fn socket_error(operation: &'static str, source: zmq::Error) -> PublishError {
    PublishError::Socket { operation, source }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replay_request_is_an_identity_an_optional_delimiter_and_8_bytes() {
        let start = 42u64.to_be_bytes().to_vec();
        let identity = vec![0, 1, 2];
        let with_delimiter = [identity.clone(), Vec::new(), start.clone()];
        let (seq, prefix) = parse_replay_request(&with_delimiter).unwrap();
        assert_eq!((seq, prefix.len()), (42, 2));
        let without_delimiter = [identity.clone(), start.clone()];
        let (seq, prefix) = parse_replay_request(&without_delimiter).unwrap();
        assert_eq!((seq, prefix.len()), (42, 1));
        assert!(parse_replay_request(&[identity.clone(), vec![1], start.clone()]).is_none());
        assert!(parse_replay_request(&[identity, vec![1, 2, 3]]).is_none());
        assert!(parse_replay_request(&[start]).is_none());
    }

    #[test]
    fn the_buffer_keeps_the_last_batches_and_numbers_count_up() {
        let context = zmq::Context::new();
        let config = PublisherConfig {
            replay_buffer_batches: 2,
            ..PublisherConfig::default()
        };
        let encoder = EventEncoder::new(4).unwrap();
        let mut publisher = EventPublisher::bind(&context, &config, encoder).unwrap();
        assert!(publisher.endpoint().starts_with("tcp://127.0.0.1:"));
        assert!(!publisher.endpoint().ends_with('*'));
        for (expected, payload) in [b"a", b"b", b"c"].into_iter().enumerate() {
            assert_eq!(publisher.publish_payload(payload).unwrap(), expected as u64);
        }
        let kept: Vec<(u64, Vec<u8>)> = publisher.kept.iter().cloned().collect();
        assert_eq!(kept, [(1, b"b".to_vec()), (2, b"c".to_vec())]);
        assert_eq!(publisher.publish_events(0.0, &[]).unwrap(), None);
        assert_eq!(publisher.next_seq(), 3);
    }

    #[test]
    fn binding_a_taken_endpoint_names_it() {
        let context = zmq::Context::new();
        let encoder = EventEncoder::new(4).unwrap();
        let config = PublisherConfig::default();
        let first = EventPublisher::bind(&context, &config, encoder.clone()).unwrap();
        let config = PublisherConfig {
            endpoint: first.endpoint().to_owned(),
            ..PublisherConfig::default()
        };
        let error = EventPublisher::bind(&context, &config, encoder).unwrap_err();
        assert!(
            matches!(&error, PublishError::Bind { role: "PUB", endpoint, .. } if endpoint == first.endpoint()),
            "{error}"
        );
        assert!(error.to_string().contains("is the port taken"), "{error}");
    }
}
