//! kvown's prefix-cache events in the KV-event formats of vLLM and sglang, so that kvown
//! replicas can sit behind a KV-aware router (NVIDIA Dynamo's, llm-d's indexer, or one written
//! against vLLM's or sglang's event classes).
//!
//! * [`EventEncoder`] turns the runtime's [`CacheEvent`]s into one msgpack event batch
//!   `[timestamp, [events...], rank]` of `BlockStored`, `BlockRemoved` and `AllBlocksCleared`
//!   events (`medium` `"GPU"`, a page per block: `block_size` = the cache's page size; partial
//!   pages are never cached, so never sent), in a [`Dialect`]: `vllm` (the default: vLLM
//!   0.24 to 0.34's tagged maps), `vllm-legacy` (the positional form of vLLM 0.11 to 0.23 and
//!   sglang 0.5.15 to 0.5.19) or `sglang` (sglang 0.5.20 to 0.5.23).
//! * [`EventPublisher`] sends each batch on a ZMQ PUB socket as the 3-frame message
//!   `[topic, 8-byte big-endian sequence number, payload]`, keeps the last batches for late
//!   subscribers and answers their replay requests on a ROUTER socket, framed as the
//!   dialect's engine frames them. [`PublisherThread`] runs it on a thread of its own (as vLLM
//!   does), so that the engine's step only hands its events over.
//! * [`EventSubscriber`] is the other end: a SUB socket that hands out batches in sequence
//!   order, filling gaps from the publisher's replay buffer, each decoded ([`EventBatch`], any
//!   dialect) or, when it does not decode, counted and handed out with the reason.
//!
//! Block ids are the runtime's [`PageHash`]es: a chained hash of the namespace and of every
//! token up to the page's end, so the same token chain gets the same id on every replica, and
//! a page's parent id is the id of the page before it. Namespaces travel as an adapter or a
//! cache salt ([`NamespaceLabels`]) in the fields each dialect has for them; a router must
//! pass the same label when it hashes a request.
//!
//! A replica publishing what each scheduler step did to its prefix cache:
//!
//! ```
//! use kvown_events::{
//!     Context, Dialect, EventEncoder, NamespaceLabels, PublisherConfig, PublisherThread,
//! };
//! use kvown_runtime::alloc::PagedAllocator;
//! use kvown_runtime::cache::{KvCache, TreeCache};
//! use kvown_runtime::radix::{Namespace, RadixCache, RadixConfig};
//! use kvown_runtime::slots::ReqToTokenPool;
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let tree = TreeCache::Radix(RadixCache::new(RadixConfig::new(16))?);
//! let rows = ReqToTokenPool::new(8, 512)?;
//! let mut cache = KvCache::new(PagedAllocator::new(1024, 16, false)?, rows, tree)?;
//! let labels = NamespaceLabels::lora_names().with_name(Namespace(1), "sql-adapter")?;
//! let encoder = EventEncoder::new(cache.page_size())?
//!     .with_dialect(Dialect::Vllm)
//!     .with_namespaces(labels);
//! let config = PublisherConfig::default(); // tcp://127.0.0.1:*, a replay socket too
//! let mut publisher = PublisherThread::spawn(&Context::new(), &config, encoder, 1024)?;
//! cache.enable_cache_events();
//! // After each scheduler step:
//! let seq = publisher.publish(cache.take_cache_events())?;
//! assert_eq!(seq, Some(0), "the stream opens with AllBlocksCleared");
//! assert_eq!(publisher.finish()?, 1);
//! # Ok(())
//! # }
//! ```
//!
//! [`CacheEvent`]: kvown_runtime::radix::CacheEvent
//! [`PageHash`]: kvown_runtime::radix::PageHash

mod decoder;
mod dialect;
mod encoder;
mod error;
mod namespace;
mod publisher;
mod publisher_thread;
mod subscriber;

pub use decoder::{BlockEvent, EventBatch, ExtraKey, RemovedBlocks, StoredBlocks};
pub use dialect::Dialect;
pub use encoder::{EventEncoder, MEDIUM};
pub use error::{DecodeError, EncodeError, PublishError, SubscribeError, UnknownDialect};
pub use namespace::{NamespaceField, NamespaceLabel, NamespaceLabels};
pub use publisher::{EventPublisher, PublisherConfig, REPLAY_END};
pub use publisher_thread::PublisherThread;
pub use subscriber::{EventSubscriber, ReceivedBatch};
pub use zmq::Context;
