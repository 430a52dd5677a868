//! kvown-events' integration tests, one binary.
//!
//! * `wire_roundtrip`: kvown's batches of every dialect through Dynamo's decoder and index and
//!   through kvown's own decoder, no socket.
//! * `loopback`: real ZMQ sockets on 127.0.0.1: late subscribers, replays framed per dialect,
//!   lost batches, undecodable batches, the publisher thread.
//! * `differential`: Dynamo's overlap score equals each replica's own match after every step of
//!   random runs, in every dialect.
//! * `fleet_gain`: the fleet example scaled down: KV-aware routing against round robin, the
//!   same routes in every dialect.
//!
//! The engines' own decoders (vLLM's and sglang's event classes) check the wire in
//! `scripts/event-decoders.sh`.

mod differential;
mod fleet_gain;
mod loopback;
mod wire_roundtrip;
