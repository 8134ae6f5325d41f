//! Watching a run over Server-Sent Events, for every face.
//!
//! A run's events become SSE events, in order:
//!
//! | event | data |
//! |---|---|
//! | `queued` | `{"run_id", "position"}`: runs ahead of it in the queue |
//! | `started` | `{"run_id", "step"}`: `compile` or `run` began |
//! | `stdout`, `stderr` | `{"text"}`: output as the program wrote it (UTF-8, at most 4 KiB) |
//! | `file` | an output file as the face shows one in its result |
//! | `result` | exactly the JSON the face's non-streaming call returns |
//! | `error` | `{"status", "error"}`: the HTTP status and body the non-streaming call would have answered |
//!
//! `result` or `error` is the last event. A comment line goes out after
//! every [`KEEP_ALIVE`] without an event, so proxies keep long runs open.
//! The stream reads the run's log at the client's pace: a slow client holds
//! a cursor, not a buffer.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::http::header::{CACHE_CONTROL, LOCATION};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::future::BoxFuture;
use futures::stream;
use kiln_exec::{ExecError, ExecResult, OutputFile, RunEvent, RunHandle, Subscriber};
use serde::Serialize;
use serde_json::{Value, json};
use utoipa::ToSchema;

/// Longest quiet time on an event stream before a keep-alive comment.
pub const KEEP_ALIVE: Duration = Duration::from_millis(1500);

/// The response header naming the run a response watches.
pub const RUN_ID: HeaderName = HeaderName::from_static("x-kiln-run-id");

/// How a face shows a run's result, errors and files.
pub trait Face: Send + Sync + 'static {
    /// The JSON of the face's non-streaming answer for a completed run.
    fn result<'a>(&'a self, run: &'a RunHandle, r: &'a ExecResult) -> BoxFuture<'a, Value>;
    /// The status and body of the face's answer for a failed run.
    fn error(&self, e: &ExecError) -> (StatusCode, Value);
    /// One output file, as the face's result lists it.
    fn file<'a>(&'a self, run: &'a RunHandle, f: &'a OutputFile) -> BoxFuture<'a, Value>;
}

/// Whether the request asks for an event stream (`Accept: text/event-stream`).
pub fn wants_events(headers: &HeaderMap) -> bool {
    headers
        .get_all(axum::http::header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|m| {
            m.split(';')
                .next()
                .unwrap_or_default()
                .trim()
                .eq_ignore_ascii_case("text/event-stream")
        })
}

/// How the stream treats a run that fails before its first event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Early {
    /// As the non-streaming call would: an HTTP error (run-starting routes:
    /// a bad input is a 400, not a 200 stream with an error event).
    HttpError,
    /// As an `error` event (watching an existing run).
    Event,
}

/// Streams `run`'s events; `keep` lives as long as the stream (the `Watch`
/// of a run this request started: the client going away drops it).
pub async fn respond<K: Send + 'static>(
    run: RunHandle,
    face: Arc<dyn Face>,
    early: Early,
    keep: K,
) -> Response {
    let mut sub = run.subscribe();
    let first = sub.next().await;
    if early == Early::HttpError
        && let Some(RunEvent::Done(outcome)) = &first
        && let Err(e) = &**outcome
    {
        let (status, body) = face.error(e);
        let mut resp = (status, axum::Json(body)).into_response();
        insert_run_id(resp.headers_mut(), &run);
        return resp;
    }
    let state = Cursor {
        run: run.clone(),
        face,
        sub,
        first,
        done: false,
        _keep: keep,
    };
    let events = stream::unfold(state, |mut c| async move {
        let ev = c.next_event().await?;
        Some((Ok::<_, Infallible>(ev), c))
    });
    let mut resp = response(events);
    insert_run_id(resp.headers_mut(), &run);
    resp
}

/// An SSE response of `events`, as every streaming route answers: a
/// keep-alive comment every [`KEEP_ALIVE`], not cached, not buffered by
/// proxies.
pub fn response<S>(events: S) -> Response
where
    S: futures::Stream<Item = Result<Event, Infallible>> + Send + 'static,
{
    let mut resp = Sse::new(events)
        .keep_alive(KeepAlive::new().interval(KEEP_ALIVE))
        .into_response();
    let h = resp.headers_mut();
    h.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    // nginx and friends: do not buffer the stream
    h.insert(
        HeaderName::from_static("x-accel-buffering"),
        HeaderValue::from_static("no"),
    );
    resp
}

/// The run id header every face sets, its own API's and the others'.
pub const X_RUN_ID: HeaderName = HeaderName::from_static("x-run-id");

/// Sets [`RUN_ID`] and [`X_RUN_ID`].
pub fn insert_run_id(h: &mut HeaderMap, run: &RunHandle) {
    if let Ok(v) = HeaderValue::from_str(run.id().as_str()) {
        h.insert(X_RUN_ID, v.clone());
        h.insert(RUN_ID, v);
    }
}

struct Cursor<K> {
    run: RunHandle,
    face: Arc<dyn Face>,
    sub: Subscriber,
    first: Option<RunEvent>,
    done: bool,
    _keep: K,
}

impl<K> Cursor<K> {
    async fn next_event(&mut self) -> Option<Event> {
        if self.done {
            return None;
        }
        let ev = match self.first.take() {
            Some(ev) => ev,
            None => self.sub.next().await?,
        };
        Some(self.render(ev).await)
    }

    async fn render(&mut self, ev: RunEvent) -> Event {
        let id = self.run.id().as_str().to_owned();
        match ev {
            RunEvent::Queued { position } => {
                data("queued", &json!({ "run_id": id, "position": position }))
            }
            RunEvent::Started { step } => {
                data("started", &json!({ "run_id": id, "step": step.as_str() }))
            }
            RunEvent::Output { stream, text } => data(stream.as_str(), &json!({ "text": text })),
            RunEvent::File(f) => data("file", &self.face.file(&self.run, &f).await),
            RunEvent::Done(outcome) => {
                self.done = true;
                match &*outcome {
                    Ok(r) => data("result", &self.face.result(&self.run, r).await),
                    Err(e) => {
                        let (status, body) = self.face.error(e);
                        data(
                            "error",
                            &json!({ "status": status.as_u16(), "error": body }),
                        )
                    }
                }
            }
            RunEvent::ToolCalls(calls) => {
                let calls: Vec<Value> = calls
                    .into_iter()
                    .map(|c| json!({"id": c.id, "name": c.name, "input": c.input}))
                    .collect();
                data("tool_calls", &json!({ "run_id": id, "tool_calls": calls }))
            }
            // events of later kinds are not shown by these faces yet
            _ => Event::default().comment("event"),
        }
    }
}

fn data(name: &str, v: &Value) -> Event {
    Event::default().event(name).data(v.to_string())
}

/// Where to find a run.
#[derive(Debug, Serialize, ToSchema)]
pub struct RunLinks {
    #[serde(rename = "self")]
    pub this: String,
    pub events: String,
    pub cancel: String,
}

impl RunLinks {
    pub fn of(run: &RunHandle) -> RunLinks {
        let base = format!("/v1/runs/{}", run.id());
        RunLinks {
            events: format!("{base}/events"),
            cancel: format!("{base}/cancel"),
            this: base,
        }
    }
}

/// The answer to a detached run started with `Prefer: respond-async`.
#[derive(Debug, Serialize, ToSchema)]
pub struct RunStarted {
    pub run_id: String,
    /// `queued` (or already further).
    pub status: String,
    pub links: RunLinks,
}

/// 202 with the new run's id and where to watch it.
pub fn started_response(run: &RunHandle) -> Response {
    let body = RunStarted {
        run_id: run.id().as_str().to_owned(),
        status: run.info().phase.as_str().to_owned(),
        links: RunLinks::of(run),
    };
    let mut resp = (StatusCode::ACCEPTED, Json(body)).into_response();
    let h = resp.headers_mut();
    if let Ok(v) = HeaderValue::from_str(&format!("/v1/runs/{}", run.id())) {
        h.insert(LOCATION, v);
    }
    h.insert(
        HeaderName::from_static("preference-applied"),
        HeaderValue::from_static("respond-async"),
    );
    insert_run_id(h, run);
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_explicit_event_stream_accept_asks_for_events() {
        let h = |v: &str| {
            let mut m = HeaderMap::new();
            m.insert(axum::http::header::ACCEPT, v.parse().unwrap());
            m
        };
        assert!(wants_events(&h("text/event-stream")));
        assert!(wants_events(&h(
            "application/json, text/event-stream;q=0.9"
        )));
        assert!(!wants_events(&h("application/json")));
        assert!(!wants_events(&h("*/*")));
        assert!(!wants_events(&HeaderMap::new()));
    }
}
