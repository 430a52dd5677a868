//! Replicas as child processes (`--processes`): the router's side starts this binary again
//! with `--serve-replica N`; the child runs [`serve_jobs`] on its own ZMQ sockets, and the
//! jobs and their reports travel over the child's stdin and stdout (length-prefixed msgpack).
//! The KV events go over ZMQ on loopback, as with threads.

use std::io::{BufReader, BufWriter, Read, Write};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::thread;

use kvown_events::{Context, NamespaceField};
use kvown_fleet::fleet::{Done, FleetConfig, Job, Ready, ReplicaReport, Totals, serve_jobs};
use kvown_fleet::replica::Admission;
use kvown_fleet::workload::Request;
use kvown_runtime::radix::Namespace;
use serde::{Deserialize, Serialize};

/// A job on the child's stdin.
#[derive(Serialize, Deserialize)]
struct WireJob {
    id: usize,
    session: usize,
    namespace: u32,
    prompt: Vec<u32>,
    reply: Vec<u32>,
}

/// A message on the child's stdout.
#[derive(Serialize, Deserialize)]
enum ChildMessage {
    /// Its endpoints, or why it could not bind.
    Ready(Result<(String, Option<String>), String>),
    /// A served job: (cached, computed) prompt tokens, and its last batch's number.
    Done {
        id: usize,
        outcome: Result<(usize, usize), String>,
        last_seq: Option<u64>,
    },
    /// Its totals, when its stdin closed.
    Totals(Result<ReplicaReport, String>),
}

/// The child's arguments after the binary's name, for `replica`.
fn child_args(replica: usize, config: &FleetConfig) -> Vec<String> {
    let namespace_field = match config.namespace_field {
        NamespaceField::CacheSalt => "salt",
        NamespaceField::LoraName => "lora",
    };
    [
        "--serve-replica",
        &replica.to_string(),
        "--page-size",
        &config.page_size.to_string(),
        "--pool-tokens",
        &config.pool_tokens.to_string(),
        "--max-context",
        &config.max_context.to_string(),
        "--namespace-field",
        namespace_field,
        "--namespaces",
        &config.namespaces.to_string(),
        "--dialect",
        config.dialect.name(),
    ]
    .map(str::to_owned)
    .to_vec()
}

/// [`crate::fleet::Launch`] in a child process: starts it, forwards the jobs to its stdin and
/// its reports to `done`, and returns the totals it sends when its stdin closes.
pub fn launch(
    replica: usize,
    config: &FleetConfig,
    _context: &Context,
    jobs: mpsc::Receiver<Job>,
    done: mpsc::Sender<Done>,
    ready: mpsc::Sender<Ready>,
) -> Totals {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut child = Command::new(exe)
        .args(child_args(replica, config))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start the replica process: {e}"))?;
    let mut stdin = BufWriter::new(child.stdin.take().expect("piped"));
    let mut stdout = BufReader::new(child.stdout.take().expect("piped"));
    let first = read_frame::<ChildMessage>(&mut stdout);
    let Ok(Some(ChildMessage::Ready(endpoints))) = first else {
        let _ = ready.send(Err(
            "the replica process did not report its endpoints".to_owned()
        ));
        let _ = child.kill();
        return Err("no endpoints".to_owned());
    };
    ready.send(endpoints).map_err(|e| e.to_string())?;
    let writer = thread::spawn(move || -> Result<(), String> {
        for Job { id, request } in jobs {
            let job = WireJob {
                id,
                session: request.session,
                namespace: request.namespace.0,
                prompt: request.prompt,
                reply: request.reply,
            };
            write_frame(&mut stdin, &job)?;
            stdin.flush().map_err(|e| e.to_string())?;
        }
        Ok(())
    });
    let totals = loop {
        match read_frame::<ChildMessage>(&mut stdout)? {
            Some(ChildMessage::Done {
                id,
                outcome,
                last_seq,
            }) => {
                let outcome = outcome.map(|(cached_tokens, computed_tokens)| Admission {
                    cached_tokens,
                    computed_tokens,
                });
                let report = Done {
                    replica,
                    id,
                    outcome,
                    last_seq,
                };
                if done.send(report).is_err() {
                    break Err("the router hung up".to_owned());
                }
            }
            Some(ChildMessage::Totals(totals)) => break totals,
            Some(ChildMessage::Ready(_)) => break Err("a second ready".to_owned()),
            None => break Err("the replica process ended without its totals".to_owned()),
        }
    };
    writer
        .join()
        .map_err(|_| "the job writer panicked".to_owned())??;
    let status = child.wait().map_err(|e| e.to_string())?;
    if !status.success() {
        return Err(format!("the replica process exited with {status}"));
    }
    totals
}

/// The child's main: [`serve_jobs`] fed from stdin, reporting on stdout.
pub fn serve_replica(replica: usize, config: &FleetConfig) -> Result<(), String> {
    let (job_tx, job_rx) = mpsc::channel::<Job>();
    let (done_tx, done_rx) = mpsc::channel::<Done>();
    let (ready_tx, ready_rx) = mpsc::channel::<Ready>();
    let reader = thread::spawn(move || -> Result<(), String> {
        let mut stdin = BufReader::new(std::io::stdin().lock());
        while let Some(job) = read_frame::<WireJob>(&mut stdin)? {
            let request = Request {
                session: job.session,
                namespace: Namespace(job.namespace),
                prompt: job.prompt,
                reply: job.reply,
            };
            if job_tx
                .send(Job {
                    id: job.id,
                    request,
                })
                .is_err()
            {
                break;
            }
        }
        Ok(())
    });
    let (totals_tx, totals_rx) = mpsc::channel::<Totals>();
    let writer = thread::spawn(move || -> Result<(), String> {
        let mut stdout = BufWriter::new(std::io::stdout().lock());
        let ready = ready_rx.recv().map_err(|e| e.to_string())?;
        write_frame(&mut stdout, &ChildMessage::Ready(ready))?;
        stdout.flush().map_err(|e| e.to_string())?;
        for done in done_rx {
            let outcome = done
                .outcome
                .map(|admission| (admission.cached_tokens, admission.computed_tokens));
            let message = ChildMessage::Done {
                id: done.id,
                outcome,
                last_seq: done.last_seq,
            };
            write_frame(&mut stdout, &message)?;
            stdout.flush().map_err(|e| e.to_string())?;
        }
        let totals = totals_rx.recv().map_err(|e| e.to_string())?;
        write_frame(&mut stdout, &ChildMessage::Totals(totals))?;
        stdout.flush().map_err(|e| e.to_string())
    });
    let totals = serve_jobs(replica, config, &Context::new(), job_rx, done_tx, ready_tx);
    totals_tx.send(totals).map_err(|e| e.to_string())?;
    writer
        .join()
        .map_err(|_| "the writer panicked".to_owned())??;
    reader
        .join()
        .map_err(|_| "the reader panicked".to_owned())?
}

/// Writes `value` as a 4-byte little-endian length and its msgpack.
fn write_frame(out: &mut impl Write, value: &impl Serialize) -> Result<(), String> {
    let bytes = rmp_serde::to_vec(value).map_err(|e| e.to_string())?;
    let len = u32::try_from(bytes.len()).map_err(|e| e.to_string())?;
    out.write_all(&len.to_le_bytes())
        .map_err(|e| e.to_string())?;
    out.write_all(&bytes).map_err(|e| e.to_string())
}

/// Reads a frame of [`write_frame`]; `None` at the end of the stream.
fn read_frame<T: for<'de> Deserialize<'de>>(input: &mut impl Read) -> Result<Option<T>, String> {
    let mut len = [0; 4];
    match input.read_exact(&mut len) {
        Ok(()) => {}
        Err(error) if error.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(error) => return Err(error.to_string()),
    }
    let mut bytes = vec![0; u32::from_le_bytes(len) as usize];
    input.read_exact(&mut bytes).map_err(|e| e.to_string())?;
    rmp_serde::from_slice(&bytes)
        .map(Some)
        .map_err(|e| e.to_string())
}
