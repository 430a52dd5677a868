//! The subscriber: a SUB socket on one publisher that hands out its batches in sequence order,
//! decoded, asking the publisher's replay socket for any it missed (a late join, a dropped
//! message). It reads every dialect, and replay replies with or without the topic frame.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::decoder::EventBatch;
use crate::error::{DecodeError, SubscribeError};
use crate::publisher::REPLAY_END;

/// How long [`EventSubscriber::catch_up`] waits on the live stream before it asks for a
/// replay.
const LIVE_WAIT: Duration = Duration::from_millis(20);

/// One batch as published, and decoded.
#[derive(Debug, Clone, PartialEq)]
pub struct ReceivedBatch {
    /// Its sequence number.
    pub seq: u64,
    /// The msgpack batch.
    pub payload: Vec<u8>,
    /// Its events, or why the payload is not a batch of any dialect (such a batch still takes
    /// its place in the sequence, and [`EventSubscriber::undecodable`] counts it).
    pub decoded: Result<EventBatch, DecodeError>,
}

/// A subscription to one publisher's batches, handed out in order and without gaps.
pub struct EventSubscriber {
    socket: zmq::Socket,
    replay: Option<(zmq::Socket, String)>,
    next_seq: u64,
    /// Batches fetched by a replay, `(seq, payload)` in order, not yet handed out.
    pending: VecDeque<(u64, Vec<u8>)>,
    undecodable: u64,
}

impl std::fmt::Debug for EventSubscriber {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventSubscriber")
            .field(
                "replay",
                &self.replay.as_ref().map(|(_, endpoint)| endpoint),
            )
            .field("next_seq", &self.next_seq)
            .field("pending", &self.pending.len())
            .field("undecodable", &self.undecodable)
            .finish()
    }
}

impl EventSubscriber {
    /// Subscribes to `topic` (a prefix) at `endpoint`, asking `replay_endpoint` (when given)
    /// for missed batches. Expects batch 0 first: a subscriber that joins a running publisher
    /// gets the earlier batches by replay.
    pub fn connect(
        context: &zmq::Context,
        endpoint: &str,
        replay_endpoint: Option<&str>,
        topic: &str,
    ) -> Result<EventSubscriber, SubscribeError> {
        let socket = connected(context, zmq::SUB, "SUB", endpoint)?;
        socket
            .set_subscribe(topic.as_bytes())
            .map_err(|source| socket_error("subscribing", source))?;
        let replay = match replay_endpoint {
            Some(replay_endpoint) => {
                let replay = connected(context, zmq::DEALER, "replay DEALER", replay_endpoint)?;
                Some((replay, replay_endpoint.to_owned()))
            }
            None => None,
        };
        Ok(EventSubscriber {
            socket,
            replay,
            next_seq: 0,
            pending: VecDeque::new(),
            undecodable: 0,
        })
    }

    /// The sequence number of the next batch this subscriber hands out.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// How many of the batches handed out did not decode.
    pub fn undecodable(&self) -> u64 {
        self.undecodable
    }

    /// The next batch in order, waiting up to `timeout` for it; `None` if none came. A live
    /// batch past the next expected one makes it ask for a replay of those in between; fails
    /// with [`SubscribeError::Lost`] when the publisher no longer keeps them (or serves no
    /// replays).
    pub fn recv(&mut self, timeout: Duration) -> Result<Option<ReceivedBatch>, SubscribeError> {
        if let Some((seq, payload)) = self.pending.pop_front() {
            return Ok(Some(self.hand_out(seq, payload)));
        }
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let Some((seq, payload)) = self.recv_live(left)? else {
                return Ok(None);
            };
            if seq < self.next_seq {
                continue;
            }
            if seq == self.next_seq {
                return Ok(Some(self.hand_out(seq, payload)));
            }
            self.fill_from_replay(seq, timeout.max(LIVE_WAIT))?;
            let reached = self
                .pending
                .back()
                .map_or(self.next_seq, |(last, _)| last + 1);
            if reached < seq {
                return Err(SubscribeError::Lost {
                    expected: reached,
                    oldest_replayed: seq,
                });
            }
            self.pending.push_back((seq, payload));
            return self.recv(Duration::ZERO);
        }
    }

    /// Every batch up to and including `through`, in order: from the live stream, or by replay
    /// when the live stream brings nothing for a moment (the batch was sent before this
    /// subscriber joined, or dropped). Fails with [`SubscribeError::Timeout`] if they are not
    /// all in within `timeout`.
    pub fn catch_up(
        &mut self,
        through: u64,
        timeout: Duration,
    ) -> Result<Vec<ReceivedBatch>, SubscribeError> {
        let start = Instant::now();
        let mut batches = Vec::new();
        while self.next_seq <= through {
            let waited = start.elapsed();
            if waited >= timeout {
                return Err(SubscribeError::Timeout {
                    target: through,
                    expected: self.next_seq,
                    waited,
                    replay: self
                        .replay
                        .as_ref()
                        .map_or_else(|| "none".to_owned(), |(_, endpoint)| endpoint.clone()),
                });
            }
            match self.recv(LIVE_WAIT.min(timeout - waited))? {
                Some(batch) => batches.push(batch),
                None if self.replay.is_some() => {
                    let left = timeout.saturating_sub(start.elapsed());
                    self.fill_from_replay(through + 1, left)?;
                    while let Some((seq, payload)) = self.pending.pop_front() {
                        batches.push(self.hand_out(seq, payload));
                    }
                }
                None => {}
            }
        }
        Ok(batches)
    }

    /// Batch `seq`, decoded (an undecodable one counted), as the next handed out.
    fn hand_out(&mut self, seq: u64, payload: Vec<u8>) -> ReceivedBatch {
        self.next_seq = seq + 1;
        let decoded = EventBatch::decode(&payload);
        self.undecodable += u64::from(decoded.is_err());
        ReceivedBatch {
            seq,
            payload,
            decoded,
        }
    }

    /// One live message, `(seq, payload)`, waiting up to `timeout`.
    fn recv_live(&self, timeout: Duration) -> Result<Option<(u64, Vec<u8>)>, SubscribeError> {
        if !poll_in(&self.socket, timeout)? {
            return Ok(None);
        }
        let frames = self
            .socket
            .recv_multipart(0)
            .map_err(|source| socket_error("receiving a batch", source))?;
        match <[Vec<u8>; 3]>::try_from(frames) {
            Ok([_topic, seq, payload]) => Ok(Some((sequence_number(&seq, 3)?, payload))),
            Err(frames) => Err(SubscribeError::Malformed {
                frames: frames.len(),
                sequence_bytes: frames.get(1).map_or(0, Vec::len),
            }),
        }
    }

    /// Asks the replay socket for the batches from the next expected one on and queues those
    /// before `until` that follow on without a gap. Fails with [`SubscribeError::Lost`] when
    /// the reply starts past the next expected batch (the publisher no longer keeps it); a
    /// reply with nothing from it on (not sent yet) queues nothing.
    fn fill_from_replay(&mut self, until: u64, timeout: Duration) -> Result<(), SubscribeError> {
        let Some((replay, endpoint)) = &self.replay else {
            return Err(SubscribeError::Lost {
                expected: self.next_seq,
                oldest_replayed: until,
            });
        };
        let request = [&[][..], &self.next_seq.to_be_bytes()[..]];
        replay
            .send_multipart(request, 0)
            .map_err(|source| socket_error("sending a replay request", source))?;
        let deadline = Instant::now() + timeout;
        let mut expected = self.next_seq;
        let mut oldest = None;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if !poll_in(replay, left)? {
                return Err(SubscribeError::Timeout {
                    target: until.saturating_sub(1),
                    expected,
                    waited: timeout,
                    replay: endpoint.clone(),
                });
            }
            let frames = replay
                .recv_multipart(0)
                .map_err(|source| socket_error("receiving a replayed batch", source))?;
            let frame_count = frames.len();
            let (seq, payload) = replay_reply(frames)?;
            if seq == REPLAY_END {
                break;
            }
            let seq = sequence_number(&seq, frame_count)?;
            oldest.get_or_insert(seq);
            if seq == expected && seq < until {
                self.pending.push_back((seq, payload));
                expected += 1;
            }
        }
        if let Some(oldest) = oldest.filter(|&oldest| oldest > self.next_seq) {
            return Err(SubscribeError::Lost {
                expected: self.next_seq,
                oldest_replayed: oldest,
            });
        }
        Ok(())
    }
}

/// The sequence frame and the payload of a replay reply after the request's delimiter:
/// `[delimiter, seq, payload]`, or `[delimiter, topic, seq, payload]` in the dialects that send
/// the topic.
fn replay_reply(frames: Vec<Vec<u8>>) -> Result<(Vec<u8>, Vec<u8>), SubscribeError> {
    let frames = match <[Vec<u8>; 3]>::try_from(frames) {
        Ok([_delimiter, seq, payload]) => return Ok((seq, payload)),
        Err(frames) => frames,
    };
    match <[Vec<u8>; 4]>::try_from(frames) {
        Ok([_delimiter, _topic, seq, payload]) => Ok((seq, payload)),
        Err(frames) => Err(SubscribeError::Malformed {
            frames: frames.len(),
            sequence_bytes: frames.len().checked_sub(2).map_or(0, |at| frames[at].len()),
        }),
    }
}

/// A sequence frame as a number.
fn sequence_number(frame: &[u8], frames: usize) -> Result<u64, SubscribeError> {
    let bytes: [u8; 8] = frame.try_into().map_err(|_| SubscribeError::Malformed {
        frames,
        sequence_bytes: frame.len(),
    })?;
    Ok(u64::from_be_bytes(bytes))
}

/// Whether `socket` has a message within `timeout`.
fn poll_in(socket: &zmq::Socket, timeout: Duration) -> Result<bool, SubscribeError> {
    let millis = i64::try_from(timeout.as_millis()).unwrap_or(i64::MAX);
    let mut items = [socket.as_poll_item(zmq::POLLIN)];
    let ready = zmq::poll(&mut items, millis).map_err(|source| socket_error("polling", source))?;
    Ok(ready > 0)
}

/// A socket of `kind` connected to `endpoint`.
fn connected(
    context: &zmq::Context,
    kind: zmq::SocketType,
    role: &'static str,
    endpoint: &str,
) -> Result<zmq::Socket, SubscribeError> {
    let connect_error = |source| SubscribeError::Connect {
        role,
        endpoint: endpoint.to_owned(),
        source,
    };
    let socket = context.socket(kind).map_err(connect_error)?;
    socket
        .set_linger(0)
        .map_err(|source| socket_error("setting linger", source))?;
    socket.connect(endpoint).map_err(connect_error)?;
    Ok(socket)
}

fn socket_error(operation: &'static str, source: zmq::Error) -> SubscribeError {
    SubscribeError::Socket { operation, source }
}
