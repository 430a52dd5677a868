//! One run of the fleet under one routing policy: N replicas (threads, or child processes:
//! [`FleetConfig::launch`]), each serving the requests sent to it and publishing its cache
//! events on its own ZMQ PUB socket on loopback, and a router that subscribes to every
//! replica, keeps Dynamo's index of them and sends each request to a replica.
//!
//! The router keeps at most `max_in_flight` requests outstanding, and sends a session's next
//! turn only once its previous turn is done; when a replica reports a
//! request done, with the sequence number of its last batch, the router applies that
//! replica's batches up to it before it routes again, so the index never lags the replicas'
//! completed work (with `max_in_flight` 1 the run is deterministic).

use std::cmp::Reverse;
use std::collections::HashSet;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use kvown_events::{
    Context, Dialect, EncodeError, EventEncoder, EventPublisher, EventSubscriber, NamespaceField,
    NamespaceLabels, PublisherConfig,
};

use crate::indexer::{FleetIndexer, dynamo_labels};
use crate::replica::{Admission, Replica};
use crate::workload::Request;

/// How many requests in flight above the least busy replica's a replica may have and still
/// be picked by [`Policy::KvAware`].
pub const LOAD_SLACK: usize = 1;

/// How long the router waits for a replica before it gives up.
const PATIENCE: Duration = Duration::from_secs(20);

/// How the router picks a replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// The longest prefix overlap in Dynamo's index wins, load (requests in flight) breaks
    /// ties, then requests routed so far, then the lower index; a replica with more than
    /// [`LOAD_SLACK`] requests in flight above the least busy one is passed over, so that one
    /// hot prefix cannot pile every request onto one replica.
    KvAware,
    /// Request `i` to replica `i mod N`.
    RoundRobin,
}

impl Policy {
    /// Its name in the report.
    pub fn name(self) -> &'static str {
        match self {
            Policy::KvAware => "KV-aware",
            Policy::RoundRobin => "round robin",
        }
    }
}

/// The fleet's shape.
#[derive(Debug, Clone)]
pub struct FleetConfig {
    /// Replicas.
    pub replicas: usize,
    /// Tokens per KV page (the wire's block size).
    pub page_size: usize,
    /// KV slots per replica.
    pub pool_tokens: usize,
    /// Longest prompt and reply, in tokens.
    pub max_context: usize,
    /// Requests outstanding at most.
    pub max_in_flight: usize,
    /// The replicas' wire dialect.
    pub dialect: Dialect,
    /// Where namespaces travel.
    pub namespace_field: NamespaceField,
    /// Namespaces the workload uses: the default one and `1..namespaces`, labelled by
    /// [`dynamo_labels`].
    pub namespaces: u32,
    /// How each replica runs (on a thread of the router's process: [`serve_jobs`]).
    pub launch: Launch,
}

impl FleetConfig {
    /// The namespaces' labels on the wire.
    pub fn labels(&self) -> Result<NamespaceLabels, EncodeError> {
        dynamo_labels(self.namespace_field, self.dialect, self.namespaces)
    }
}

/// One replica's share of a run.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct ReplicaReport {
    /// Requests it served.
    pub requests: usize,
    /// Prompt tokens its prefill computed.
    pub computed_tokens: usize,
    /// Pages its prefix cache held at the end.
    pub cached_pages: usize,
    /// Batches it published.
    pub batches: u64,
    /// Nanoseconds it spent encoding and publishing.
    pub publish_ns: u64,
    /// Nanoseconds it spent serving (match, prefill and decode bookkeeping, release).
    pub serve_ns: u64,
}

/// What a run measured.
#[derive(Debug, Clone)]
pub struct PolicyReport {
    /// The policy.
    pub policy: Policy,
    /// Each request's admission, in arrival order.
    pub admissions: Vec<Admission>,
    /// Per replica.
    pub replicas: Vec<ReplicaReport>,
    /// Nanoseconds the router spent deciding (hashing the prompt, `find_matches`, the cost).
    pub route_ns: u64,
    /// Nanoseconds the router spent taking in batches (decode, normalise, apply).
    pub ingest_ns: u64,
    /// Nanoseconds the router waited for a finished request's batches to arrive (ZMQ's
    /// delivery on loopback, and the replay of any it missed).
    pub wait_ns: u64,
    /// Events the router applied.
    pub events: u64,
    /// The run's wall time.
    pub wall: Duration,
}

impl PolicyReport {
    /// Prompt tokens over all requests.
    pub fn prompt_tokens(&self) -> usize {
        self.admissions
            .iter()
            .map(|a| a.cached_tokens + a.computed_tokens)
            .sum()
    }

    /// Prompt tokens the prefills computed.
    pub fn computed_tokens(&self) -> usize {
        self.admissions.iter().map(|a| a.computed_tokens).sum()
    }

    /// Share of prompt tokens found in a prefix cache.
    pub fn hit_rate(&self) -> f64 {
        let prompt = self.prompt_tokens().max(1);
        (prompt - self.computed_tokens()) as f64 / prompt as f64
    }

    /// The hit rate of each window of `window` requests, in arrival order.
    pub fn hit_rate_series(&self, window: usize) -> Vec<f64> {
        self.admissions
            .chunks(window.max(1))
            .map(|chunk| {
                let prompt: usize = chunk
                    .iter()
                    .map(|a| a.cached_tokens + a.computed_tokens)
                    .sum();
                let cached: usize = chunk.iter().map(|a| a.cached_tokens).sum();
                cached as f64 / prompt.max(1) as f64
            })
            .collect()
    }
}

/// Why a run failed.
#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    /// A replica failed.
    #[error("replica {replica}: {message}")]
    Replica {
        /// The replica.
        replica: usize,
        /// What it reported.
        message: String,
    },
    /// Dynamo's index refused a batch.
    #[error("router: {0}")]
    Index(#[from] crate::indexer::IndexError),
    /// The router's subscription failed.
    #[error("router: {0}")]
    Subscribe(#[from] kvown_events::SubscribeError),
    /// A batch the router received does not decode.
    #[error("router: replica {replica}'s batch {seq}: {error}")]
    Undecodable {
        /// The replica.
        replica: usize,
        /// The batch's sequence number.
        seq: u64,
        /// Why it does not decode.
        error: kvown_events::DecodeError,
    },
    /// No replica reported in time.
    #[error("no replica reported within {PATIENCE:?}: {0}")]
    Silent(&'static str),
}

/// A request for a replica.
pub struct Job {
    /// Its index in the run.
    pub id: usize,
    /// The request.
    pub request: Request,
}

/// A replica's report of a served request.
pub struct Done {
    /// The replica.
    pub replica: usize,
    /// The request's index in the run.
    pub id: usize,
    /// What its admission found, or why it failed.
    pub outcome: Result<Admission, String>,
    /// The sequence number of its last published batch, if it published any.
    pub last_seq: Option<u64>,
}

/// A replica's totals, handed back when it stops.
pub type Totals = Result<ReplicaReport, String>;

/// A replica's PUB and replay endpoints, or why it could not bind them.
pub type Ready = Result<(String, Option<String>), String>;

/// How a replica is run: it binds its publisher and reports its endpoints on `ready`, serves
/// the jobs it receives (reporting each on `done`) until `jobs` hangs up, and returns its
/// totals. [`serve_jobs`] runs it on the calling thread; the fleet example can also run it in
/// a child process.
pub type Launch = fn(
    replica: usize,
    config: &FleetConfig,
    context: &Context,
    jobs: mpsc::Receiver<Job>,
    done: mpsc::Sender<Done>,
    ready: mpsc::Sender<Ready>,
) -> Totals;

/// Runs `requests` through a fleet of `config` under `policy`.
pub fn run(
    config: &FleetConfig,
    requests: &[Request],
    policy: Policy,
) -> Result<PolicyReport, FleetError> {
    let started = Instant::now();
    let labels = config.labels().map_err(|error| FleetError::Replica {
        replica: 0,
        message: error.to_string(),
    })?;
    let context = Context::new();
    let (done_tx, done_rx) = mpsc::channel::<Done>();
    let mut jobs = Vec::new();
    let mut threads = Vec::new();
    let mut subscribers = Vec::new();
    for replica in 0..config.replicas {
        let (job_tx, job_rx) = mpsc::channel::<Job>();
        let (ready_tx, ready_rx) = mpsc::channel();
        let (shared, done_tx, config) = (context.clone(), done_tx.clone(), config.clone());
        threads.push(thread::spawn(move || {
            (config.launch)(replica, &config, &shared, job_rx, done_tx, ready_tx)
        }));
        let endpoints: Ready = ready_rx
            .recv_timeout(PATIENCE)
            .map_err(|_| "the replica did not start".to_owned())
            .and_then(|ready| ready);
        let (endpoint, replay) =
            endpoints.map_err(|message| FleetError::Replica { replica, message })?;
        subscribers.push(EventSubscriber::connect(
            &context,
            &endpoint,
            replay.as_deref(),
            "",
        )?);
        jobs.push(job_tx);
    }
    drop(done_tx);
    let block_size = config.page_size as u32;
    let mut router = Router {
        index: FleetIndexer::new(config.replicas, block_size, labels, config.dialect),
        subscribers,
        in_flight: vec![0; config.replicas],
        routed: vec![0; config.replicas],
        sessions: HashSet::new(),
        ingest_ns: 0,
        wait_ns: 0,
        events: 0,
    };
    let mut admissions = vec![Admission::default(); requests.len()];
    let mut route_ns = 0u64;
    let mut outstanding = 0;
    for (id, request) in requests.iter().enumerate() {
        // A session's next turn comes after its reply.
        while outstanding >= config.max_in_flight.max(1)
            || router.sessions.contains(&request.session)
        {
            router.complete(&done_rx, &mut admissions, requests)?;
            outstanding -= 1;
        }
        router.sessions.insert(request.session);
        let routing = Instant::now();
        let replica = router.choose(policy, id, request);
        route_ns += routing.elapsed().as_nanos() as u64;
        router.in_flight[replica] += 1;
        router.routed[replica] += 1;
        let job = Job {
            id,
            request: request.clone(),
        };
        jobs[replica].send(job).map_err(|_| FleetError::Replica {
            replica,
            message: "stopped early".to_owned(),
        })?;
        outstanding += 1;
    }
    for _ in 0..outstanding {
        router.complete(&done_rx, &mut admissions, requests)?;
    }
    drop(jobs);
    let mut replicas = Vec::new();
    for (replica, thread) in threads.into_iter().enumerate() {
        let totals = thread.join().map_err(|_| FleetError::Replica {
            replica,
            message: "panicked".to_owned(),
        })?;
        replicas.push(totals.map_err(|message| FleetError::Replica { replica, message })?);
    }
    Ok(PolicyReport {
        policy,
        admissions,
        replicas,
        route_ns,
        ingest_ns: router.ingest_ns,
        wait_ns: router.wait_ns,
        events: router.events,
        wall: started.elapsed(),
    })
}

/// The router's state.
struct Router {
    index: FleetIndexer,
    subscribers: Vec<EventSubscriber>,
    in_flight: Vec<usize>,
    routed: Vec<usize>,
    /// Sessions with a turn in flight.
    sessions: HashSet<usize>,
    ingest_ns: u64,
    wait_ns: u64,
    events: u64,
}

impl Router {
    /// The replica for request `id` under `policy`.
    fn choose(&self, policy: Policy, id: usize, request: &Request) -> usize {
        let replicas = self.in_flight.len();
        match policy {
            Policy::RoundRobin => id % replicas,
            Policy::KvAware => {
                let hashes = self.index.block_hashes(request.namespace, &request.prompt);
                let overlaps = self.index.overlaps(hashes, replicas);
                let least_busy = self.in_flight.iter().copied().min().unwrap_or(0);
                (0..replicas)
                    .filter(|&replica| self.in_flight[replica] <= least_busy + LOAD_SLACK)
                    .min_by_key(|&replica| {
                        let load = self.in_flight[replica];
                        (
                            Reverse(overlaps[replica]),
                            load,
                            self.routed[replica],
                            replica,
                        )
                    })
                    .expect("the least busy replica passes the filter")
            }
        }
    }

    /// Waits for a replica to finish a request, records it, and applies that replica's
    /// batches up to the last one it published.
    fn complete(
        &mut self,
        done: &mpsc::Receiver<Done>,
        admissions: &mut [Admission],
        requests: &[Request],
    ) -> Result<(), FleetError> {
        let report = done
            .recv_timeout(PATIENCE)
            .map_err(|_| FleetError::Silent("a request outstanding"))?;
        let replica = report.replica;
        admissions[report.id] = report
            .outcome
            .map_err(|message| FleetError::Replica { replica, message })?;
        self.in_flight[replica] -= 1;
        self.sessions.remove(&requests[report.id].session);
        if let Some(last_seq) = report.last_seq {
            let waiting = Instant::now();
            let batches = self.subscribers[replica].catch_up(last_seq, PATIENCE)?;
            self.wait_ns += waiting.elapsed().as_nanos() as u64;
            let ingest = Instant::now();
            for batch in batches {
                if let Err(error) = batch.decoded {
                    let seq = batch.seq;
                    return Err(FleetError::Undecodable {
                        replica,
                        seq,
                        error,
                    });
                }
                self.events += self.index.apply_batch(replica, &batch.payload)? as u64;
            }
            self.ingest_ns += ingest.elapsed().as_nanos() as u64;
        }
        Ok(())
    }
}

/// A replica on the calling thread: binds its publisher, reports its endpoints, then serves
/// jobs and publishes the events of each, answering replay requests in between.
pub fn serve_jobs(
    replica: usize,
    config: &FleetConfig,
    context: &Context,
    jobs: mpsc::Receiver<Job>,
    done: mpsc::Sender<Done>,
    ready: mpsc::Sender<Ready>,
) -> Totals {
    let bound = EventEncoder::new(config.page_size)
        .and_then(|encoder| Ok(encoder.with_namespaces(config.labels()?)))
        .map_err(|e| e.to_string())
        .and_then(|encoder| {
            let encoder = encoder.with_dialect(config.dialect);
            EventPublisher::bind(context, &PublisherConfig::default(), encoder)
                .map_err(|e| e.to_string())
        });
    let mut publisher = match bound {
        Ok(publisher) => publisher,
        Err(error) => {
            let _ = ready.send(Err(error.clone()));
            return Err(error);
        }
    };
    let endpoints = (
        publisher.endpoint().to_owned(),
        publisher.replay_endpoint().map(str::to_owned),
    );
    ready.send(Ok(endpoints)).map_err(|e| e.to_string())?;
    let mut engine = Replica::new(
        config.pool_tokens,
        config.page_size,
        1,
        config.max_context,
        false,
    );
    let mut totals = ReplicaReport::default();
    loop {
        match jobs.recv_timeout(Duration::from_millis(1)) {
            Ok(Job { id, request }) => {
                let serving = Instant::now();
                let outcome = engine
                    .serve(request.namespace, request.prompt, request.reply)
                    .map_err(|e| e.to_string());
                totals.serve_ns += serving.elapsed().as_nanos() as u64;
                if let Ok(admission) = &outcome {
                    totals.requests += 1;
                    totals.computed_tokens += admission.computed_tokens;
                }
                let publishing = Instant::now();
                let events = engine.take_events();
                publisher
                    .publish_events(unix_seconds(), &events)
                    .map_err(|e| e.to_string())?;
                totals.publish_ns += publishing.elapsed().as_nanos() as u64;
                let last_seq = publisher.next_seq().checked_sub(1);
                let report = Done {
                    replica,
                    id,
                    outcome,
                    last_seq,
                };
                if done.send(report).is_err() {
                    break;
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
        publisher.serve_replay().map_err(|e| e.to_string())?;
    }
    totals.cached_pages = engine.cached_pages();
    totals.batches = publisher.next_seq();
    Ok(totals)
}

/// Seconds since the Unix epoch, the batches' timestamp.
fn unix_seconds() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |since| since.as_secs_f64())
}
