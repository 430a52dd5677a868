//! The crate's errors: [`ModelError`] (loading a checkpoint, computing a batch) and
//! [`ServeError`] (the serving loop). A call that returns one changed nothing.

use std::path::PathBuf;

use kvown_runtime::check::Violation;
use kvown_runtime::error::KvError;
use kvown_runtime::kv::{KvPoolError, TransferError};

/// Why a checkpoint could not be loaded, or a batch not computed.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// A file could not be read or written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The system's reason.
        #[source]
        source: std::io::Error,
    },
    /// `config.json` is not JSON of a Llama config.
    #[error("{}: not a Llama config.json: {source}", path.display())]
    ConfigParse {
        /// The config file.
        path: PathBuf,
        /// Where the JSON went wrong.
        #[source]
        source: serde_json::Error,
    },
    /// The config names a model this crate does not compute.
    #[error(
        "{}: unsupported architecture: {found}; kvown-candle computes LlamaForCausalLM \
         (model_type \"llama\") checkpoints",
        path.display()
    )]
    UnsupportedArchitecture {
        /// The config file.
        path: PathBuf,
        /// What it names.
        found: String,
    },
    /// The config's sizes do not make a Llama.
    #[error("{}: invalid config: {reason}", path.display())]
    InvalidConfig {
        /// The config file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The checkpoint directory has no `*.safetensors` file.
    #[error("{}: no *.safetensors file in the checkpoint directory", dir.display())]
    NoWeights {
        /// The directory.
        dir: PathBuf,
    },
    /// A weights file is not a readable safetensors file.
    #[error("{}: not a readable safetensors file: {source}", path.display())]
    Safetensors {
        /// The file.
        path: PathBuf,
        /// candle's reason.
        #[source]
        source: candle_core::Error,
    },
    /// A tensor the config calls for is in none of the weights files.
    #[error("tensor {tensor} is missing: none of {files:?} holds it")]
    MissingTensor {
        /// The tensor's name (`model.layers.0.self_attn.q_proj.weight`, ...).
        tensor: String,
        /// The files searched.
        files: Vec<PathBuf>,
    },
    /// A tensor's shape is not the one the config calls for.
    #[error("{}: tensor {tensor} has shape {found:?}, the config calls for {expected:?}", file.display())]
    TensorShape {
        /// The tensor's name.
        tensor: String,
        /// The file holding it.
        file: PathBuf,
        /// The shape the config implies.
        expected: Vec<usize>,
        /// The shape in the file.
        found: Vec<usize>,
    },
    /// Two weights files hold the same tensor.
    #[error("tensor {tensor} is in both {} and {}", first.display(), second.display())]
    DuplicateTensor {
        /// The tensor's name.
        tensor: String,
        /// The first file holding it.
        first: PathBuf,
        /// The second.
        second: PathBuf,
    },
    /// `tokenizer.json` could not be read or used.
    #[error("{}: tokenizer: {reason}", path.display())]
    Tokenizer {
        /// The tokenizer file.
        path: PathBuf,
        /// The tokenizer's reason.
        reason: String,
    },
    /// A forward batch that does not describe a computable step (see [`BatchError`]).
    #[error("bad forward batch: {0}")]
    Batch(#[from] BatchError),
    /// The K/V pool refused a store or gather.
    #[error("K/V pool: {0}")]
    Pool(#[from] KvPoolError),
    /// candle refused an operation (a shape or device error inside the forward pass).
    #[error("candle: {0}")]
    Candle(#[from] candle_core::Error),
}

/// Why a [`crate::ForwardBatch`] was refused before anything was computed or stored.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BatchError {
    /// A sequence's extend is empty.
    #[error("request {rid}: an extend of no tokens")]
    EmptyExtend {
        /// The request.
        rid: u64,
    },
    /// A sequence's slots do not match its tokens and positions.
    #[error(
        "request {rid}: {out_slots} out slots and {context} context slots for an extend of \
         {extend} tokens from position {start}; it needs one out slot per token and a context \
         of start + extend slots"
    )]
    ContextLength {
        /// The request.
        rid: u64,
        /// Its first new position.
        start: usize,
        /// Its new tokens.
        extend: usize,
        /// The out slots given.
        out_slots: usize,
        /// The context slots given.
        context: usize,
    },
    /// A position past the model's RoPE tables (`max_position_embeddings`).
    #[error(
        "request {rid}: position {position} is past the model's {max_positions} positions \
         (max_position_embeddings)"
    )]
    PositionPastModel {
        /// The request.
        rid: u64,
        /// The first position out of range.
        position: usize,
        /// Positions the model has.
        max_positions: usize,
    },
    /// A token id past the vocabulary.
    #[error("request {rid}: token {token} is past the vocabulary of {vocab}")]
    TokenOutOfVocab {
        /// The request.
        rid: u64,
        /// The token.
        token: u32,
        /// The vocabulary size.
        vocab: usize,
    },
    /// A slot past the pool.
    #[error("request {rid}: slot {slot} is past the pool's {slots} slots")]
    SlotOutOfRange {
        /// The request.
        rid: u64,
        /// The slot.
        slot: u32,
        /// Slots in the pool.
        slots: usize,
    },
    /// The pool does not hold this model's K/V (layers, heads, width or dtype differ).
    #[error("the K/V pool does not fit the model: {detail}")]
    PoolMismatch {
        /// What differs.
        detail: String,
    },
}

/// Why a request was refused at submission; the server is unchanged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    /// No prompt token.
    #[error("request {rid}: the prompt is empty")]
    EmptyPrompt {
        /// The request.
        rid: u64,
    },
    /// Zero tokens to generate.
    #[error("request {rid}: max_new_tokens is 0")]
    NothingToGenerate {
        /// The request.
        rid: u64,
    },
    /// A request with this id is still in the server.
    #[error("request {rid}: a request with this id is still being served")]
    DuplicateId {
        /// The request.
        rid: u64,
    },
    /// Prompt plus generation would pass the request-to-token table's row.
    #[error(
        "request {rid}: prompt of {prompt} tokens + {max_new_tokens} new tokens needs a context \
         of {needed}, longer than the table's row of {row_width}; raise max_context or shorten it"
    )]
    ContextTooLong {
        /// The request.
        rid: u64,
        /// Prompt tokens.
        prompt: usize,
        /// Tokens to generate.
        max_new_tokens: usize,
        /// Positions it needs (speculative reservations included).
        needed: usize,
        /// The row width.
        row_width: usize,
    },
    /// Prompt plus generation would need more slots than the whole pool has.
    #[error(
        "request {rid}: needs {needed} K/V slots over its life, more than the pool's \
         {pool_tokens}; enlarge pool_tokens or shorten it"
    )]
    LargerThanPool {
        /// The request.
        rid: u64,
        /// Slots it would hold at most.
        needed: usize,
        /// Slots in the pool.
        pool_tokens: usize,
    },
    /// Prompt plus generation would pass the model's positions.
    #[error(
        "request {rid}: a context of {needed} positions is past the model's {max_positions} \
         (max_position_embeddings)"
    )]
    PastModelPositions {
        /// The request.
        rid: u64,
        /// Positions it needs.
        needed: usize,
        /// Positions the model has.
        max_positions: usize,
    },
    /// A prompt token past the vocabulary.
    #[error("request {rid}: prompt token {token} is past the vocabulary of {vocab}")]
    TokenOutOfVocab {
        /// The request.
        rid: u64,
        /// The token.
        token: u32,
        /// The vocabulary size.
        vocab: usize,
    },
}

/// Why the serving loop failed.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The serving configuration cannot work (see the reason).
    #[error("invalid serving config: {0}")]
    Config(String),
    /// A request was refused at submission.
    #[error(transparent)]
    Request(#[from] RequestError),
    /// kvown's batch flow refused a call.
    #[error("kvown: {0}")]
    Kv(#[from] KvError),
    /// A K/V pool refused a call.
    #[error("K/V pool: {0}")]
    Pool(#[from] KvPoolError),
    /// A K/V transfer failed.
    #[error("K/V transfer: {0}")]
    Transfer(#[from] TransferError),
    /// A transfer completed, but the request's K/V on the decode node is not the prefill
    /// node's (digests of every layer's K and V rows differ).
    #[error(
        "K/V transfer of request {rid} ({tokens} positions) completed with other bytes than \
         were sent: digest {received:#x} on the decode node, {sent:#x} on the prefill node"
    )]
    TransferCorrupt {
        /// The request.
        rid: u64,
        /// Positions moved.
        tokens: usize,
        /// The digest of the prefill node's rows.
        sent: u64,
        /// The digest of the decode node's rows.
        received: u64,
    },
    /// The model failed.
    #[error("model: {0}")]
    Model(#[from] ModelError),
    /// The invariant checker found a broken invariant (a bug).
    #[error("invariant check at step {step}: {violation}")]
    Invariant {
        /// The step after which it was found.
        step: u64,
        /// What is broken.
        violation: Violation,
    },
    /// No token was computed for this many steps: the workload cannot make progress.
    #[error("no token computed for {steps} steps: the requests cannot make progress")]
    Stalled {
        /// Steps without progress.
        steps: u64,
    },
    /// Slots or rows were not all free after every request was released and the cache evicted.
    #[error("leak: {0}")]
    Leak(String),
}
