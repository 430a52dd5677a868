//! What a node tells its peer so the peer can read its K/V: [`PeerMetadata`], NIXL's own
//! metadata blob (`nixl_capi_get_local_md`) with the node's incarnation and where its pool's
//! rows are ([`PoolDescriptor`]). The bytes travel over whatever channel the two nodes share
//! (here the control channel, [`crate::channel`]); the peer loads them with
//! [`crate::Agent::load_peer`].

use serde::{Deserialize, Serialize};

use kvown_runtime::kv::KvTensor;

use crate::error::NixlError;

/// Where a registered pool's rows are: per layer, the address of its K and V buffers, each
/// `slots` rows of `k_row_bytes` / `v_row_bytes`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolDescriptor {
    /// Element type, as `KvDtype` displays it (`f16`, ...).
    pub dtype: String,
    /// Rows per buffer (the pool's slots, padding included).
    pub slots: usize,
    /// Bytes of one K row.
    pub k_row_bytes: usize,
    /// Bytes of one V row.
    pub v_row_bytes: usize,
    /// Address of each layer's K buffer.
    pub k_buffers: Vec<u64>,
    /// Address of each layer's V buffer.
    pub v_buffers: Vec<u64>,
}

impl PoolDescriptor {
    /// Layers of the pool.
    pub fn layers(&self) -> usize {
        self.k_buffers.len()
    }

    /// Bytes of one row of `tensor`.
    pub fn row_bytes(&self, tensor: KvTensor) -> usize {
        match tensor {
            KvTensor::K => self.k_row_bytes,
            KvTensor::V => self.v_row_bytes,
        }
    }

    /// Address of `tensor`'s row `slot` in `layer`. The caller checks both against the pool.
    pub(crate) fn row_address(&self, layer: usize, tensor: KvTensor, slot: u32) -> u64 {
        let base = match tensor {
            KvTensor::K => self.k_buffers[layer],
            KvTensor::V => self.v_buffers[layer],
        };
        base + u64::from(slot) * self.row_bytes(tensor) as u64
    }

    /// Bytes one slot holds across every layer, K and V.
    pub fn slot_bytes(&self) -> usize {
        self.layers() * (self.k_row_bytes + self.v_row_bytes)
    }

    /// Fails unless `other` holds the same rows (dtype, layers, row sizes): slot counts may
    /// differ.
    pub fn check_compatible(&self, other: &PoolDescriptor) -> Result<(), NixlError> {
        let shape =
            |p: &PoolDescriptor| (p.dtype.clone(), p.layers(), p.k_row_bytes, p.v_row_bytes);
        if shape(self) != shape(other) {
            return Err(NixlError::PoolMismatch {
                detail: format!(
                    "(dtype, layers, K row bytes, V row bytes): here {:?}, peer {:?}",
                    shape(self),
                    shape(other)
                ),
            });
        }
        Ok(())
    }
}

/// A node's metadata for its peer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerMetadata {
    /// The node's agent name.
    pub agent: String,
    /// Its agent's incarnation ([`crate::Agent::incarnation`]).
    pub incarnation: u64,
    /// Its registered pool.
    pub pool: PoolDescriptor,
    /// NIXL's metadata blob of its agent.
    pub nixl: Vec<u8>,
}

/// The first bytes of [`PeerMetadata::to_bytes`]: the format and its version.
const MAGIC: &[u8; 12] = b"kvown-nixl/1";

impl PeerMetadata {
    /// The metadata as bytes for the channel: a format tag, then MessagePack.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut bytes = MAGIC.to_vec();
        rmp_serde::encode::write(&mut bytes, self).expect("writing to a Vec cannot fail");
        bytes
    }

    /// Metadata read back from [`PeerMetadata::to_bytes`], or [`NixlError::BadMetadata`].
    pub fn from_bytes(bytes: &[u8]) -> Result<PeerMetadata, NixlError> {
        let body = bytes
            .strip_prefix(MAGIC.as_slice())
            .ok_or_else(|| NixlError::BadMetadata {
                reason: format!(
                    "it does not start with {:?}",
                    String::from_utf8_lossy(MAGIC)
                ),
            })?;
        rmp_serde::from_slice(body).map_err(|error| NixlError::BadMetadata {
            reason: error.to_string(),
        })
    }
}

/// A peer whose metadata an agent has loaded: what a transfer to or from it needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadedPeer {
    /// The peer's agent name.
    pub agent: String,
    /// The incarnation loaded.
    pub incarnation: u64,
    /// The peer's pool.
    pub pool: PoolDescriptor,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn descriptor() -> PoolDescriptor {
        PoolDescriptor {
            dtype: "f16".into(),
            slots: 32,
            k_row_bytes: 256,
            v_row_bytes: 128,
            k_buffers: vec![0x1000, 0x9000],
            v_buffers: vec![0x5000, 0xd000],
        }
    }

    #[test]
    fn metadata_round_trips_and_foreign_bytes_are_refused() {
        let metadata = PeerMetadata {
            agent: "prefill".into(),
            incarnation: 7,
            pool: descriptor(),
            nixl: vec![1, 2, 3],
        };
        let bytes = metadata.to_bytes();
        assert_eq!(PeerMetadata::from_bytes(&bytes).unwrap(), metadata);
        for foreign in [&b""[..], b"kvown-nixl/2xxxx", &bytes[..bytes.len() - 1]] {
            assert!(matches!(
                PeerMetadata::from_bytes(foreign),
                Err(NixlError::BadMetadata { .. })
            ));
        }
    }

    #[test]
    fn rows_are_addressed_per_layer_and_tensor_and_shapes_are_compared() {
        let pool = descriptor();
        assert_eq!(pool.row_address(1, KvTensor::K, 3), 0x9000 + 3 * 256);
        assert_eq!(pool.row_address(0, KvTensor::V, 2), 0x5000 + 2 * 128);
        assert_eq!(pool.slot_bytes(), 2 * (256 + 128));
        let mut other = descriptor();
        other.slots = 64;
        other.k_buffers = vec![1, 2];
        assert!(pool.check_compatible(&other).is_ok());
        other.v_row_bytes = 256;
        let error = pool.check_compatible(&other).unwrap_err().to_string();
        assert!(error.contains("(\"f16\", 2, 256, 128)"), "{error}");
    }
}
