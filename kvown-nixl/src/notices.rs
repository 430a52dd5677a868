//! The source side of a transfer: the notice a completed READ delivers to the node that holds
//! the K/V ([`notice`], [`parse_notice`]), and [`Holds`], the requests that node keeps until
//! their notice arrives, their deadline passes or their reader is lost.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::agent::{Agent, Notification};
use crate::error::NixlError;

/// The first bytes of a notice: the format and its version.
const NOTICE_MAGIC: &[u8; 8] = b"kvownxf1";

/// The notification a transfer tagged `tag` delivers to its source on completion.
pub fn notice(tag: u64) -> [u8; 16] {
    let mut bytes = [0; 16];
    bytes[..8].copy_from_slice(NOTICE_MAGIC);
    bytes[8..].copy_from_slice(&tag.to_le_bytes());
    bytes
}

/// The tag of a notice written by [`notice`]; `None` for any other message.
pub fn parse_notice(message: &[u8]) -> Option<u64> {
    let tag = message.strip_prefix(NOTICE_MAGIC.as_slice())?;
    Some(u64::from_le_bytes(tag.try_into().ok()?))
}

/// Why a held item left [`Holds`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Released {
    /// Its reader's notice arrived: the K/V was read.
    Read,
    /// Its deadline passed with no notice.
    Expired,
    /// The reader asked for it to be dropped (it rejected the request).
    Dropped,
    /// The reader is gone (its control channel closed).
    ReaderLost,
}

/// Items a source node keeps, by transfer tag, until they may be let go: their K/V has been
/// read, their reader gave up on them or died, or they waited past `hold_for`. A source lets
/// its K/V slots go only through here, so each leaves exactly once.
#[derive(Debug)]
pub struct Holds<T> {
    hold_for: Duration,
    held: HashMap<u64, (T, Instant)>,
    /// Notices whose item was not held (yet): a notice can overtake the control message that
    /// announces its item, so it is kept and matched when the item arrives (one whose item
    /// never comes stays until [`Holds::reader_lost`]).
    early: Vec<u64>,
}

impl<T> Holds<T> {
    /// Holds that let an item go `hold_for` after it was held if no notice came.
    pub fn new(hold_for: Duration) -> Self {
        Holds {
            hold_for,
            held: HashMap::new(),
            early: Vec::new(),
        }
    }

    /// Holds `item` under `tag`, or hands it straight back as [`Released::Read`] if its notice
    /// came already. Returns the item back under a tag already held.
    pub fn hold(&mut self, tag: u64, item: T) -> Result<Option<(T, Released)>, T> {
        if let Some(at) = self.early.iter().position(|&early| early == tag) {
            self.early.swap_remove(at);
            return Ok(Some((item, Released::Read)));
        }
        if self.held.contains_key(&tag) {
            return Err(item);
        }
        self.held
            .insert(tag, (item, Instant::now() + self.hold_for));
        Ok(None)
    }

    /// Items held now.
    pub fn len(&self) -> usize {
        self.held.len()
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    /// The items held now.
    pub fn items(&self) -> impl Iterator<Item = &T> {
        self.held.values().map(|(item, _)| item)
    }

    /// Reads `agent`'s notifications and releases the items they name (other messages are
    /// ignored), then those past their deadline; appends each with why to `out`.
    pub fn poll(&mut self, agent: &Agent, out: &mut Vec<(T, Released)>) -> Result<(), NixlError> {
        let mut notifications: Vec<Notification> = Vec::new();
        agent.take_notifications(&mut notifications)?;
        for tag in notifications
            .iter()
            .filter_map(|n| parse_notice(&n.message))
        {
            match self.held.remove(&tag) {
                Some((item, _)) => out.push((item, Released::Read)),
                None => self.early.push(tag),
            }
        }
        let now = Instant::now();
        let expired: Vec<u64> = self
            .held
            .iter()
            .filter(|(_, (_, deadline))| *deadline <= now)
            .map(|(&tag, _)| tag)
            .collect();
        for tag in expired {
            let (item, _) = self.held.remove(&tag).expect("listed above");
            out.push((item, Released::Expired));
        }
        Ok(())
    }

    /// Releases the item under `tag` because its reader dropped it.
    pub fn drop_tag(&mut self, tag: u64) -> Option<(T, Released)> {
        self.held
            .remove(&tag)
            .map(|(item, _)| (item, Released::Dropped))
    }

    /// Releases everything: the reader is gone.
    pub fn reader_lost(&mut self) -> Vec<(T, Released)> {
        self.early.clear();
        self.held
            .drain()
            .map(|(_, (item, _))| (item, Released::ReaderLost))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notices_round_trip_and_other_messages_are_not_notices() {
        assert_eq!(parse_notice(&notice(0xfeed_beef)), Some(0xfeed_beef));
        assert_eq!(parse_notice(b"kvownxf1short"), None);
        assert_eq!(parse_notice(b"something else entirely"), None);
    }

    #[test]
    fn an_item_leaves_once_whatever_releases_it() {
        let mut holds = Holds::new(Duration::from_secs(60));
        assert!(holds.hold(1, "a").unwrap().is_none());
        assert!(holds.hold(2, "b").unwrap().is_none());
        assert_eq!(holds.hold(1, "again"), Err("again"));
        assert_eq!(holds.drop_tag(1), Some(("a", Released::Dropped)));
        assert_eq!(holds.drop_tag(1), None);
        assert_eq!(holds.reader_lost(), vec![("b", Released::ReaderLost)]);
        assert!(holds.is_empty());
        // A notice that came first releases its item as it is held.
        holds.early.push(3);
        assert_eq!(holds.hold(3, "c").unwrap(), Some(("c", Released::Read)));
        assert!(holds.is_empty());
    }
}
