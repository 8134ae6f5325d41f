//! The one admission extractor: what a face's handler used to do by hand
//! before it parsed anything, in one order for every face.
//!
//! [`Admitted<R, C, B, G>`] runs, in this order:
//!
//! 1. **shutdown**: a server that is shutting down refuses new work with
//!    503 (only where the gate `G` says the route starts work);
//! 2. **content type**: a JSON body must be `application/json` or
//!    `…+json` (a missing one is tolerated), else 415 (body kind `B` =
//!    [`JsonBody`]);
//! 3. the gate's check before the read ([`Queues`]: a full queue refuses
//!    before the body is read, so it does not also hold every waiting
//!    client's body in memory);
//! 4. **a bounded read** of at most the body kind's limit (413 beyond,
//!    checked against `Content-Length` first);
//! 5. **the caller** `C`: the verified token's, else the `User-Id`
//!    header's ([`Caller`]); or [`Unresolved`] where the body names the
//!    caller too or the face checks more first.
//!
//! Every refusal is rendered in the face's own envelope `R` (any type that
//! takes an [`ApiError`] and the gate's refusal), so an answer is the same
//! whichever face's handler used to write it. Admission reads only the
//! [`Door`]: the configuration, the shutdown token and the run queue.

use std::marker::PhantomData;
use std::sync::Arc;

use axum::extract::{FromRef, FromRequest, Request};
use axum::http::HeaderMap;
use axum::response::IntoResponse;
use bytes::Bytes;
use kiln_exec::{ExecError, Runs};
use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;

use crate::body::{read_limited, require_json};
use crate::config::{ApiConfig, AppState};
use crate::error::ApiError;
use crate::identity::{Caller, Identity, header_user_id, resolve_caller};

/// What admission reads of the server.
#[derive(Clone)]
pub struct Door {
    pub config: Arc<ApiConfig>,
    /// Cancelled when the server begins shutting down.
    pub shutdown: CancellationToken,
    /// The run registry, for its queue.
    pub runs: Runs,
}

impl FromRef<AppState> for Door {
    fn from_ref(state: &AppState) -> Door {
        Door {
            config: Arc::clone(&state.config),
            shutdown: state.shutdown.clone(),
            runs: state.runs.clone(),
        }
    }
}

/// Which body a route reads, and how much of it.
pub trait BodyKind: 'static {
    /// Whether the body is read at all.
    const READ: bool = true;
    /// Whether it must be JSON (415 otherwise).
    const JSON: bool = false;
    /// The most bytes it may hold (413 beyond).
    fn limit(config: &ApiConfig) -> usize {
        config.max_json_bytes
    }
}

/// A JSON body of at most `max_json_bytes`.
pub enum JsonBody {}
impl BodyKind for JsonBody {
    const JSON: bool = true;
}

/// Any bytes, at most `max_json_bytes` (seed 000's run, whatever its
/// content type).
pub enum RawBody {}
impl BodyKind for RawBody {}

/// A file's bytes written to a live thing (a session's, a sandbox's
/// workspace): any content type, at most `max_upload_bytes`.
pub enum FileBody {}
impl BodyKind for FileBody {
    fn limit(config: &ApiConfig) -> usize {
        usize::try_from(config.max_upload_bytes).unwrap_or(usize::MAX)
    }
}

/// No body: it is left unread.
pub enum NoBody {}
impl BodyKind for NoBody {
    const READ: bool = false;
}

/// Whether a route starts work, and what it checks before the read.
pub trait Gate: 'static {
    /// How the gate words a refusal.
    type Refusal;
    /// Refused while shutting down.
    const STARTS_WORK: bool;
    /// The refusal while shutting down.
    fn shutting_down() -> Self::Refusal;
    /// Checked after the content type, before the body is read.
    fn before_read(_door: &Door) -> Result<(), Self::Refusal> {
        Ok(())
    }
}

/// A route that starts work: refused while shutting down.
pub enum Starts {}
impl Gate for Starts {
    type Refusal = ApiError;
    const STARTS_WORK: bool = true;
    fn shutting_down() -> ApiError {
        ApiError::ShuttingDown
    }
}

/// A route that reads, changes or ends what exists (or refuses new work
/// further in): served while shutting down.
pub enum Open {}
impl Gate for Open {
    type Refusal = ApiError;
    const STARTS_WORK: bool = false;
    fn shutting_down() -> ApiError {
        ApiError::ShuttingDown
    }
}

/// A route that queues a run: refused while shutting down and, before its
/// body is read, when the queue is full, both in the run registry's words.
pub enum Queues {}
impl Gate for Queues {
    type Refusal = ExecError;
    const STARTS_WORK: bool = true;
    fn shutting_down() -> ExecError {
        ExecError::ShuttingDown
    }
    fn before_read(door: &Door) -> Result<(), ExecError> {
        match door.runs.saturated() {
            Some(retry_after) => Err(ExecError::Busy { retry_after }),
            None => Ok(()),
        }
    }
}

/// How the caller is known once the body is read.
pub trait Resolve: Sized + Send {
    fn resolve(
        config: &ApiConfig,
        identity: &Identity,
        headers: &HeaderMap,
    ) -> Result<Self, ApiError>;
}

/// The verified token's caller, else the `User-Id` header's (the one
/// identity source of every face whose body names nobody).
impl Resolve for Caller {
    fn resolve(
        config: &ApiConfig,
        identity: &Identity,
        headers: &HeaderMap,
    ) -> Result<Caller, ApiError> {
        resolve_caller(config, identity, &[header_user_id(headers)?])
    }
}

/// The face resolves the caller itself: the body names it too (`/exec`'s
/// and the programmatic face's `user_id`), only some messages need one
/// (MCP's notifications do not), or the face checks more first (the
/// sandbox bridge's session header, a session's owner).
#[derive(Debug, Clone, Copy)]
pub struct Unresolved;

impl Resolve for Unresolved {
    fn resolve(_: &ApiConfig, _: &Identity, _: &HeaderMap) -> Result<Unresolved, ApiError> {
        Ok(Unresolved)
    }
}

/// A request admitted for a face whose refusals are `R`: its body of kind
/// `B` (empty with [`NoBody`]) and its caller `C`, through gate `G`.
/// Extract it last.
pub struct Admitted<R, C = Unresolved, B = JsonBody, G = Starts> {
    pub body: Bytes,
    pub caller: C,
    kind: PhantomData<Kind<R, B, G>>,
}

/// The face, body kind and gate an [`Admitted`] was admitted by (types
/// only: nothing of them is held).
type Kind<R, B, G> = fn() -> (R, B, G);

impl<R, C, B, G> Admitted<R, C, B, G> {
    /// The body as a `T`; a refusal names the field (`invalid body: code:
    /// invalid type: integer 5, expected a string`).
    pub fn json<T: DeserializeOwned>(&self) -> Result<T, ApiError> {
        serde_path_to_error::deserialize(&mut serde_json::Deserializer::from_slice(&self.body))
            .map_err(|e| ApiError::BadRequest(format!("invalid body: {e}")))
    }
}

impl<R, C, B, G, S> FromRequest<S> for Admitted<R, C, B, G>
where
    R: From<ApiError> + From<G::Refusal> + IntoResponse,
    C: Resolve,
    B: BodyKind,
    G: Gate,
    Door: FromRef<S>,
    S: Send + Sync,
{
    type Rejection = R;

    async fn from_request(req: Request, state: &S) -> Result<Self, R> {
        let door = Door::from_ref(state);
        if G::STARTS_WORK && door.shutdown.is_cancelled() {
            return Err(G::shutting_down().into());
        }
        let (parts, body) = req.into_parts();
        if B::JSON {
            require_json(&parts.headers)?;
        }
        G::before_read(&door)?;
        let body = if B::READ {
            read_limited(&parts.headers, body, B::limit(&door.config)).await?
        } else {
            Bytes::new()
        };
        let identity = parts
            .extensions
            .get::<Identity>()
            .cloned()
            .unwrap_or_default();
        let caller = C::resolve(&door.config, &identity, &parts.headers)?;
        Ok(Admitted {
            body,
            caller,
            kind: PhantomData,
        })
    }
}

#[cfg(test)]
mod tests {
    use axum::body::Body;
    use axum::http::StatusCode;
    use axum::response::Response;

    use super::*;

    /// Refusals of the test face: its status and the `error` text.
    #[derive(Debug)]
    struct Refused(StatusCode, String);

    impl From<ApiError> for Refused {
        fn from(e: ApiError) -> Refused {
            let (status, body) = e.status_and_body();
            Refused(
                status,
                body["error"].as_str().unwrap_or_default().to_owned(),
            )
        }
    }

    /// The test gate's own words.
    struct Words(&'static str);
    impl From<Words> for Refused {
        fn from(w: Words) -> Refused {
            Refused(StatusCode::SERVICE_UNAVAILABLE, w.0.to_owned())
        }
    }

    impl IntoResponse for Refused {
        fn into_response(self) -> Response {
            (self.0, self.1).into_response()
        }
    }

    /// JSON of 8 bytes at most.
    enum Small {}
    impl BodyKind for Small {
        const JSON: bool = true;
        fn limit(_: &ApiConfig) -> usize {
            8
        }
    }

    /// Starts work in its own words; its queue is full on a server of
    /// tenant `full`.
    enum Full {}
    impl Gate for Full {
        type Refusal = Words;
        const STARTS_WORK: bool = true;
        fn shutting_down() -> Words {
            Words("face: shutting down")
        }
        fn before_read(door: &Door) -> Result<(), Words> {
            if door.config.tenant == "full" {
                return Err(Words("full"));
            }
            Ok(())
        }
    }

    type JsonFace = Admitted<Refused, Caller, Small, Full>;

    /// Admission starts nothing.
    struct NoExec;
    impl kiln_exec::Execute for NoExec {
        fn execute<'a>(
            &'a self,
            _: &'a kiln_exec::RunContext,
            _: kiln_exec::Work,
        ) -> futures::future::BoxFuture<'a, Result<kiln_exec::ExecResult, ExecError>> {
            Box::pin(async { Err(ExecError::Internal("admission starts no run".into())) })
        }
    }

    fn door(require_identity: bool, full: bool) -> Door {
        let config = ApiConfig {
            require_identity,
            tenant: if full { "full" } else { "local" }.to_owned(),
            ..ApiConfig::default()
        };
        Door {
            config: Arc::new(config),
            shutdown: CancellationToken::new(),
            runs: Runs::new(Arc::new(NoExec), kiln_exec::RunsConfig::default()),
        }
    }

    fn request(content_type: Option<&str>, user: Option<&str>, body: &'static str) -> Request {
        let mut b = Request::builder().method("POST").uri("/x");
        if let Some(ct) = content_type {
            b = b.header("content-type", ct);
        }
        if let Some(u) = user {
            b = b.header("user-id", u);
        }
        b.body(Body::from(body)).unwrap()
    }

    async fn refusal<A>(door: &Door, req: Request) -> (StatusCode, String)
    where
        A: FromRequest<Door, Rejection = Refused>,
    {
        match A::from_request(req, door).await {
            Ok(_) => panic!("admitted"),
            Err(Refused(status, text)) => (status, text),
        }
    }

    #[tokio::test]
    async fn an_admitted_json_request_carries_its_body_and_header_caller() {
        let door = door(false, false);
        let req = request(Some("application/json"), Some("u1"), "{\"a\":1}");
        let a = JsonFace::from_request(req, &door).await.unwrap();
        assert_eq!(a.body, Bytes::from_static(b"{\"a\":1}"));
        assert_eq!(a.caller.principal.user_id, "u1");
        let v: serde_json::Value = a.json().unwrap();
        assert_eq!(v["a"], 1);
    }

    #[tokio::test]
    async fn each_step_refuses_in_the_faces_envelope() {
        let door = self::door(true, false);
        let ct = refusal::<JsonFace>(&door, request(Some("text/plain"), Some("u"), "{}")).await;
        assert_eq!(ct.0, StatusCode::UNSUPPORTED_MEDIA_TYPE);
        let size = refusal::<JsonFace>(&door, request(None, Some("u"), "{\"ab\":12}")).await;
        assert_eq!(size.0, StatusCode::PAYLOAD_TOO_LARGE);
        let anonymous = refusal::<JsonFace>(&door, request(None, None, "{}")).await;
        assert_eq!(anonymous.0, StatusCode::UNAUTHORIZED);
        let malformed = refusal::<JsonFace>(&door, request(None, Some("a b"), "{}")).await;
        assert_eq!(malformed.0, StatusCode::BAD_REQUEST);
        let full = self::door(true, true);
        let queue = refusal::<JsonFace>(&full, request(None, Some("u"), "{}")).await;
        assert_eq!(queue, (StatusCode::SERVICE_UNAVAILABLE, "full".to_owned()));
        door.shutdown.cancel();
        let shutdown = refusal::<JsonFace>(&door, request(None, Some("u"), "{}")).await;
        assert_eq!(
            shutdown,
            (
                StatusCode::SERVICE_UNAVAILABLE,
                "face: shutting down".to_owned()
            )
        );
    }

    #[tokio::test]
    async fn checks_run_shutdown_then_content_type_then_gate_then_size_then_caller() {
        let wrong = |ct| request(ct, None, "far too long a body");
        let full = door(true, true);
        full.shutdown.cancel();
        let first = refusal::<JsonFace>(&full, wrong(Some("text/plain"))).await;
        assert_eq!(first.1, "face: shutting down");
        let full = door(true, true);
        let second = refusal::<JsonFace>(&full, wrong(Some("text/plain"))).await;
        assert_eq!(second.0, StatusCode::UNSUPPORTED_MEDIA_TYPE);
        let third = refusal::<JsonFace>(&full, wrong(None)).await;
        assert_eq!(third.1, "full");
        let open = door(true, false);
        let fourth = refusal::<JsonFace>(&open, wrong(None)).await;
        assert_eq!(fourth.0, StatusCode::PAYLOAD_TOO_LARGE);
        let fifth = refusal::<JsonFace>(&open, request(None, None, "{}")).await;
        assert_eq!(fifth.0, StatusCode::UNAUTHORIZED);
    }

    #[tokio::test]
    async fn an_open_file_route_skips_shutdown_content_type_and_the_caller() {
        type Upload = Admitted<Refused, Unresolved, FileBody, Open>;
        let door = door(true, false);
        door.shutdown.cancel();
        let req = request(Some("text/plain"), None, "abcd");
        let a = Upload::from_request(req, &door).await.unwrap();
        assert_eq!(a.body, Bytes::from_static(b"abcd"));
    }

    #[tokio::test]
    async fn a_bare_route_leaves_its_body_unread() {
        type Bare = Admitted<Refused, Unresolved, NoBody, Starts>;
        let door = door(false, false);
        let req = request(Some("text/plain"), None, "anything at all, unread");
        assert!(
            Bare::from_request(req, &door)
                .await
                .unwrap()
                .body
                .is_empty()
        );
        door.shutdown.cancel();
        let refused = refusal::<Bare>(&door, request(None, None, "")).await;
        assert_eq!(
            refused,
            (
                StatusCode::SERVICE_UNAVAILABLE,
                "Service is shutting down".to_owned()
            )
        );
    }

    #[tokio::test]
    async fn a_queueing_route_refuses_in_the_run_registrys_words() {
        type Queued = Admitted<ApiError, Unresolved, JsonBody, Queues>;
        let door = door(false, false);
        door.shutdown.cancel();
        let req = request(None, None, "{}");
        let Err(e) = Queued::from_request(req, &door).await else {
            panic!("admitted while shutting down");
        };
        assert!(
            matches!(e, ApiError::Exec(ExecError::ShuttingDown)),
            "{e:?}"
        );
    }
}
