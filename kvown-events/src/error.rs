//! Errors of the encoder, the publisher and the subscriber, each with what a caller needs to
//! act on it.

use std::time::Duration;

use thiserror::Error;

/// Why a batch could not be encoded, or an encoder not made.
#[derive(Debug, Error)]
pub enum EncodeError {
    /// The page size cannot be the wire's `block_size`.
    #[error(
        "page size {page_size} cannot be a block size: it must be between 1 and {max}",
        max = u32::MAX
    )]
    BlockSize {
        /// The page size given.
        page_size: usize,
    },
    /// A stored run's tokens are not whole pages of the encoder's block size: the encoder was
    /// made for another page size than the cache's.
    #[error(
        "a stored run of {pages} pages holds {tokens} tokens, not {block_size} per page: make \
         the encoder with the cache's page size"
    )]
    PageSizeMismatch {
        /// Pages in the run.
        pages: usize,
        /// Tokens in the run.
        tokens: usize,
        /// The encoder's block size.
        block_size: u32,
    },
    /// A namespace was given an empty label.
    #[error(
        "namespace {namespace} is named with an empty string, which a router reads as no \
         namespace (mixing its pages with the default's): give it a non-empty name"
    )]
    EmptyNamespaceName {
        /// The namespace.
        namespace: u32,
    },
    /// msgpack refused a value (only a writer that fails can cause it).
    #[error("msgpack encoding failed: {0}")]
    Msgpack(#[from] rmp_serde::encode::Error),
}

/// A dialect name that is none of kvown's.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("unknown KV-event dialect {name:?}: the dialects are vllm, vllm-legacy and sglang")]
pub struct UnknownDialect {
    /// The name given.
    pub name: String,
}

/// Why a payload is not an event batch of any dialect.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("undecodable KV-event batch: {reason}")]
pub struct DecodeError {
    /// What the decoder found wrong, and where.
    pub reason: String,
}

impl From<rmp_serde::decode::Error> for DecodeError {
    fn from(error: rmp_serde::decode::Error) -> DecodeError {
        DecodeError {
            reason: error.to_string(),
        }
    }
}

/// Why the publisher could not bind, publish or serve a replay.
#[derive(Debug, Error)]
pub enum PublishError {
    /// A socket could not bind its endpoint.
    #[error(
        "cannot bind the {role} socket to {endpoint}: {source} (is the port taken? \
         `tcp://127.0.0.1:*` picks a free one)"
    )]
    Bind {
        /// `"PUB"` or `"replay ROUTER"`.
        role: &'static str,
        /// The endpoint given.
        endpoint: String,
        /// What ZMQ said.
        source: zmq::Error,
    },
    /// A ZMQ call failed on a bound socket.
    #[error("ZMQ {operation} failed: {source}")]
    Socket {
        /// What was being done.
        operation: &'static str,
        /// What ZMQ said.
        source: zmq::Error,
    },
    /// The batch could not be encoded.
    #[error(transparent)]
    Encode(#[from] EncodeError),
    /// The publisher thread could not be started.
    #[error("cannot start the publisher thread: {source}")]
    Thread {
        /// What the system said.
        source: std::io::Error,
    },
    /// The publisher thread stopped on an error; `PublisherThread::finish` returns it.
    #[error("the publisher thread has stopped: call `PublisherThread::finish` for its error")]
    Stopped,
}

/// Why the subscriber could not connect or hand out the next batch.
#[derive(Debug, Error)]
pub enum SubscribeError {
    /// A socket could not connect to its endpoint.
    #[error("cannot connect the {role} socket to {endpoint}: {source}")]
    Connect {
        /// `"SUB"` or `"replay DEALER"`.
        role: &'static str,
        /// The endpoint given.
        endpoint: String,
        /// What ZMQ said.
        source: zmq::Error,
    },
    /// A ZMQ call failed on a connected socket.
    #[error("ZMQ {operation} failed: {source}")]
    Socket {
        /// What was being done.
        operation: &'static str,
        /// What ZMQ said.
        source: zmq::Error,
    },
    /// A message was not `[topic, 8-byte big-endian sequence number, payload]` (a replay
    /// reply: with or without the topic).
    #[error(
        "malformed KV-event message ({frames} frames, sequence frame of {sequence_bytes} \
         bytes): the stream sends [topic, 8-byte big-endian sequence number, payload] (replays \
         the same, the topic optional); is the endpoint a KV-event publisher?"
    )]
    Malformed {
        /// Frames received.
        frames: usize,
        /// Bytes of the frame where the sequence number belongs (0 when absent).
        sequence_bytes: usize,
    },
    /// Batches the subscriber has not seen are gone from the publisher's replay buffer.
    #[error(
        "batches {expected}..{oldest_replayed} are lost: the publisher's replay buffer no longer \
         holds them; drop this replica's index entries and restart its stream (kvown: \
         `enable_cache_events` again)"
    )]
    Lost {
        /// The first sequence number not received.
        expected: u64,
        /// The oldest the replay returned (or the live stream's next, when the replay returned
        /// nothing older).
        oldest_replayed: u64,
    },
    /// The publisher did not deliver (live or by replay) within the time given.
    #[error(
        "no batch {target} within {waited:?} (next expected: {expected}; replay endpoint: \
         {replay}): is the publisher running and serving replays?"
    )]
    Timeout {
        /// The sequence number waited for.
        target: u64,
        /// The next sequence number expected.
        expected: u64,
        /// How long it waited.
        waited: Duration,
        /// The replay endpoint, or `"none"`.
        replay: String,
    },
}
