//! Why NIXL cannot be used here ([`Unavailable`]) and why a call failed ([`NixlError`]).

use std::time::Duration;

use kvown_runtime::kv::TransferId;

/// Why NIXL's C API cannot be used on this machine. Nothing else in kvown needs it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unavailable {
    /// No candidate `libnixl_capi.so` loaded; every path tried, with the loader's answer.
    #[error(
        "NIXL's C API (libnixl_capi.so) could not be loaded; tried: {}. Run \
         scripts/install-nixl.sh, or set KVOWN_NIXL_LIB to the library or its folder",
        tried.join("; ")
    )]
    NotFound {
        /// `path: loader error` for every candidate.
        tried: Vec<String>,
    },
    /// A library loaded but lacks a function this crate declares (not NIXL's C API, or an
    /// older one).
    #[error("{path} lacks {symbol} ({detail}): not NIXL's C API, or a version older than 1.5")]
    MissingSymbol {
        /// The library.
        path: String,
        /// The missing function.
        symbol: &'static str,
        /// The loader's message.
        detail: String,
    },
    /// The library is the stub `nixl-sys` builds without NIXL: every call would fail.
    #[error("{path} is NIXL's stub C API (built without NIXL): install the real one")]
    Stub {
        /// The library.
        path: String,
    },
}

/// A NIXL status that is not success (`nixl_capi_status_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum NixlStatus {
    /// `NIXL_CAPI_ERROR_INVALID_PARAM`.
    #[error("invalid parameter")]
    InvalidParam,
    /// `NIXL_CAPI_ERROR_BACKEND`: the backend (UCX) failed; NIXL folds most failures into it.
    #[error("backend error")]
    Backend,
    /// `NIXL_CAPI_ERROR_INVALID_STATE`.
    #[error("invalid state")]
    InvalidState,
    /// `NIXL_CAPI_ERROR_EXCEPTION`.
    #[error("exception inside NIXL")]
    Exception,
    /// `NIXL_CAPI_ERROR_NOT_FOUND`: metadata not loaded, or no backend serves the request.
    #[error("not found")]
    NotFound,
    /// A code this crate does not know.
    #[error("status {0}")]
    Other(i32),
}

impl NixlStatus {
    /// The status of a failed call's code (never 0 or 1, which are not failures).
    pub(crate) fn from_code(code: i32) -> NixlStatus {
        match code {
            -1 => NixlStatus::InvalidParam,
            -2 => NixlStatus::Backend,
            -3 => NixlStatus::InvalidState,
            -4 => NixlStatus::Exception,
            -6 => NixlStatus::NotFound,
            other => NixlStatus::Other(other),
        }
    }
}

/// Why a NIXL operation failed. A call that returns one holds nothing it took: a refused submit
/// holds no NIXL request; a refused load (stale or bad metadata) leaves the loaded peers as they
/// were, except that a restarted peer's old metadata is invalidated before its new is loaded.
#[derive(Debug, thiserror::Error)]
pub enum NixlError {
    /// NIXL's C API is not available.
    #[error(transparent)]
    Unavailable(#[from] Unavailable),
    /// The host pool could not be made (its memory refused).
    #[error(transparent)]
    Pool(kvown_runtime::kv::KvPoolError),
    /// A NIXL call failed.
    #[error("{call} failed: {status}")]
    Call {
        /// The C function.
        call: &'static str,
        /// Its status.
        status: NixlStatus,
    },
    /// An agent or peer name with a NUL byte, which C cannot take.
    #[error("the name {name:?} holds a NUL byte")]
    BadName {
        /// The name.
        name: String,
    },
    /// Bytes offered as a peer's metadata are not what [`crate::PeerMetadata::to_bytes`]
    /// writes, or NIXL refused the metadata inside them.
    #[error("not a peer's metadata: {reason}")]
    BadMetadata {
        /// What was wrong.
        reason: String,
    },
    /// No metadata of this peer is loaded: it never sent any, or it was forgotten.
    #[error("no metadata of peer {agent:?} is loaded; load the peer's metadata first")]
    UnknownPeer {
        /// The peer's agent name.
        agent: String,
    },
    /// Metadata of an older incarnation of a peer than the one loaded: a restarted peer's
    /// predecessor. It is refused; the loaded one stays.
    #[error(
        "metadata of peer {agent:?} is stale: incarnation {offered}, but {loaded} (newer) is \
         loaded"
    )]
    StaleMetadata {
        /// The peer's agent name.
        agent: String,
        /// The incarnation loaded.
        loaded: u64,
        /// The incarnation offered.
        offered: u64,
    },
    /// The peer a transfer was set up for has restarted (another incarnation is loaded): the
    /// memory the link knows is gone, so nothing is posted.
    #[error(
        "peer {agent:?} restarted (this link knows incarnation {expected}, the agent has \
         {current} loaded); set the link up again from the peer's new metadata"
    )]
    PeerRestarted {
        /// The peer's agent name.
        agent: String,
        /// The incarnation this link was set up for.
        expected: u64,
        /// The incarnation loaded now.
        current: u64,
    },
    /// The two pools do not hold the same rows: a transfer would mix models.
    #[error("the pools differ ({detail}); both nodes must hold the same model's K/V")]
    PoolMismatch {
        /// What differs.
        detail: String,
    },
    /// The two slot lists differ in length.
    #[error("{src} source slots but {dst} destination slots: a transfer pairs them one to one")]
    LengthMismatch {
        /// Source slots.
        src: usize,
        /// Destination slots.
        dst: usize,
    },
    /// A slot past the end of its pool.
    #[error("{side} slot {slot} is past the pool's {slots} slots")]
    SlotOutOfRange {
        /// `"source"` or `"destination"`.
        side: &'static str,
        /// The slot.
        slot: u32,
        /// Slots in that pool.
        slots: usize,
    },
    /// A transfer did not complete within its deadline; its NIXL request was released, so it
    /// moves nothing more.
    #[error("transfer {} did not complete within {after:?}; it was cancelled", transfer.0)]
    TimedOut {
        /// The transfer.
        transfer: TransferId,
        /// The deadline it missed.
        after: Duration,
    },
    /// A posted transfer ended in an error (the peer died, its memory went away).
    #[error("transfer {} failed: {status}", transfer.0)]
    TransferFailed {
        /// The transfer.
        transfer: TransferId,
        /// NIXL's status.
        status: NixlStatus,
    },
    /// The peer's control channel closed or broke: the peer process is gone.
    #[error("peer lost: {detail}")]
    PeerLost {
        /// What was seen.
        detail: String,
    },
    /// A control message that could not be written or read.
    #[error("control channel: {detail}")]
    Channel {
        /// What went wrong.
        detail: String,
    },
}
