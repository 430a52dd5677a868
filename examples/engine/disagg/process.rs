//! The prefill process of `--transfer nixl`: this binary started again by the decode node, with
//! [`LAUNCH_ENV`] naming the control socket and the engine's flags. It builds the prefill node
//! the flags describe on a pool registered with NIXL, sends its metadata, then computes the
//! prompts it is sent and holds each request until the decode node's READ notifies it
//! (`kvown_nixl::Holds`), or the hold expires, or the decode node is gone; then releases it.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use kvown::batch::Req;
use kvown_nixl::channel::Channel;
use kvown_nixl::{Agent, Holds, NixlError, RegisteredPool, Released};
use serde::{Deserialize, Serialize};

use super::PrefillNode;
use super::nixl::{FromPrefill, ToPrefill};
use crate::cli::Args;
use crate::kv_data::{self, KvStore};
use crate::workload;

/// The environment variable that makes this binary the prefill process.
pub const LAUNCH_ENV: &str = "KVOWN_ENGINE_PREFILL_PROCESS";

/// The arguments that make the engine's test binary run [`tests::prefill_process`].
pub const TEST_ARGS: &[&str] = &[
    "--ignored",
    "--exact",
    "disagg::process::tests::prefill_process",
    "--nocapture",
    "--test-threads",
    "1",
];

/// How long a computed request is held with no READ of it: past the decode node's transfer
/// timeout (`kvown_nixl::DEFAULT_TIMEOUT`), so K/V is never let go while a READ may come.
const HOLD_FOR: Duration = Duration::from_secs(120);

/// How long the process waits for the last notices at the end.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(60);

/// What the decode node tells its prefill process.
#[derive(Debug, Serialize, Deserialize)]
pub struct Launch {
    /// The control socket to connect to.
    pub socket: PathBuf,
    /// The engine's flags.
    pub flags: Vec<String>,
}

impl Launch {
    /// As the value of [`LAUNCH_ENV`].
    pub fn to_env(&self) -> String {
        serde_json::to_string(self).expect("a launch is plain data")
    }
}

/// Runs the prefill process if this process was started as one: `Some` with its outcome.
pub fn run_if_asked() -> Option<Result<(), String>> {
    let launch = std::env::var(LAUNCH_ENV).ok()?;
    Some(
        serde_json::from_str::<Launch>(&launch)
            .map_err(|e| format!("{LAUNCH_ENV}: {e}"))
            .and_then(|launch| serve(&launch)),
    )
}

/// The prefill process: build, connect, serve until told to finish or the decode node is gone.
fn serve(launch: &Launch) -> Result<(), String> {
    let flags = std::iter::once("engine").chain(launch.flags.iter().map(String::as_str));
    let args = Args::try_parse_flags(flags).map_err(|e| e.to_string())?;
    let jobs = workload::generate(&args);
    let (allocator, table, tree) = crate::host_bookkeeping(&args, &jobs)?;
    let cache = crate::new_cache(&args, allocator, table, tree, ())?;
    let agent = Agent::new(&format!("kvown-engine-prefill-{}", std::process::id()))
        .map_err(|e| e.to_string())?;
    let layout = kv_data::layout(args.pool_tokens, args.page_size)?;
    let pool = RegisteredPool::new(&agent, layout, kv_data::DTYPE).map_err(|e| e.to_string())?;
    let metadata = agent
        .metadata(pool.descriptor())
        .map_err(|e| e.to_string())?;
    let node = PrefillNode::new(cache, KvStore::new(Box::new(pool)));
    let mut channel = Channel::connect(&launch.socket).map_err(|e| e.to_string())?;
    channel
        .send(&FromPrefill::Metadata(metadata.to_bytes()))
        .map_err(|e| e.to_string())?;
    Server {
        node,
        agent,
        channel,
        holds: Holds::new(HOLD_FOR),
    }
    .run()
}

/// The prefill process's state.
struct Server {
    node: PrefillNode,
    agent: Agent,
    channel: Channel,
    holds: Holds<Req>,
}

impl Server {
    fn run(mut self) -> Result<(), String> {
        loop {
            let message = match self
                .channel
                .recv::<ToPrefill>(Some(Duration::from_millis(1)))
            {
                Ok(message) => message,
                Err(NixlError::PeerLost { detail }) => {
                    let held = self.holds.reader_lost();
                    self.release(held)?;
                    self.node.finish()?;
                    return Err(format!("the decode node is gone ({detail})"));
                }
                Err(error) => return Err(error.to_string()),
            };
            self.poll_holds()?;
            let answer = match message {
                None => continue,
                Some(ToPrefill::Prompts(prompts)) => self.compute(&prompts)?,
                Some(ToPrefill::Check) => FromPrefill::Checked(self.node.check(self.holds.items())),
                Some(ToPrefill::Finish) => {
                    let result = self.drain().and_then(|()| self.node.finish());
                    let done = result.clone();
                    self.channel
                        .send(&FromPrefill::Finished(result))
                        .map_err(|e| e.to_string())?;
                    return done;
                }
            };
            self.channel.send(&answer).map_err(|e| e.to_string())?;
        }
    }

    /// Computes `prompts` and holds them under their tags.
    fn compute(&mut self, prompts: &[super::Prompt]) -> Result<FromPrefill, String> {
        let mut ns = 0;
        let Some((reqs, tokens)) = self.node.prefill(prompts, &mut ns)? else {
            return Ok(FromPrefill::NoRoom);
        };
        let mut sources = Vec::with_capacity(reqs.len());
        for (req, prompt) in reqs.into_iter().zip(prompts) {
            sources.push(self.node.source(&req)?);
            match self.holds.hold(prompt.tag, req) {
                Ok(None) => {}
                Ok(Some(read)) => self.release(vec![read])?,
                Err(req) => return Err(format!("request {} held twice", req.rid())),
            }
        }
        Ok(FromPrefill::Computed { sources, tokens })
    }

    /// Releases what the notices (or the holds' deadline) let go.
    fn poll_holds(&mut self) -> Result<(), String> {
        let mut gone = Vec::new();
        self.holds
            .poll(&self.agent, &mut gone)
            .map_err(|e| e.to_string())?;
        self.release(gone)
    }

    fn release(&mut self, gone: Vec<(Req, Released)>) -> Result<(), String> {
        for (req, why) in gone {
            if why == Released::Expired {
                eprintln!(
                    "prefill process: request {} was not read within {HOLD_FOR:?}; released",
                    req.rid()
                );
            }
            self.node.release(req, &mut 0)?;
        }
        Ok(())
    }

    /// Waits for the notices of every held request.
    fn drain(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + DRAIN_TIMEOUT;
        while !self.holds.is_empty() && Instant::now() < deadline {
            self.poll_holds()?;
        }
        match self.holds.len() {
            0 => Ok(()),
            held => Err(format!(
                "{held} requests were never read within {DRAIN_TIMEOUT:?} of the end"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    /// Not a test of its own: the prefill process of the engine's `--transfer nixl` tests, which
    /// start this test binary with [`super::TEST_ARGS`] (a test binary cannot be started as
    /// the engine). Run without them, it fails saying so.
    #[test]
    #[ignore = "the prefill process of the --transfer nixl tests, started by them"]
    fn prefill_process() {
        match super::run_if_asked() {
            Some(Ok(())) => std::process::exit(0),
            Some(Err(error)) => {
                eprintln!("prefill process: {error}");
                std::process::exit(1)
            }
            None => panic!(
                "started by the engine's --transfer nixl tests as their prefill process, with \
                 {} set; not a test on its own",
                super::LAUNCH_ENV
            ),
        }
    }
}
