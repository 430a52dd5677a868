//! The differential run: a conversation workload served by kvown-candle's `Server`, every row
//! of logits it computes compared with the oracle's for the same tokens, every sampled token
//! with the oracle's choice, kvown's invariant checker after every step, and every slot and row
//! back at the end.

use std::collections::HashMap;

use kvown_candle::sampling::argmax;
use kvown_candle::workload::{ConversationSpec, Conversations, Observer, serve};
use kvown_candle::{Request, Sampling, ServeConfig, ServeError, ServeStats, Server, StepOutput};

use crate::fixture::{tiny_checkpoint, tiny_model};
use crate::oracle::Oracle;

/// Largest difference allowed between a row of our logits and the oracle's, in f32.
pub const F32_TOLERANCE: f32 = 1e-4;

/// Why a differential run failed.
#[derive(Debug, thiserror::Error)]
pub enum Mismatch {
    /// The server failed (a kvown call refused, a broken invariant, a leak).
    #[error("the server failed: {0}")]
    Serve(ServeError),
    /// A row of logits differs from the oracle's by more than the tolerance.
    #[error("step {step}: request {rid}'s logits after position {position} are {difference} off")]
    Logits {
        step: u64,
        rid: u64,
        position: usize,
        difference: f32,
    },
    /// A sampled token is not the oracle's greedy choice.
    #[error(
        "step {step}: request {rid} sampled {ours} after position {position}, the oracle {oracle}"
    )]
    Token {
        step: u64,
        rid: u64,
        position: usize,
        ours: u32,
        oracle: u32,
    },
    /// The logits came for a context the request does not have.
    #[error("request {rid}: logits after position {position}, but it holds {held} tokens")]
    Context {
        rid: u64,
        position: usize,
        held: usize,
    },
    /// A finished request's output is not the sequence checked step by step.
    #[error("request {rid} finished with an output other than the tokens checked")]
    Output { rid: u64 },
}

impl From<ServeError> for Mismatch {
    fn from(error: ServeError) -> Mismatch {
        Mismatch::Serve(error)
    }
}

/// What a run that matched the oracle did.
#[derive(Debug)]
pub struct Report {
    pub stats: ServeStats,
    /// Rows of logits compared.
    pub rows_checked: usize,
    /// Of those, rows of a prompt chunk (no token sampled).
    pub chunk_rows: usize,
    /// The largest difference seen.
    pub max_difference: f32,
    /// Conversations cut short.
    pub ended_early: usize,
}

/// A run's outcome and how often its planted fault fired.
pub struct Run {
    pub result: Result<Report, Mismatch>,
    pub faults_fired: u32,
}

/// The checks, as the observer of the serving loop.
struct Differential {
    oracle: Oracle,
    tolerance: f32,
    greedy: bool,
    /// Each request's tokens: its prompt, then each token sampled.
    tokens: HashMap<u64, Vec<u32>>,
    rows_checked: usize,
    chunk_rows: usize,
    max_difference: f32,
}

impl Observer for Differential {
    type Error = Mismatch;

    fn submitted(&mut self, request: &Request) -> Result<(), Mismatch> {
        self.tokens.insert(request.rid, request.prompt.clone());
        Ok(())
    }

    fn stepped(&mut self, server: &Server, out: &StepOutput) -> Result<(), Mismatch> {
        let step = server.stats().steps;
        for row in &out.logits {
            let tokens = self.tokens.get_mut(&row.rid).expect("a submitted request");
            if row.position >= tokens.len() {
                return Err(Mismatch::Context {
                    rid: row.rid,
                    position: row.position,
                    held: tokens.len(),
                });
            }
            let expected = self.oracle.logits(row.rid, tokens, row.position);
            let difference = row
                .logits
                .iter()
                .zip(&expected)
                .map(|(ours, theirs)| (ours - theirs).abs())
                .fold(0.0f32, f32::max);
            self.max_difference = self.max_difference.max(difference);
            self.rows_checked += 1;
            if difference > self.tolerance || row.logits.len() != expected.len() {
                return Err(Mismatch::Logits {
                    step,
                    rid: row.rid,
                    position: row.position,
                    difference,
                });
            }
            let Some(ours) = row.sampled else {
                self.chunk_rows += 1;
                continue;
            };
            if tokens.len() != row.position + 1 {
                return Err(Mismatch::Context {
                    rid: row.rid,
                    position: row.position,
                    held: tokens.len(),
                });
            }
            let oracle = argmax(&expected);
            if self.greedy && ours != oracle && !near_tie(&expected, ours, self.tolerance) {
                return Err(Mismatch::Token {
                    step,
                    rid: row.rid,
                    position: row.position,
                    ours,
                    oracle,
                });
            }
            tokens.push(ours);
        }
        for done in &out.finished {
            let tokens = &self.tokens[&done.rid];
            if done.prompt.len() + done.output.len() != tokens.len()
                || tokens[..done.prompt.len()] != done.prompt[..]
                || tokens[done.prompt.len()..] != done.output[..]
            {
                return Err(Mismatch::Output { rid: done.rid });
            }
            self.oracle.forget(done.rid);
        }
        Ok(())
    }
}

/// Whether `token`'s oracle logit is within twice `tolerance` of the best: a tie the
/// tolerance cannot tell apart (only reachable with a tolerance wider than f32's, bf16 pools).
fn near_tie(logits: &[f32], token: u32, tolerance: f32) -> bool {
    let best = logits[argmax(logits) as usize];
    tolerance > F32_TOLERANCE && best - logits[token as usize] <= 2.0 * tolerance
}

/// Serves `workload` with `config` (logits reported, the checker after every step) on the tiny
/// model against the oracle, with `tolerance` on the logits.
pub fn run(config: ServeConfig, workload: ConversationSpec, tolerance: f32) -> Run {
    let config = ServeConfig {
        report_logits: true,
        check_every_step: true,
        ..config
    };
    let greedy = config.sampling == Sampling::Greedy;
    let mut server = match Server::new(tiny_model(), config) {
        Ok(server) => server,
        Err(error) => {
            return Run {
                result: Err(error.into()),
                faults_fired: 0,
            };
        }
    };
    let mut checks = Differential {
        oracle: Oracle::load(tiny_checkpoint()),
        tolerance,
        greedy,
        tokens: HashMap::new(),
        rows_checked: 0,
        chunk_rows: 0,
        max_difference: 0.0,
    };
    let mut conversations = Conversations::new(workload);
    let served = serve(&mut server, &mut conversations, &mut checks);
    let faults_fired = server.faults_fired();
    let result = served.and_then(|_| {
        let stats = server.finish()?;
        Ok(Report {
            stats,
            rows_checked: checks.rows_checked,
            chunk_rows: checks.chunk_rows,
            max_difference: checks.max_difference,
            ended_early: conversations.ended_early,
        })
    });
    Run {
        result,
        faults_fired,
    }
}

/// The shared workload: 12 conversations of 3 turns (36 requests) over 3 system prompts of 40
/// tokens; user turns of 4 to 24 tokens; 4 to 16 tokens generated per turn.
pub fn conversations(seed: u64) -> ConversationSpec {
    ConversationSpec {
        conversations: 12,
        turns: 3,
        system_prompts: 3,
        system_len: 40,
        user_len: 4..=24,
        max_new_tokens: 4..=16,
        vocab: kvown_candle::random::tiny_config().vocab_size,
        seed,
    }
}

/// A run that must match: panics with the mismatch otherwise.
pub fn must_match(config: ServeConfig, workload: ConversationSpec, tolerance: f32) -> Report {
    let run = run(config.clone(), workload, tolerance);
    match run.result {
        Ok(report) => report,
        Err(mismatch) => panic!("{mismatch} ({config:?})"),
    }
}
