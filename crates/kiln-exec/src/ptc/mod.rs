//! Programmatic tool calling: a run whose program calls the host's tools
//! and is *paused*, alive, while the host runs them.
//!
//! The official server replays the whole program on every round trip, so
//! code between tool calls runs again each time. Kiln keeps the program
//! running: a tool function in the jail sends its call over the run's tool
//! channel (a TCP listener at `127.0.0.1:81` inside the jail's own network
//! namespace, reachable from that jail only; see `channel.rs`) and blocks
//! for the answer. The [`Bridge`] gathers the calls that arrive together
//! (`asyncio.gather`, bash background jobs) into one *round*, stops the
//! run's wall clock ([`PauseClock`]) and publishes the round; the face
//! answers its client `tool_call_required`, and when the client posts the
//! results, [`Bridge::resume`] hands them to the waiting tool functions and
//! starts the clock again. Code between calls runs exactly once.
//!
//! A paused run holds its jail: a round left unanswered for the state TTL
//! ends the run ([`BridgeFailure::Expired`]); the whole pause budget of a
//! run is bounded too ([`PtcLimits::max_paused`]). Nothing secret enters
//! the jail: the channel carries only tool names, inputs and results.

mod channel;
pub mod program;
pub mod registry;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use kiln_core::Language;
use kiln_sandbox::PauseClock;
use serde_json::Value;
use tokio::sync::{oneshot, watch};

pub use channel::TOOLS_PORT;
pub(crate) use channel::ToolChannel;

use crate::runs::{CancelReason, RunContext, RunEvent};

/// How long the bridge waits for more calls once one arrived, so calls
/// made together go out in one round.
const SETTLE: Duration = Duration::from_millis(40);

/// One tool the program may call, as the client declared it.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolDef {
    pub name: String,
    /// Its JSON Schema (`{type: object, properties, required}`), if any:
    /// Python's stubs take its properties as parameters.
    pub parameters: Option<Value>,
}

/// A call the program made, as the host sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    /// `call_001`, `call_002`, … in the order the calls arrived.
    pub id: String,
    pub name: String,
    /// The keyword arguments.
    pub input: Value,
}

/// The host's answer to one call.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolResult {
    pub result: Value,
    pub is_error: bool,
    pub error_message: Option<String>,
}

impl ToolResult {
    /// Bytes it adds to the run's history.
    fn size(&self) -> usize {
        self.result.to_string().len() + self.error_message.as_ref().map_or(0, String::len)
    }
}

/// The bounds of one programmatic run.
#[derive(Debug, Clone)]
pub struct PtcLimits {
    /// Most tool calls one run may make.
    pub max_calls: usize,
    /// Most bytes of tool results one run may receive.
    pub max_history_bytes: usize,
    /// A round left unanswered this long ends the run.
    pub state_ttl: Duration,
    /// Most time one run may spend paused in all.
    pub max_paused: Duration,
}

impl Default for PtcLimits {
    fn default() -> Self {
        PtcLimits {
            max_calls: 200,
            max_history_bytes: 40 * 1024 * 1024,
            state_ttl: Duration::from_secs(600),
            // the client's 20 round trips, each with the whole TTL
            max_paused: Duration::from_secs(600 * 20),
        }
    }
}

/// Why a bridge gave up on its run (the run is cancelled with it).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BridgeFailure {
    /// The program called a tool the request did not declare.
    #[error("Sandbox requested an unregistered tool: {0}")]
    UnregisteredTool(String),
    /// More calls than [`PtcLimits::max_calls`].
    #[error("Tool call limit exceeded: at most {0} tool calls per execution")]
    TooManyCalls(usize),
    /// A round was not answered within the state TTL.
    #[error("Execution not found or expired")]
    Expired,
}

/// What a continuation may be refused for.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResumeError {
    /// A `call_id` this run never issued.
    #[error("Unknown call_id for this execution: {0}")]
    UnknownCall(String),
    /// A result for an answered call that differs from its first answer.
    #[error("Conflicting result for {0}: a different result was already submitted")]
    Conflict(String),
    /// Calls of the open round the continuation did not answer.
    #[error("tool_results must answer every pending call; missing: {0}")]
    Incomplete(String),
    /// The run's results would exceed [`PtcLimits::max_history_bytes`].
    #[error("Tool result history exceeds {0} bytes")]
    HistoryTooLarge(usize),
}

/// How a continuation's results were taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resumed {
    /// They answered the open round: the program goes on.
    Delivered,
    /// Every one was already answered, identically (a retry).
    Repeated,
}

/// What a tool function in the jail gets back.
#[derive(Debug)]
enum Reply {
    Ok(Value),
    Err(String),
}

#[derive(Debug)]
struct Call {
    name: String,
    input: Value,
    /// The waiting tool function; taken when answered.
    reply: Option<oneshot::Sender<Reply>>,
    answer: Option<ToolResult>,
}

#[derive(Debug, Default)]
struct State {
    /// Every call issued, by id.
    calls: HashMap<String, Call>,
    /// Ids arrived but not yet in a round, in order.
    gathering: Vec<String>,
    /// The open round's ids (empty: none is open).
    round: Vec<String>,
    history_bytes: usize,
    failure: Option<BridgeFailure>,
}

/// What watchers of a bridge see change.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Signal {
    /// Rounds published so far.
    pub rounds: u32,
    pub failed: bool,
    /// Bumped on every change (calls arriving, rounds answered).
    tick: u64,
}

/// The host side of one programmatic run (see the module docs). Shared by
/// the face (which publishes rounds and resumes) and the pipeline (which
/// serves the tool channel). Cheap to share through an `Arc`.
#[derive(Debug)]
pub struct Bridge {
    lang: Language,
    tools: Vec<ToolDef>,
    limits: PtcLimits,
    clock: PauseClock,
    state: Mutex<State>,
    signal: watch::Sender<Signal>,
    /// The run, once it executes (to end it when the bridge gives up).
    run: OnceLock<RunContext>,
}

impl Bridge {
    pub fn new(lang: Language, tools: Vec<ToolDef>, limits: PtcLimits) -> Arc<Bridge> {
        Arc::new(Bridge {
            lang,
            tools,
            clock: PauseClock::new(limits.max_paused),
            limits,
            state: Mutex::default(),
            signal: watch::Sender::new(Signal::default()),
            run: OnceLock::new(),
        })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn bump(&self, f: impl FnOnce(&mut Signal)) {
        self.signal.send_modify(|s| {
            s.tick += 1;
            f(s);
        });
    }

    pub fn lang(&self) -> Language {
        self.lang
    }

    pub fn tools(&self) -> &[ToolDef] {
        &self.tools
    }

    pub fn limits(&self) -> &PtcLimits {
        &self.limits
    }

    /// The run's wall clock (stopped while a round is open).
    pub fn clock(&self) -> &PauseClock {
        &self.clock
    }

    /// The program the jail runs: the tool surface, then `code`.
    pub fn program(&self, code: &str) -> String {
        program::program(self.lang, &self.tools, code)
    }

    /// Watches rounds and failure.
    pub fn subscribe(&self) -> watch::Receiver<Signal> {
        self.signal.subscribe()
    }

    /// Why the bridge gave up, if it did.
    pub fn failure(&self) -> Option<BridgeFailure> {
        self.state().failure.clone()
    }

    /// The open round's calls (empty when none is open).
    pub fn open_round(&self) -> Vec<ToolCall> {
        let st = self.state();
        st.round
            .iter()
            .filter_map(|id| {
                st.calls.get(id).map(|c| ToolCall {
                    id: id.clone(),
                    name: c.name.clone(),
                    input: c.input.clone(),
                })
            })
            .collect()
    }

    /// Calls issued so far.
    pub fn calls_issued(&self) -> usize {
        self.state().calls.len()
    }

    /// Ties the bridge to its run (the pipeline does, once it executes).
    pub(crate) fn attach(&self, run: &RunContext) {
        let _ = self.run.set(run.clone());
    }

    /// Gives up: answers every waiting tool function with an error and
    /// cancels the run.
    pub fn fail(&self, why: BridgeFailure) {
        {
            let mut st = self.state();
            if st.failure.is_some() {
                return;
            }
            st.failure = Some(why.clone());
            for call in st.calls.values_mut() {
                if let Some(tx) = call.reply.take() {
                    let _ = tx.send(Reply::Err(why.to_string()));
                }
            }
        }
        self.bump(|s| s.failed = true);
        if let Some(run) = self.run.get() {
            run.cancel(CancelReason::Requested);
        }
    }

    /// Calls from the jail: each gets an id and joins the next round; the
    /// receivers yield the answers in order. A call of an undeclared tool
    /// or past the call cap makes the bridge give up.
    fn submit(&self, calls: Vec<(String, Value)>) -> Vec<oneshot::Receiver<Reply>> {
        let mut replies = Vec::with_capacity(calls.len());
        let mut failure = None;
        {
            let mut st = self.state();
            for (name, input) in calls {
                let (tx, rx) = oneshot::channel();
                replies.push(rx);
                if st.failure.is_some() || failure.is_some() {
                    continue;
                }
                if !self.tools.iter().any(|t| t.name == name) {
                    failure = Some(BridgeFailure::UnregisteredTool(name));
                    continue;
                }
                if st.calls.len() >= self.limits.max_calls {
                    failure = Some(BridgeFailure::TooManyCalls(self.limits.max_calls));
                    continue;
                }
                let id = format!("call_{:03}", st.calls.len() + 1);
                st.calls.insert(
                    id.clone(),
                    Call {
                        name,
                        input,
                        reply: Some(tx),
                        answer: None,
                    },
                );
                st.gathering.push(id);
            }
        }
        match failure {
            Some(f) => self.fail(f),
            None => self.bump(|_| {}),
        }
        replies
    }

    /// Publishes the calls gathered so far as a round and stops the clock;
    /// `false` when there were none (or a round is still open).
    fn open(&self) -> bool {
        {
            let mut st = self.state();
            if st.gathering.is_empty() || !st.round.is_empty() || st.failure.is_some() {
                return false;
            }
            st.round = std::mem::take(&mut st.gathering);
        }
        self.clock.pause();
        // the run's watchers see the round too
        if let Some(run) = self.run.get() {
            run.log().push(RunEvent::ToolCalls(self.open_round()));
        }
        self.bump(|s| s.rounds += 1);
        true
    }

    /// Takes a continuation's results (see [`ResumeError`] for what is
    /// refused; nothing is delivered then).
    pub fn resume(&self, results: Vec<(String, ToolResult)>) -> Result<Resumed, ResumeError> {
        let delivered = {
            let mut st = self.state();
            let mut fresh = Vec::new();
            let mut added = 0usize;
            for (id, r) in &results {
                let Some(call) = st.calls.get(id) else {
                    return Err(ResumeError::UnknownCall(id.clone()));
                };
                match &call.answer {
                    Some(prev) if prev == r => {}
                    Some(_) => return Err(ResumeError::Conflict(id.clone())),
                    None if st.round.contains(id) => {
                        added += r.size();
                        fresh.push(id.clone());
                    }
                    // issued, not yet published: the host cannot know it
                    None => return Err(ResumeError::UnknownCall(id.clone())),
                }
            }
            if fresh.is_empty() {
                return Ok(Resumed::Repeated);
            }
            let missing: Vec<&str> = st
                .round
                .iter()
                .filter(|id| !fresh.contains(id))
                .map(String::as_str)
                .collect();
            if !missing.is_empty() {
                return Err(ResumeError::Incomplete(missing.join(", ")));
            }
            if st.history_bytes + added > self.limits.max_history_bytes {
                return Err(ResumeError::HistoryTooLarge(self.limits.max_history_bytes));
            }
            st.history_bytes += added;
            for (id, r) in results {
                let Some(call) = st.calls.get_mut(&id) else {
                    continue;
                };
                if call.answer.is_some() {
                    continue;
                }
                if let Some(tx) = call.reply.take() {
                    let _ = tx.send(if r.is_error {
                        Reply::Err(error_text(&r))
                    } else {
                        Reply::Ok(r.result.clone())
                    });
                }
                call.answer = Some(r);
            }
            st.round.clear();
            true
        };
        if delivered {
            self.clock.resume();
            self.bump(|_| {});
        }
        Ok(Resumed::Delivered)
    }

    /// Gathers calls into rounds for as long as the run's step lasts:
    /// waits for a call, lets the calls made together arrive, publishes
    /// them, and gives up when the round is not answered within the TTL.
    pub(crate) async fn rounds(self: Arc<Self>) {
        let mut rx = self.subscribe();
        loop {
            let ready = rx
                .wait_for(|s| s.failed || self.has_gathered())
                .await
                .map(|s| s.failed);
            if !matches!(ready, Ok(false)) {
                return;
            }
            // let the calls made together arrive
            loop {
                let n = self.state().gathering.len();
                tokio::time::sleep(SETTLE).await;
                if self.state().gathering.len() == n {
                    break;
                }
            }
            if !self.open() {
                continue;
            }
            let answered = tokio::time::timeout(
                self.limits.state_ttl,
                rx.wait_for(|s| s.failed || self.state().round.is_empty()),
            )
            .await;
            match answered {
                Ok(Ok(s)) if !s.failed => {}
                Ok(_) => return,
                Err(_) => {
                    self.fail(BridgeFailure::Expired);
                    return;
                }
            }
        }
    }

    fn has_gathered(&self) -> bool {
        let st = self.state();
        !st.gathering.is_empty() && st.round.is_empty()
    }
}

/// What the program sees of a failed tool: its message, else its result.
fn error_text(r: &ToolResult) -> String {
    match (&r.error_message, &r.result) {
        (Some(m), _) if !m.is_empty() => m.clone(),
        (_, Value::String(s)) if !s.is_empty() => s.clone(),
        (_, Value::Null) => "tool failed".to_owned(),
        (_, v) => v.to_string(),
    }
}

#[cfg(test)]
mod tests;
