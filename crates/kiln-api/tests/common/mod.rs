//! Test harness: a real server on 127.0.0.1:0 over a real store in a
//! tempdir, with an executor double that records what it was asked and
//! answers as told.

#![allow(dead_code)] // each test binary uses a different part

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::FutureExt as _;
use futures::future::BoxFuture;
use kiln_api::{ApiConfig, AppState, HealthInfo, LanguageHealth};
use kiln_core::outcome::ExitStatus;
use kiln_core::{Language, Nanoid, Principal, RelPath, SessionKey};
use kiln_exec::{ExecError, ExecRequest, ExecResult, Execute, OutputFile, RunContext, Work};
use kiln_store::{NewObject, Store, StoreConfig};
use tokio_util::sync::CancellationToken;

/// How the double answers `/exec`.
#[derive(Clone, Copy, Debug)]
pub enum Reply {
    /// A fixed successful result (see [`canned_result`]).
    Canned,
    /// Fail with the error this function builds.
    Fail(fn() -> ExecError),
    /// Wait until the run is cancelled, then report `Cancelled`.
    HangUntilCancelled,
    /// Panic inside the handler.
    Panic,
}

/// The executor double.
pub struct RecordingExec {
    pub reply: Mutex<Reply>,
    pub calls: Mutex<Vec<(Principal, ExecRequest)>>,
    /// Set by a watcher task when the token of a `HangUntilCancelled` run
    /// fires (the run's own future is dropped with the handler).
    pub cancelled: Arc<AtomicBool>,
    pub started: tokio::sync::Notify,
}

impl RecordingExec {
    pub fn new() -> Self {
        RecordingExec {
            reply: Mutex::new(Reply::Canned),
            calls: Mutex::new(Vec::new()),
            cancelled: Arc::new(AtomicBool::new(false)),
            started: tokio::sync::Notify::new(),
        }
    }

    pub fn set_reply(&self, reply: Reply) {
        *self.reply.lock().unwrap() = reply;
    }

    /// The last request the double received.
    pub fn last(&self) -> (Principal, ExecRequest) {
        self.calls
            .lock()
            .unwrap()
            .last()
            .cloned()
            .expect("the executor was called")
    }

    pub fn call_count(&self) -> usize {
        self.calls.lock().unwrap().len()
    }

    pub fn was_cancelled(&self) -> bool {
        self.cancelled.load(Ordering::SeqCst)
    }
}

/// The fixed result of [`Reply::Canned`]: one new output, one inherited
/// echo, one modified output, exit code 0.
pub fn canned_result() -> ExecResult {
    let sid = Nanoid::parse("EXECsessionAAAAAAAAAA").unwrap();
    let old = Nanoid::parse("OLDsessionBBBBBBBBBBB").unwrap();
    ExecResult {
        session_id: sid.clone(),
        stdout: "hello\n".into(),
        stderr: "warn\n".into(),
        files: vec![
            OutputFile {
                id: Nanoid::parse("newFILEaaaaaaaaaaaaaa").unwrap(),
                name: "out/chart.png".into(),
                storage_session_id: sid.clone(),
                inherited: false,
                modified_from: None,
                entity_id: None,
            },
            OutputFile {
                id: Nanoid::parse("inhFILEbbbbbbbbbbbbbb").unwrap(),
                name: "data.csv".into(),
                storage_session_id: old.clone(),
                inherited: true,
                modified_from: None,
                entity_id: Some("agent_42".into()),
            },
            OutputFile {
                id: Nanoid::parse("modFILEcccccccccccccc").unwrap(),
                name: "notes.md".into(),
                storage_session_id: sid.clone(),
                inherited: false,
                modified_from: Some((Nanoid::parse("orgFILEdddddddddddddd").unwrap(), old)),
                entity_id: None,
            },
        ],
        deleted_files: vec!["gone.txt".into()],
        truncation: None,
        delivery: None,
        exit: ExitStatus::Code(0),
        status: None,
        message: None,
        wall_time: Duration::from_millis(42),
        usage: Default::default(),
        cancelled: false,
        evaluation: None,
    }
}

impl Execute for RecordingExec {
    fn execute<'a>(
        &'a self,
        run: &'a RunContext,
        work: Work,
    ) -> BoxFuture<'a, Result<ExecResult, ExecError>> {
        async move {
            let req = match work {
                Work::Fresh(r) | Work::Programmatic(r, _) | Work::Seated(r, _) => r,
                Work::Eval(_) => {
                    return Err(ExecError::Internal("the double has no kernel".into()));
                }
            };
            self.calls
                .lock()
                .unwrap()
                .push((run.principal().clone(), req));
            self.started.notify_one();
            let reply = *self.reply.lock().unwrap();
            let cancel: CancellationToken = run.token().clone();
            match reply {
                Reply::Canned => Ok(canned_result()),
                Reply::Fail(make) => Err(make()),
                Reply::HangUntilCancelled => {
                    let flag = self.cancelled.clone();
                    let token = cancel.clone();
                    tokio::spawn(async move {
                        token.cancelled().await;
                        flag.store(true, Ordering::SeqCst);
                    });
                    cancel.cancelled().await;
                    Err(ExecError::Cancelled)
                }
                Reply::Panic => panic!("executor double told to panic"),
            }
        }
        .boxed()
    }
}

pub struct TestServer {
    pub base: String,
    pub client: reqwest::Client,
    pub store: Store,
    pub exec: Arc<RecordingExec>,
    pub shutdown: CancellationToken,
    pub dir: tempfile::TempDir,
}

impl TestServer {
    /// `base` + `path` (path starts with `/`).
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// Store an object directly (bypassing HTTP) in a new session bound to `key`.
    pub async fn seed(
        &self,
        key: &str,
        name: &str,
        bytes: &[u8],
        content_type: &str,
    ) -> (Nanoid, Nanoid) {
        let sid = Nanoid::random();
        self.store
            .create_session(&sid, &SessionKey::from_stored(key.to_owned()))
            .await
            .unwrap();
        let fid = self.seed_into(&sid, name, bytes, content_type).await;
        (sid, fid)
    }

    /// Store an object directly into an existing session.
    pub async fn seed_into(
        &self,
        sid: &Nanoid,
        name: &str,
        bytes: &[u8],
        content_type: &str,
    ) -> Nanoid {
        let fid = Nanoid::random();
        let obj = NewObject {
            session_id: sid.clone(),
            file_id: fid.clone(),
            name: RelPath::parse(name).unwrap(),
            content_type: content_type.to_owned(),
            read_only: false,
        };
        let body = futures::stream::iter(vec![Ok::<_, std::io::Error>(
            bytes::Bytes::copy_from_slice(bytes),
        )]);
        self.store.put_stream(obj, body, u64::MAX).await.unwrap();
        fid
    }

    /// Regular files under the store's blob directory.
    pub fn blob_count(&self) -> usize {
        fn walk(p: &std::path::Path) -> usize {
            let Ok(rd) = std::fs::read_dir(p) else {
                return 0;
            };
            rd.flatten()
                .map(|e| {
                    let ft = e.file_type().unwrap();
                    if ft.is_dir() {
                        walk(&e.path())
                    } else {
                        usize::from(ft.is_file())
                    }
                })
                .sum()
        }
        walk(&self.dir.path().join("blobs"))
    }
}

pub fn health_info() -> HealthInfo {
    let mut langs = Language::all();
    let py = langs.next().unwrap().spec();
    let js = langs.next().unwrap().spec();
    HealthInfo {
        version: "9.9.9-test".into(),
        languages: vec![
            LanguageHealth::available(py, Some("Python 3.11.2".into())),
            LanguageHealth::unavailable(js, "/usr/bin/node not found"),
        ],
        runtime_image: None,
    }
}

/// Start a server with `config` and no metrics recorder.
pub async fn start(config: ApiConfig) -> TestServer {
    start_with(config, None).await
}

pub async fn start_with(
    config: ApiConfig,
    metrics: Option<metrics_exporter_prometheus::PrometheusHandle>,
) -> TestServer {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(StoreConfig {
        dir: dir.path().to_path_buf(),
        retention: Duration::from_secs(24 * 3600),
        budget: Default::default(),
    })
    .await
    .unwrap();
    let exec = Arc::new(RecordingExec::new());
    let mut state = AppState::new(store.clone(), exec.clone(), config, health_info());
    state.operator.metrics = metrics;
    let shutdown = state.shutdown.clone();
    let app = kiln_api::router(state);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    TestServer {
        base: format!("http://{addr}"),
        client: {
            kiln_exec::install_crypto_provider();
            reqwest::Client::new()
        },
        store,
        exec,
        shutdown,
        dir,
    }
}

/// A test body as JSON.
pub async fn json(resp: reqwest::Response) -> serde_json::Value {
    let text = resp.text().await.unwrap();
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}
