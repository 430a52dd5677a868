//! The workload: multi-turn conversations over shared system prompts. Each session opens with
//! one of a few system prompts (each in its namespace: the base model or an adapter), then
//! runs several turns; a turn's prompt is the system prompt, every earlier user message and
//! reply, and the new user message. Many sessions are open at once and their turns
//! interleave, as a serving fleet sees them.

use kvown_runtime::radix::Namespace;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// The shape of the workload.
#[derive(Debug, Clone)]
pub struct WorkloadConfig {
    /// Sessions in all.
    pub sessions: usize,
    /// Sessions open at once.
    pub concurrent_sessions: usize,
    /// Distinct system prompts.
    pub system_prompts: usize,
    /// Tokens of each system prompt.
    pub system_prompt_tokens: usize,
    /// Namespaces the system prompts are spread over (system prompt `i` in namespace
    /// `i % namespaces`; namespace 0 is the base model).
    pub namespaces: u32,
    /// Turns of a session, drawn from `turns.0..=turns.1`.
    pub turns: (usize, usize),
    /// Tokens of a user message, drawn likewise.
    pub user_tokens: (usize, usize),
    /// Tokens of a reply, drawn likewise.
    pub reply_tokens: (usize, usize),
    /// The random seed.
    pub seed: u64,
}

/// One request: a turn of a session.
#[derive(Debug, Clone)]
pub struct Request {
    /// The session.
    pub session: usize,
    /// The namespace it runs in.
    pub namespace: Namespace,
    /// Its prompt.
    pub prompt: Vec<u32>,
    /// The reply the replica produces.
    pub reply: Vec<u32>,
}

/// An open session: its history so far and the turns left.
struct Session {
    id: usize,
    namespace: Namespace,
    history: Vec<u32>,
    turn: usize,
    turns: usize,
}

/// The requests of `config`, in arrival order.
pub fn generate(config: &WorkloadConfig) -> Vec<Request> {
    let mut rng = SmallRng::seed_from_u64(config.seed);
    let system_prompts: Vec<Vec<u32>> = (0..config.system_prompts)
        .map(|_| tokens(&mut rng, config.system_prompt_tokens))
        .collect();
    let open = |rng: &mut SmallRng, id: usize| {
        let system = rng.gen_range(0..config.system_prompts);
        Session {
            id,
            namespace: Namespace(system as u32 % config.namespaces.max(1)),
            history: system_prompts[system].clone(),
            turn: 0,
            turns: rng.gen_range(config.turns.0..=config.turns.1),
        }
    };
    let mut started = config.concurrent_sessions.min(config.sessions);
    let mut sessions: Vec<Session> = (0..started).map(|id| open(&mut rng, id)).collect();
    let mut requests = Vec::new();
    while !sessions.is_empty() {
        let at = rng.gen_range(0..sessions.len());
        let session = &mut sessions[at];
        let user = rng.gen_range(config.user_tokens.0..=config.user_tokens.1);
        session.history.extend(tokens(&mut rng, user));
        let reply_len = rng.gen_range(config.reply_tokens.0..=config.reply_tokens.1);
        let reply = tokens(&mut rng, reply_len);
        requests.push(Request {
            session: session.id,
            namespace: session.namespace,
            prompt: session.history.clone(),
            reply: reply.clone(),
        });
        session.history.extend(reply);
        session.turn += 1;
        if session.turn == session.turns {
            if started < config.sessions {
                sessions[at] = open(&mut rng, started);
                started += 1;
            } else {
                sessions.swap_remove(at);
            }
        }
    }
    requests
}

/// `count` random tokens of a 32k vocabulary.
fn tokens(rng: &mut SmallRng, count: usize) -> Vec<u32> {
    (0..count).map(|_| rng.gen_range(0..32_000)).collect()
}
