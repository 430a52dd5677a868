//! The control channel between a prefill node and a decode node: a Unix-domain socket carrying
//! length-prefixed MessagePack messages. It carries each node's [`crate::PeerMetadata`] (NIXL's
//! blob inside) and the scheduler's messages (which prompts to compute, where their K/V is);
//! no K/V byte crosses it. Its end is also how a node learns that its peer died:
//! [`NixlError::PeerLost`].

use std::io::{ErrorKind, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::error::NixlError;

/// The largest message accepted (a guard against a corrupt length).
const MAX_MESSAGE: usize = 1 << 30;

/// How long the rest of a message may take once its first byte arrived.
const MESSAGE_TIMEOUT: Duration = Duration::from_secs(30);

fn channel_error(what: &str, error: impl std::fmt::Display) -> NixlError {
    NixlError::Channel {
        detail: format!("{what}: {error}"),
    }
}

/// A listening socket in the temporary directory, removed on drop.
#[derive(Debug)]
pub struct Listener {
    listener: UnixListener,
    path: PathBuf,
}

impl Listener {
    /// Listens on a new socket named after `prefix`, this process and the time.
    pub fn bind_temp(prefix: &str) -> Result<Listener, NixlError> {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |since| since.as_nanos());
        let path =
            std::env::temp_dir().join(format!("{prefix}-{}-{nanos}.sock", std::process::id()));
        let listener = UnixListener::bind(&path).map_err(|e| channel_error("bind", e))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| channel_error("bind", e))?;
        Ok(Listener { listener, path })
    }

    /// The socket's path, for the peer to connect to.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Waits up to `timeout` for the peer to connect; `alive` is asked every few milliseconds
    /// whether waiting still makes sense (a peer process that exited fails it).
    pub fn accept(
        &self,
        timeout: Duration,
        mut alive: impl FnMut() -> Result<(), NixlError>,
    ) -> Result<Channel, NixlError> {
        let deadline = Instant::now() + timeout;
        loop {
            match self.listener.accept() {
                Ok((stream, _)) => return Channel::new(stream),
                Err(error) if error.kind() == ErrorKind::WouldBlock => {}
                Err(error) => return Err(channel_error("accept", error)),
            }
            alive()?;
            if Instant::now() >= deadline {
                return Err(NixlError::PeerLost {
                    detail: format!("no peer connected within {timeout:?}"),
                });
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// [`Listener::accept`] from `child`, a process started to connect here: fails when the
    /// child exits first, and on any failure kills and reaps it, so no process outlives a
    /// failed start.
    pub fn accept_child(&self, child: &mut Child, timeout: Duration) -> Result<Channel, NixlError> {
        let accepted = self.accept(timeout, || match child.try_wait() {
            Ok(Some(status)) => Err(NixlError::PeerLost {
                detail: format!("the peer process exited ({status}) before connecting"),
            }),
            _ => Ok(()),
        });
        if accepted.is_err() {
            let _ = child.kill();
            let _ = child.wait();
        }
        accepted
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// One end of the control channel.
#[derive(Debug)]
pub struct Channel {
    stream: UnixStream,
}

impl Channel {
    fn new(stream: UnixStream) -> Result<Channel, NixlError> {
        stream
            .set_nonblocking(false)
            .and_then(|()| stream.set_read_timeout(Some(MESSAGE_TIMEOUT)))
            .map_err(|e| channel_error("socket", e))?;
        Ok(Channel { stream })
    }

    /// Connects to the listener at `path`.
    pub fn connect(path: &Path) -> Result<Channel, NixlError> {
        let stream = UnixStream::connect(path).map_err(|e| NixlError::PeerLost {
            detail: format!("connecting to {}: {e}", path.display()),
        })?;
        Channel::new(stream)
    }

    /// Sends `message`. A closed peer is [`NixlError::PeerLost`].
    pub fn send<T: Serialize>(&mut self, message: &T) -> Result<(), NixlError> {
        let body = rmp_serde::to_vec_named(message).map_err(|e| channel_error("encode", e))?;
        let mut frame = Vec::with_capacity(4 + body.len());
        frame.extend_from_slice(&(body.len() as u32).to_le_bytes());
        frame.extend_from_slice(&body);
        self.stream.write_all(&frame).map_err(|e| match e.kind() {
            ErrorKind::BrokenPipe | ErrorKind::ConnectionReset => NixlError::PeerLost {
                detail: format!("sending: {e}"),
            },
            _ => channel_error("send", e),
        })
    }

    /// Whether a message (or the end) arrives within `timeout`; `None` waits for ever.
    fn readable(&self, timeout: Option<Duration>) -> Result<bool, NixlError> {
        let millis = timeout.map_or(-1, |t| t.as_millis().min(i32::MAX as u128) as i32);
        let mut poll = libc::pollfd {
            fd: self.stream.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let ready = unsafe { libc::poll(&mut poll, 1, millis) };
        match ready {
            -1 => {
                let error = std::io::Error::last_os_error();
                match error.kind() {
                    ErrorKind::Interrupted => Ok(false),
                    _ => Err(channel_error("poll", error)),
                }
            }
            0 => Ok(false),
            _ => Ok(true),
        }
    }

    /// The next message, or `None` if none began within `timeout` (`None`: wait for ever).
    /// The peer's end closing is [`NixlError::PeerLost`].
    pub fn recv<T: DeserializeOwned>(
        &mut self,
        timeout: Option<Duration>,
    ) -> Result<Option<T>, NixlError> {
        if !self.readable(timeout)? {
            return Ok(None);
        }
        let mut header = [0u8; 4];
        self.read_exact(&mut header)?;
        let len = u32::from_le_bytes(header) as usize;
        if len > MAX_MESSAGE {
            return Err(channel_error(
                "receive",
                format!("a message of {len} bytes"),
            ));
        }
        let mut body = vec![0; len];
        self.read_exact(&mut body)?;
        rmp_serde::from_slice(&body)
            .map(Some)
            .map_err(|e| channel_error("decode", e))
    }

    fn read_exact(&mut self, buffer: &mut [u8]) -> Result<(), NixlError> {
        self.stream.read_exact(buffer).map_err(|e| match e.kind() {
            ErrorKind::UnexpectedEof | ErrorKind::ConnectionReset => NixlError::PeerLost {
                detail: "the peer closed the control channel".into(),
            },
            _ => channel_error("receive", e),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_cross_in_order_and_a_closed_end_is_peer_lost() {
        let listener = Listener::bind_temp("kvown-nixl-channel-test").unwrap();
        let path = listener.path().to_path_buf();
        let client = std::thread::spawn(move || {
            let mut channel = Channel::connect(&path).unwrap();
            channel.send(&("hello".to_string(), 7u64)).unwrap();
            channel.send(&vec![1u8, 2, 3]).unwrap();
        });
        let mut channel = listener.accept(Duration::from_secs(10), || Ok(())).unwrap();
        client.join().unwrap();
        let first: Option<(String, u64)> = channel.recv(None).unwrap();
        assert_eq!(first, Some(("hello".to_string(), 7)));
        let second: Option<Vec<u8>> = channel.recv(Some(Duration::from_secs(1))).unwrap();
        assert_eq!(second, Some(vec![1, 2, 3]));
        assert!(matches!(
            channel.recv::<u64>(Some(Duration::from_secs(1))),
            Err(NixlError::PeerLost { .. })
        ));
    }

    #[test]
    fn nothing_arriving_is_none_and_a_peer_that_never_connects_is_peer_lost() {
        let listener = Listener::bind_temp("kvown-nixl-channel-test").unwrap();
        let error = listener
            .accept(Duration::from_millis(20), || Ok(()))
            .unwrap_err();
        assert!(matches!(error, NixlError::PeerLost { .. }), "{error}");
        let path = listener.path().to_path_buf();
        let _client = Channel::connect(&path).unwrap();
        let mut server = listener.accept(Duration::from_secs(1), || Ok(())).unwrap();
        let nothing: Option<u64> = server.recv(Some(Duration::from_millis(10))).unwrap();
        assert_eq!(nothing, None);
        drop(listener);
        assert!(!path.exists(), "the socket file is removed");
    }
}
