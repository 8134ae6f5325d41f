//! Kernel evaluations for every face of live kernels (Kiln's sessions,
//! seed 003's runtime, seed 004's workers, MCP): each is a run of the one
//! registry ([`kiln_exec::Work::Eval`]), started here, answered from the
//! run's outcome, and streamed from the run's event log.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::http::HeaderMap;
use axum::response::sse::Event;
use kiln_core::access::Caller;
use kiln_exec::eval::Eval;
use kiln_exec::kernels::{EvalResult, Kernel, Kernels};
use kiln_exec::{ExecError, ExecResult, RunEvent, RunHandle, StartOptions, Stream, Watch, Work};

use crate::config::AppState;
use crate::error::ApiError;

/// Starts evaluating `code` in `session`'s kernel as a run of `caller`'s
/// (counted against the caller's rate limit like any run). Detached: a
/// client that goes away does not cut an evaluation short (the kernel's
/// state stays in step); a cancel of the run interrupts it.
#[allow(clippy::too_many_arguments)]
pub fn start(
    state: &AppState,
    headers: &HeaderMap,
    caller: Caller,
    kernels: &Kernels,
    session: Arc<Kernel>,
    code: String,
    timeout: Option<Duration>,
) -> Result<Watch, ApiError> {
    let opts = StartOptions {
        detach: true,
        request_id: crate::middleware::request_id(headers),
    };
    let work = Work::Eval(Eval::new(kernels, session, code, timeout));
    Ok(state.runs.start(caller, work, opts)?)
}

/// The kernel's answer an evaluation's run ended with, or why there is
/// none (a kernel error as the sessions API answers it, else the run's).
pub fn answer(outcome: &Result<ExecResult, ExecError>) -> Result<Arc<EvalResult>, ApiError> {
    match outcome {
        Ok(r) => r
            .evaluation
            .clone()
            .ok_or_else(|| ApiError::Exec(ExecError::Internal("the run evaluated nothing".into()))),
        Err(ExecError::Kernel(e)) => Err(ApiError::Kernel(e.clone())),
        Err(e) => Err(ApiError::Exec(e.clone())),
    }
}

/// How an evaluation ended, as the faces of live kernels say it: `ok`,
/// `error` (the code raised) or `timeout` (interrupted by its timeout).
pub fn status(r: &EvalResult) -> &'static str {
    if r.timed_out {
        "timeout"
    } else if r.error.is_some() {
        "error"
    } else {
        "ok"
    }
}

/// Waits for the evaluation `watch` runs and returns its answer.
pub async fn finish(watch: &Watch) -> Result<Arc<EvalResult>, ApiError> {
    answer(&*watch.outcome().await)
}

/// The Server-Sent Events of an evaluation, read from its run's log at the
/// client's pace: each piece of output as `output` renders it, then the
/// events `done` renders of its answer. `watch` lives as long as the
/// stream.
pub fn events<O, D>(
    watch: Watch,
    output: O,
    done: D,
) -> impl futures::Stream<Item = Result<Event, Infallible>> + Send + 'static
where
    O: Fn(Stream, &str) -> Event + Send + Sync + 'static,
    D: FnOnce(&RunHandle, Result<Arc<EvalResult>, ApiError>) -> Vec<Event> + Send + 'static,
{
    let sub = watch.subscribe();
    let output = Arc::new(output);
    let state = (watch, sub, Some(done), VecDeque::<Event>::new());
    futures::stream::unfold(state, move |(watch, mut sub, mut done, mut last)| {
        let output = Arc::clone(&output);
        async move {
            loop {
                if let Some(ev) = last.pop_front() {
                    return Some((Ok(ev), (watch, sub, done, last)));
                }
                // its answer was the last
                let render = done.take()?;
                match sub.next().await? {
                    RunEvent::Output { stream, text } => {
                        let ev = output(stream, &text);
                        return Some((Ok(ev), (watch, sub, Some(render), last)));
                    }
                    RunEvent::Done(outcome) => {
                        last = render(watch.handle(), answer(&outcome)).into();
                    }
                    _ => done = Some(render),
                }
            }
        }
    })
}
