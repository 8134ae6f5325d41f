//! The registry with executions played by a double.

use std::sync::atomic::AtomicU32;

use futures::future::BoxFuture;
use kiln_core::outcome::ExitStatus;
use kiln_core::{Language, Usage};

use super::*;
use crate::types::{ExecRequest, Outputs};

/// What the double does with a run.
#[derive(Clone, Copy)]
enum Act {
    /// Queue, print "hi", finish.
    Quick,
    /// Queue, print, then wait until cancelled.
    Hang,
    Panic,
}

struct Double {
    act: Act,
    runs: AtomicU32,
}

fn result(stdout: &str, cancelled: bool) -> ExecResult {
    ExecResult {
        session_id: Nanoid::random(),
        stdout: stdout.into(),
        stderr: String::new(),
        files: vec![],
        deleted_files: vec![],
        truncation: None,
        delivery: None,
        exit: ExitStatus::Code(0),
        status: None,
        message: None,
        wall_time: Duration::from_millis(1),
        usage: Usage::default(),
        cancelled,
        evaluation: None,
    }
}

impl Execute for Double {
    fn execute<'a>(
        &'a self,
        run: &'a RunContext,
        _work: Work,
    ) -> BoxFuture<'a, Result<ExecResult, ExecError>> {
        Box::pin(async move {
            self.runs.fetch_add(1, Ordering::SeqCst);
            let _turn = run.queue_turn().await?;
            run.started(Step::Run);
            run.output(Stream::Stdout, b"hi\n");
            match self.act {
                Act::Quick => Ok(result("hi\n", false)),
                Act::Hang => {
                    run.token().cancelled().await;
                    match run.cancel_reason() {
                        Some(CancelReason::Requested) => Ok(result("hi\n", true)),
                        _ => Err(ExecError::Cancelled),
                    }
                }
                Act::Panic => panic!("double told to panic"),
            }
        })
    }
}

fn runs_with(act: Act, cfg: RunsConfig) -> Runs {
    Runs::new(
        Arc::new(Double {
            act,
            runs: AtomicU32::new(0),
        }),
        cfg,
    )
}

fn caller(user: &str) -> Caller {
    Caller::identified("local", user)
}

fn req() -> ExecRequest {
    ExecRequest {
        lang: Language::resolve("py").unwrap(),
        code: "print('hi')".into(),
        args: vec![],
        files: vec![],
        timeout_ms: None,
        outputs: Outputs::NewSession,
        project: None,
    }
}

async fn started(h: &RunHandle) {
    let mut sub = h.subscribe();
    while let Some(ev) = sub.next().await {
        if matches!(ev, RunEvent::Started { .. }) {
            return;
        }
    }
}

#[tokio::test]
async fn a_run_is_found_by_id_watched_from_the_start_and_kept_when_done() {
    let runs = runs_with(Act::Quick, RunsConfig::default());
    let w = runs
        .start(caller("alice"), req(), StartOptions::default())
        .unwrap();
    let id = w.id().clone();
    let outcome = w.outcome().await;
    assert_eq!(outcome.as_ref().as_ref().unwrap().stdout, "hi\n");
    drop(w);
    let h = runs.get(&id).expect("kept after it ended");
    let info = h.info();
    assert_eq!(info.phase, Phase::Finished);
    assert_eq!(info.owner, kiln_core::Owner::of(&caller("alice")));
    assert!(info.started_at.is_some() && info.finished_at.is_some());
    // a late watcher replays everything
    let mut sub = h.subscribe();
    let mut kinds = Vec::new();
    while let Some(ev) = sub.next().await {
        kinds.push(match ev {
            RunEvent::Queued { .. } => "queued",
            RunEvent::Started { .. } => "started",
            RunEvent::Output { .. } => "output",
            RunEvent::File(_) => "file",
            RunEvent::ToolCalls(_) => "tool_calls",
            RunEvent::Done(_) => "done",
        });
    }
    assert_eq!(kinds, ["queued", "started", "output", "done"]);
    assert!(runs.wait_idle(Duration::from_secs(1)).await);
}

#[tokio::test]
async fn dropping_the_watch_cancels_an_attached_run_but_not_a_detached_one() {
    let runs = runs_with(Act::Hang, RunsConfig::default());
    let w = runs
        .start(caller("alice"), req(), StartOptions::default())
        .unwrap();
    let h = w.handle().clone();
    started(&h).await;
    drop(w);
    assert!(matches!(*h.outcome().await, Err(ExecError::Cancelled)));
    assert_eq!(h.info().phase, Phase::Cancelled);

    let w = runs
        .start(
            caller("alice"),
            req(),
            StartOptions {
                detach: true,
                ..StartOptions::default()
            },
        )
        .unwrap();
    let h = w.handle().clone();
    started(&h).await;
    drop(w);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(
        h.info().phase,
        Phase::Running,
        "a detached run keeps running"
    );
    // collected later: cancelled on request, it ends with a result
    h.cancel();
    let o = h.outcome().await;
    assert!(o.as_ref().as_ref().unwrap().cancelled);
    assert_eq!(h.info().phase, Phase::Cancelled);
}

#[tokio::test]
async fn the_queue_admits_runs_in_order_and_reports_positions() {
    let runs = runs_with(
        Act::Hang,
        RunsConfig {
            concurrency: 1,
            ..RunsConfig::default()
        },
    );
    let first = runs
        .start(caller("a"), req(), StartOptions::default())
        .unwrap();
    started(&first).await;
    let second = runs
        .start(caller("b"), req(), StartOptions::default())
        .unwrap();
    let mut sub = second.subscribe();
    assert!(matches!(
        sub.next().await,
        Some(RunEvent::Queued { position: 0 })
    ));
    assert_eq!(runs.queue().len(), 1);
    assert_eq!(second.info().phase, Phase::Queued);
    first.cancel();
    first.outcome().await;
    assert!(matches!(sub.next().await, Some(RunEvent::Started { .. })));
    assert_eq!(runs.queue().len(), 0);
}

#[tokio::test]
async fn finished_runs_go_after_their_time_or_beyond_the_byte_budget() {
    let runs = runs_with(
        Act::Quick,
        RunsConfig {
            keep_finished: Duration::from_millis(100),
            ..RunsConfig::default()
        },
    );
    let w = runs
        .start(caller("a"), req(), StartOptions::default())
        .unwrap();
    let id = w.id().clone();
    w.outcome().await;
    assert!(runs.get(&id).is_some());
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert!(runs.get(&id).is_none());

    let runs = runs_with(
        Act::Quick,
        RunsConfig {
            keep_finished_bytes: 1,
            ..RunsConfig::default()
        },
    );
    let w = runs
        .start(caller("a"), req(), StartOptions::default())
        .unwrap();
    let id = w.id().clone();
    w.outcome().await;
    assert!(runs.get(&id).is_none(), "over the budget: gone at once");
}

#[tokio::test]
async fn callers_over_the_rate_limit_are_refused_others_are_not() {
    let runs = runs_with(
        Act::Quick,
        RunsConfig {
            rate_limit: Some((2, Duration::from_secs(60))),
            ..RunsConfig::default()
        },
    );
    for _ in 0..2 {
        runs.start(caller("a"), req(), StartOptions::default())
            .unwrap()
            .outcome()
            .await;
    }
    let e = runs
        .start(caller("a"), req(), StartOptions::default())
        .unwrap_err();
    assert!(
        matches!(e, ExecError::RateLimited { retry_after } if retry_after > Duration::from_secs(50))
    );
    assert!(
        runs.start(caller("b"), req(), StartOptions::default())
            .is_ok()
    );
}

#[tokio::test]
async fn shutdown_refuses_new_runs_and_kill_all_ends_the_rest() {
    let runs = runs_with(Act::Hang, RunsConfig::default());
    let w = runs
        .start(
            caller("a"),
            req(),
            StartOptions {
                detach: true,
                ..StartOptions::default()
            },
        )
        .unwrap();
    started(&w).await;
    runs.close();
    assert_eq!(
        runs.start(caller("a"), req(), StartOptions::default())
            .unwrap_err(),
        ExecError::ShuttingDown
    );
    assert!(!runs.wait_idle(Duration::from_millis(50)).await);
    runs.kill_all();
    assert!(matches!(*w.outcome().await, Err(ExecError::ShuttingDown)));
    assert!(runs.wait_idle(Duration::from_secs(1)).await);
}

#[tokio::test]
async fn a_panicking_execution_ends_its_run_with_an_internal_error() {
    let runs = runs_with(Act::Panic, RunsConfig::default());
    let w = runs
        .start(caller("a"), req(), StartOptions::default())
        .unwrap();
    assert!(matches!(*w.outcome().await, Err(ExecError::Internal(_))));
    assert_eq!(w.info().phase, Phase::Failed);
    assert_eq!(runs.active(), 0);
}

#[tokio::test]
async fn the_list_holds_running_and_kept_runs_newest_first_and_drops_expired_ones() {
    let runs = runs_with(
        Act::Quick,
        RunsConfig {
            keep_finished: Duration::from_millis(300),
            ..RunsConfig::default()
        },
    );
    let first = runs
        .start(caller("alice"), req(), StartOptions::default())
        .unwrap();
    first.outcome().await;
    tokio::time::sleep(Duration::from_millis(5)).await;
    let second = runs
        .start(caller("bob"), req(), StartOptions::default())
        .unwrap();
    second.outcome().await;
    let ids: Vec<Nanoid> = runs.list().iter().map(|h| h.id().clone()).collect();
    assert_eq!(ids, [second.id().clone(), first.id().clone()]);
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(runs.list().is_empty(), "expired runs are not listed");
}

/// Keeps every audit record it gets.
#[derive(Debug, Default)]
struct Kept(std::sync::Mutex<Vec<AuditRecord>>);

impl AuditSink for Kept {
    fn record(&self, r: &AuditRecord) {
        self.0.lock().unwrap().push(r.clone());
    }
}

#[tokio::test]
async fn every_ended_run_is_audited_once_with_who_what_how_and_its_request() {
    let kept = Arc::new(Kept::default());
    let cfg = RunsConfig {
        audit: Some(kept.clone()),
        ..RunsConfig::default()
    };
    let quick = runs_with(Act::Quick, cfg.clone());
    let w = quick
        .start(
            caller("alice"),
            req(),
            StartOptions {
                request_id: Some("req-42".into()),
                ..StartOptions::default()
            },
        )
        .unwrap();
    w.outcome().await;
    let hang = runs_with(Act::Hang, cfg);
    let h = hang
        .start(caller("bob"), req(), StartOptions::default())
        .unwrap();
    started(&h).await;
    h.cancel();
    h.outcome().await;
    let records = kept.0.lock().unwrap().clone();
    assert_eq!(records.len(), 2, "{records:?}");
    let a = &records[0];
    assert_eq!(
        (a.event, a.run_id.as_str(), a.request_id.as_deref()),
        ("run", w.id().as_str(), Some("req-42"))
    );
    assert_eq!((a.tenant.as_str(), a.user_id.as_str()), ("local", "alice"));
    assert_eq!((a.lang, a.status, a.exit_code), ("py", "finished", Some(0)));
    assert!(a.error.is_none() && a.finished_at_ms >= a.created_at_ms);
    let b = &records[1];
    assert_eq!((b.user_id.as_str(), b.status), ("bob", "cancelled"));
    assert_eq!(b.request_id, None);
}

#[tokio::test]
async fn the_audit_record_lists_the_files_the_run_reported() {
    let kept = Arc::new(Kept::default());
    let ctx = RunContext::standalone(caller("carol"), "py");
    ctx.inputs_staged([("b.csv".to_owned(), 7), ("a.txt".to_owned(), 3)]);
    let out = OutputFile {
        id: Nanoid::random(),
        name: "plot.png".into(),
        storage_session_id: Nanoid::random(),
        inherited: false,
        modified_from: None,
        entity_id: None,
    };
    ctx.file_stored(&out, 1234);
    let outcome = Ok(result("", false));
    kept.record(&AuditRecord::of(&ctx.record, Phase::Finished, &outcome));
    let r = kept.0.lock().unwrap()[0].clone();
    let names = |f: &[AuditFile]| {
        f.iter()
            .map(|f| (f.name.clone(), f.bytes))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        names(&r.files_in),
        [("a.txt".to_owned(), 3), ("b.csv".to_owned(), 7)]
    );
    assert_eq!(names(&r.files_out), [("plot.png".to_owned(), 1234)]);
    let json = serde_json::to_value(&r).unwrap();
    assert_eq!(json["files_out"][0]["bytes"], 1234);
    assert_eq!(json["user_id"], "carol");
}

#[tokio::test]
async fn a_run_keeps_its_code_for_the_operator_cut_at_a_character_boundary() {
    let runs = runs_with(Act::Quick, RunsConfig::default());
    let w = runs
        .start(caller("alice"), req(), StartOptions::default())
        .unwrap();
    w.outcome().await;
    let kept = runs.get(w.id()).unwrap().code().clone();
    assert_eq!(kept.text, "print('hi')");
    assert!(!kept.truncated());

    // a source past the bound: its start is kept, whole characters only
    let long = format!("#{}", "é".repeat(KEPT_CODE_BYTES));
    let w = runs
        .start(
            caller("alice"),
            ExecRequest {
                code: long.clone(),
                ..req()
            },
            StartOptions::default(),
        )
        .unwrap();
    w.outcome().await;
    let kept = runs.get(w.id()).unwrap().code().clone();
    assert!(kept.truncated());
    assert_eq!(kept.bytes, long.len());
    assert!(kept.text.len() <= KEPT_CODE_BYTES && kept.text.len() > KEPT_CODE_BYTES - 2);
    assert!(long.starts_with(&kept.text));
}
