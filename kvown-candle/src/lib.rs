//! kvown-candle: a real transformer whose K/V lives in kvown's paged cache.
//!
//! [`PagedLlama`] is a Llama-architecture model in [candle](https://docs.rs/candle-core) that
//! loads the same `config.json` and safetensors names as candle-transformers'
//! `models::llama::Llama`, and computes a ragged [`ForwardBatch`] built from kvown's batch flow:
//! the step's K/V is stored at kvown's `out_cache_loc` in a [`TensorKvPool`] (kvown's `KvPool`
//! with candle tensors as storage), and each request attends over the K/V its request-to-token
//! row names. [`Server`] is a continuous-batching loop over it: radix prefix cache, chunked
//! prefill, eviction, retraction with re-prefill, speculative decoding and disaggregated
//! prefill with K/V moved through kvown's `KvTransfer`.
//!
//! The crate's differential test runs that loop against candle-transformers' `Llama` with a
//! dense cache per request and checks every step's logits.
//!
//! Modules, each one job: [`config`] (the checkpoint's `config.json`), [`pool`] (the K/V pool),
//! [`forward_batch`] (one step's inputs), [`model`] (the network), [`sampling`], [`serve`]
//! (the loop), [`workload`] (multi-turn conversations), [`random`] (checkpoints with random
//! weights; nothing is downloaded).
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod config;
pub mod error;
pub mod forward_batch;
pub mod model;
pub mod pool;
pub mod random;
pub mod sampling;
pub mod serve;
#[cfg(feature = "tokenizers")]
pub mod text;
pub mod workload;

pub use config::LlamaConfig;
pub use error::{BatchError, ModelError, RequestError, ServeError};
pub use forward_batch::{ForwardBatch, LogitRows, SeqInput};
pub use model::{Logits, PagedLlama};
pub use pool::TensorKvPool;
pub use sampling::Sampling;
pub use serve::{
    Draft, Finished, Request, ServeConfig, ServeStats, Server, SpecConfig, StepOutput, TransferLink,
};
