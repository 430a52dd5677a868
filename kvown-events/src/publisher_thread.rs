//! The publisher on a thread of its own, as vLLM runs its: the engine hands each step's events
//! over a bounded queue and goes back to work; the thread encodes them, sends them and
//! answers replay requests.

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use kvown_runtime::radix::CacheEvent;

use crate::encoder::EventEncoder;
use crate::error::PublishError;
use crate::publisher::{EventPublisher, PublisherConfig};

/// How long the publisher thread sleeps when it found nothing to send: the most a batch waits
/// before it is sent, and how often replay requests are looked for.
const IDLE_POLL: Duration = Duration::from_micros(200);

/// A handle on a publisher thread. Batches are numbered in the order they are handed over,
/// so [`PublisherThread::publish`] tells the sequence number a batch will carry before it is
/// sent.
pub struct PublisherThread {
    queue: Option<mpsc::SyncSender<Vec<CacheEvent>>>,
    thread: Option<thread::JoinHandle<Result<u64, PublishError>>>,
    endpoint: String,
    replay_endpoint: Option<String>,
    next_seq: u64,
}

impl std::fmt::Debug for PublisherThread {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PublisherThread")
            .field("endpoint", &self.endpoint)
            .field("replay_endpoint", &self.replay_endpoint)
            .field("next_seq", &self.next_seq)
            .finish()
    }
}

impl PublisherThread {
    /// Binds a publisher of `config` in `context` (here, so that a bind error comes back to
    /// the caller) and starts its thread, which encodes with `encoder` (in its dialect). At most
    /// `queue_batches` batches wait for the thread; past that [`PublisherThread::publish`]
    /// blocks until it catches up (dropping a batch would corrupt the router's view).
    pub fn spawn(
        context: &zmq::Context,
        config: &PublisherConfig,
        encoder: EventEncoder,
        queue_batches: usize,
    ) -> Result<PublisherThread, PublishError> {
        let publisher = EventPublisher::bind(context, config, encoder)?;
        let endpoint = publisher.endpoint().to_owned();
        let replay_endpoint = publisher.replay_endpoint().map(str::to_owned);
        let (queue, inbox) = mpsc::sync_channel(queue_batches.max(1));
        let thread = thread::Builder::new()
            .name("kvown-events publisher".to_owned())
            .spawn(move || run(publisher, &inbox))
            .map_err(|source| PublishError::Thread { source })?;
        Ok(PublisherThread {
            queue: Some(queue),
            thread: Some(thread),
            endpoint,
            replay_endpoint,
            next_seq: 0,
        })
    }

    /// The PUB socket's endpoint, its port resolved.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The replay socket's endpoint, its port resolved.
    pub fn replay_endpoint(&self) -> Option<&str> {
        self.replay_endpoint.as_deref()
    }

    /// Hands `events` to the thread as one batch; returns the sequence number it will carry,
    /// or `None` for no events (nothing is sent). Fails with [`PublishError::Stopped`] once
    /// the thread has stopped on an error ([`PublisherThread::finish`] returns it).
    pub fn publish(&mut self, events: Vec<CacheEvent>) -> Result<Option<u64>, PublishError> {
        if events.is_empty() {
            return Ok(None);
        }
        let queue = self.queue.as_ref().expect("the queue lives until finish");
        queue.send(events).map_err(|_| PublishError::Stopped)?;
        self.next_seq += 1;
        Ok(Some(self.next_seq - 1))
    }

    /// Stops the thread once it has sent every batch handed over; returns how many it sent,
    /// or the error it stopped on.
    pub fn finish(mut self) -> Result<u64, PublishError> {
        self.stop()
    }

    fn stop(&mut self) -> Result<u64, PublishError> {
        drop(self.queue.take());
        match self.thread.take() {
            Some(thread) => thread.join().map_err(|_| PublishError::Stopped)?,
            None => Ok(self.next_seq),
        }
    }
}

impl Drop for PublisherThread {
    /// Stops the thread after it sent what it was handed (its error, if any, is lost: call
    /// [`PublisherThread::finish`] to see it).
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

/// The thread: sends the batches waiting, serves replays, and sleeps [`IDLE_POLL`] when there
/// was nothing to send (so that handing a batch over never wakes it: the engine's thread makes
/// no system call); returns the batches sent when the handle hangs up.
fn run(
    mut publisher: EventPublisher,
    inbox: &mpsc::Receiver<Vec<CacheEvent>>,
) -> Result<u64, PublishError> {
    loop {
        let mut sent = false;
        loop {
            match inbox.try_recv() {
                Ok(events) => {
                    publisher.publish_events(unix_seconds(), &events)?;
                    sent = true;
                }
                Err(mpsc::TryRecvError::Empty) => break,
                Err(mpsc::TryRecvError::Disconnected) => return Ok(publisher.next_seq()),
            }
        }
        publisher.serve_replay()?;
        if !sent {
            thread::sleep(IDLE_POLL);
        }
    }
}

/// Seconds since the Unix epoch, a batch's timestamp.
fn unix_seconds() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |since| since.as_secs_f64())
}
