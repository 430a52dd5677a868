//! A chat workload for the server: conversations that open with one of a few shared system
//! prompts and come back for several turns, each turn's prompt the whole conversation so far
//! (so the prefix cache hits), and [`serve`], which drives a [`Server`] through it.

use std::collections::HashMap;
use std::ops::RangeInclusive;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::error::{RequestError, ServeError};
use crate::serve::{Finished, Request, Server, StepOutput};

/// The shape of a [`Conversations`] workload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConversationSpec {
    /// Conversations.
    pub conversations: usize,
    /// Turns per conversation (requests: `conversations x turns`).
    pub turns: usize,
    /// Distinct system prompts the conversations share.
    pub system_prompts: usize,
    /// Tokens of each system prompt.
    pub system_len: usize,
    /// Tokens a user adds per turn.
    pub user_len: RangeInclusive<usize>,
    /// Tokens generated per turn.
    pub max_new_tokens: RangeInclusive<usize>,
    /// Token ids are drawn from `1..vocab`.
    pub vocab: usize,
    /// The workload's seed.
    pub seed: u64,
}

/// The requests of a conversation workload, issued turn by turn.
#[derive(Debug)]
pub struct Conversations {
    spec: ConversationSpec,
    rng: SmallRng,
    system: Vec<Vec<u32>>,
    /// Request id to (conversation, turn).
    turn_of: HashMap<u64, (usize, usize)>,
    next_rid: u64,
    /// Conversations ended before their last turn (a turn refused, or aborted).
    pub ended_early: usize,
}

impl Conversations {
    /// The workload `spec` describes (its system prompts drawn now).
    pub fn new(spec: ConversationSpec) -> Conversations {
        let mut rng = SmallRng::seed_from_u64(spec.seed);
        let vocab = spec.vocab.max(2) as u32;
        let system = (0..spec.system_prompts.max(1))
            .map(|_| {
                (0..spec.system_len)
                    .map(|_| rng.gen_range(1..vocab))
                    .collect()
            })
            .collect();
        Conversations {
            spec,
            rng,
            system,
            turn_of: HashMap::new(),
            next_rid: 0,
            ended_early: 0,
        }
    }

    /// Requests the workload issues in all.
    pub fn requests(&self) -> usize {
        self.spec.conversations * self.spec.turns
    }

    fn user_turn(&mut self) -> Vec<u32> {
        let len = self.rng.gen_range(self.spec.user_len.clone());
        let vocab = self.spec.vocab.max(2) as u32;
        (0..len).map(|_| self.rng.gen_range(1..vocab)).collect()
    }

    fn request(&mut self, conversation: usize, turn: usize, prompt: Vec<u32>) -> Request {
        let rid = self.next_rid;
        self.next_rid += 1;
        self.turn_of.insert(rid, (conversation, turn));
        Request {
            rid,
            prompt,
            max_new_tokens: self.rng.gen_range(self.spec.max_new_tokens.clone()),
        }
    }

    /// The first turn of every conversation: a system prompt (conversation `c` gets prompt
    /// `c % system_prompts`) and a user turn.
    pub fn opening_turns(&mut self) -> Vec<Request> {
        (0..self.spec.conversations)
            .map(|conversation| {
                let mut prompt = self.system[conversation % self.system.len()].clone();
                prompt.extend(self.user_turn());
                self.request(conversation, 0, prompt)
            })
            .collect()
    }

    /// The next turn after `finished`: its prompt, its output and a new user turn; `None` after
    /// the last turn or an aborted one.
    pub fn follow_up(&mut self, finished: &Finished) -> Option<Request> {
        let (conversation, turn) = self.turn_of.remove(&finished.rid)?;
        if finished.aborted {
            self.ended_early += 1;
            return None;
        }
        if turn + 1 >= self.spec.turns {
            return None;
        }
        let mut prompt = finished.prompt.clone();
        prompt.extend(&finished.output);
        prompt.extend(self.user_turn());
        Some(self.request(conversation, turn + 1, prompt))
    }
}

/// Steps without a token computed after which [`serve`] gives up.
const STALL_STEPS: u64 = 1000;

/// What [`serve`] shows as it goes.
pub trait Observer {
    /// The error that stops the run.
    type Error: From<ServeError>;

    /// A request was submitted.
    fn submitted(&mut self, _request: &Request) -> Result<(), Self::Error> {
        Ok(())
    }

    /// A step ran.
    fn stepped(&mut self, _server: &Server, _out: &StepOutput) -> Result<(), Self::Error> {
        Ok(())
    }
}

/// Watches nothing.
impl Observer for () {
    type Error = ServeError;
}

/// Serves `workload` on `server` to the end: the opening turns at once, each follow-up when
/// its previous turn finishes; `observer` sees every submission and step (and may stop the run
/// with an error). Returns every finished request. A follow-up the server refuses as too long
/// ends its conversation ([`Conversations::ended_early`]).
///
/// # Errors
/// The server's, the observer's, or [`ServeError::Stalled`] when no token is computed for
/// 1,000 steps.
pub fn serve<O: Observer>(
    server: &mut Server,
    workload: &mut Conversations,
    observer: &mut O,
) -> Result<Vec<Finished>, O::Error> {
    let submit = |server: &mut Server, observer: &mut O, request: Request| {
        let refused = match server.submit(request.clone()) {
            Ok(()) => return observer.submitted(&request).map(|()| false),
            Err(refused) => refused,
        };
        match refused {
            RequestError::ContextTooLong { .. }
            | RequestError::PastModelPositions { .. }
            | RequestError::LargerThanPool { .. } => Ok(true),
            error => Err(ServeError::from(error).into()),
        }
    };
    for request in workload.opening_turns() {
        if submit(server, observer, request)? {
            workload.ended_early += 1;
        }
    }
    let mut finished = Vec::new();
    let (mut last_progress, mut tokens) = (0, 0);
    while !server.is_idle() {
        let out = server.step()?;
        observer.stepped(server, &out)?;
        for done in out.finished {
            if let Some(next) = workload.follow_up(&done)
                && submit(server, observer, next)?
            {
                workload.ended_early += 1;
            }
            finished.push(done);
        }
        let stats = server.stats();
        let computed = stats.prefill_tokens + stats.decode_tokens;
        if computed != tokens {
            (tokens, last_progress) = (computed, stats.steps);
        } else if stats.steps - last_progress > STALL_STEPS {
            return Err(ServeError::Stalled { steps: STALL_STEPS }.into());
        }
    }
    Ok(finished)
}
