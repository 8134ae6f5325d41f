//! The pipeline against a fake sandbox: a [`Jails`] whose "programs" are
//! closures acting on the workspace, over a real store in a tempdir.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use kiln_core::access::{Caller, Policy};
use kiln_core::outcome::{ExitStatus, RunStatus};
use kiln_core::{Kind, Language, Nanoid, RelPath};
use kiln_sandbox::{BoxFuture, Jail, OutputStream, RunRequest, RunResult, SandboxError};
use kiln_store::{NewObject, Store, StoreConfig};
use tokio_util::sync::CancellationToken;

use super::*;
use crate::runs::{CancelReason, RunEvent, Step, Stream};
use crate::types::{InputFile, InputRef, Work};

/// What a fake program does: acts on the workspace, writes through the
/// request's sink, returns its result. `None`: hang until cancelled.
type Program = Box<dyn Fn(&Path, &RunRequest) -> Option<RunResult> + Send + Sync>;

/// A fake sandbox: each acquire hands out a jail over a fresh temporary
/// workspace; each step runs the next program.
struct FakeJails {
    programs: Mutex<Vec<Program>>,
    /// (profile, argv of each step) of every jail, in order.
    seen: Mutex<Vec<(String, Vec<Vec<String>>)>>,
    acquired: Mutex<u32>,
}

impl FakeJails {
    fn new(programs: Vec<Program>) -> Arc<FakeJails> {
        Arc::new(FakeJails {
            programs: Mutex::new(programs.into_iter().rev().collect()),
            seen: Mutex::new(Vec::new()),
            acquired: Mutex::new(0),
        })
    }
}

struct FakeJail {
    dir: tempfile::TempDir,
    jails: Arc<FakeJails>,
    index: usize,
}

fn owner() -> (u32, u32) {
    let m = std::fs::metadata("/proc/self").unwrap();
    (m.uid(), m.gid())
}

/// `Jails` over an `Arc<FakeJails>` (so jails can reach the programs).
struct Source(Arc<FakeJails>);

impl Jails for Source {
    fn acquire<'a>(
        &'a self,
        _lang: Language,
        profile: &'a str,
    ) -> BoxFuture<'a, Result<Box<dyn Jail>, SandboxError>> {
        Box::pin(async move {
            *self.0.acquired.lock().unwrap() += 1;
            let index = {
                let mut seen = self.0.seen.lock().unwrap();
                seen.push((profile.to_owned(), Vec::new()));
                seen.len() - 1
            };
            let dir = tempfile::tempdir().unwrap();
            Ok(Box::new(FakeJail {
                dir,
                jails: Arc::clone(&self.0),
                index,
            }) as Box<dyn Jail>)
        })
    }
}

impl Jail for FakeJail {
    fn workspace(&self) -> &Path {
        self.dir.path()
    }

    fn owner(&self) -> (u32, u32) {
        owner()
    }

    fn run(
        &mut self,
        req: RunRequest,
        cancel: CancellationToken,
    ) -> BoxFuture<'_, Result<RunResult, SandboxError>> {
        Box::pin(async move {
            self.jails.seen.lock().unwrap()[self.index]
                .1
                .push(req.argv.clone());
            let program = self
                .jails
                .programs
                .lock()
                .unwrap()
                .pop()
                .expect("a program for every step");
            match program(self.dir.path(), &req) {
                Some(r) => Ok(r),
                None => {
                    cancel.cancelled().await;
                    Err(SandboxError::Cancelled(None))
                }
            }
        })
    }
}

/// A result with `exit` and the given output, which the "program" also
/// wrote through the sink.
fn wrote(req: &RunRequest, exit: ExitStatus, stdout: &str, stderr: &str) -> RunResult {
    if let Some(sink) = &req.output {
        // as the sandbox reads it: a chunk at a time
        for chunk in stdout.as_bytes().chunks(3) {
            sink.call(OutputStream::Stdout, chunk);
        }
        sink.call(OutputStream::Stderr, stderr.as_bytes());
    }
    RunResult {
        exit,
        stdout: stdout.as_bytes().to_vec(),
        stderr: stderr.as_bytes().to_vec(),
        wall_time: Duration::from_millis(12),
        cpu_time: Some(Duration::from_millis(7)),
        memory_peak: Some(3 << 20),
        ..RunResult::default()
    }
}

struct Fixture {
    _dir: tempfile::TempDir,
    store: Store,
    jails: Arc<FakeJails>,
    exec: Executor,
}

async fn fixture(programs: Vec<Program>) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(StoreConfig {
        dir: dir.path().join("store"),
        retention: Duration::from_secs(3600),
        budget: Default::default(),
    })
    .await
    .unwrap();
    let jails = FakeJails::new(programs);
    let exec = Executor::new(
        store.clone(),
        Arc::new(Source(Arc::clone(&jails))),
        ExecConfig::default(),
    );
    Fixture {
        _dir: dir,
        store,
        jails,
        exec,
    }
}

fn alice() -> Caller {
    Caller::identified("local", "alice")
}

fn request(lang: &str, code: &str) -> ExecRequest {
    ExecRequest {
        lang: Language::resolve(lang).unwrap(),
        code: code.into(),
        args: vec![],
        files: vec![],
        timeout_ms: None,
        outputs: Outputs::NewSession,
        project: None,
    }
}

fn events(run: &RunContext) -> Vec<RunEvent> {
    let mut sub = run.log().subscribe();
    std::iter::from_fn(|| sub.try_next()).collect()
}

fn streamed(events: &[RunEvent], stream: Stream) -> String {
    events
        .iter()
        .filter_map(|e| match e {
            RunEvent::Output { stream: s, text } if *s == stream => Some(text.as_str()),
            _ => None,
        })
        .collect()
}

async fn upload(store: &Store, key_of: &Caller, name: &str, bytes: &[u8]) -> (Nanoid, Nanoid) {
    let sid = Nanoid::random();
    store
        .create_session(&sid, &key_of.principal.user_key())
        .await
        .unwrap();
    let fid = Nanoid::random();
    let obj = NewObject {
        session_id: sid.clone(),
        file_id: fid.clone(),
        name: RelPath::parse(name).unwrap(),
        content_type: "text/csv".into(),
        read_only: false,
    };
    let body = futures::stream::iter([Ok::<_, std::io::Error>(bytes::Bytes::copy_from_slice(
        bytes,
    ))]);
    store.put_stream(obj, body, u64::MAX).await.unwrap();
    (sid, fid)
}

fn user_ref(sid: &Nanoid, fid: &Nanoid, name: &str) -> InputFile {
    InputFile::Ref(InputRef {
        id: fid.clone(),
        storage_session_id: sid.clone(),
        name: RelPath::parse(name).unwrap(),
        kind: Some(Kind::User),
        resource_id: None,
        version: None,
        entity_id: None,
    })
}

fn read_dir_names(p: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(p)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    v.sort();
    v
}

#[tokio::test]
async fn a_run_stages_the_code_runs_it_and_stores_its_outputs() {
    let seen_files: Arc<Mutex<Vec<String>>> = Arc::default();
    let seen = Arc::clone(&seen_files);
    let f = fixture(vec![Box::new(move |ws: &Path, req: &RunRequest| {
        *seen.lock().unwrap() = read_dir_names(ws);
        assert_eq!(
            std::fs::read_to_string(ws.join("main.py")).unwrap(),
            "print('hi')"
        );
        std::fs::create_dir(ws.join("out")).unwrap();
        std::fs::write(ws.join("out/table.csv"), "a,b\n1,2\n").unwrap();
        std::fs::write(ws.join("model.pkl"), "not reported").unwrap();
        Some(wrote(req, ExitStatus::Code(0), "hi\n", ""))
    })])
    .await;
    let run = RunContext::standalone(alice(), "py");
    let r = f
        .exec
        .execute(&run, Work::Fresh(request("py", "print('hi')")))
        .await
        .unwrap();

    assert_eq!(*seen_files.lock().unwrap(), ["main.py"]);
    assert_eq!(r.stdout, "hi\n");
    assert_eq!((r.status, r.message.as_deref()), (None, None));
    assert_eq!(r.files.len(), 1);
    let out = &r.files[0];
    assert_eq!((out.name.as_str(), out.inherited), ("out/table.csv", false));
    assert_eq!(out.storage_session_id, r.session_id);
    let meta = f
        .store
        .object(&r.session_id, &out.id)
        .await
        .unwrap()
        .expect("stored");
    assert_eq!((meta.size, meta.content_type.as_str()), (8, "text/csv"));
    let session = f.store.session(&r.session_id).await.unwrap().unwrap();
    assert_eq!(session.key, alice().principal.user_key());
    // usage of the one step
    let run_usage = r.usage.run.expect("run step usage");
    assert_eq!(run_usage.cpu, Some(Duration::from_millis(7)));
    assert!(r.usage.compile.is_none());
    // the warm profile of the template its imports need (none: the min
    // one), the run argv from the language table
    let seen = f.jails.seen.lock().unwrap();
    assert_eq!(seen[0].0, "py-min");
    assert_eq!(seen[0].1, [vec!["/usr/bin/python3", "-u", "main.py"]]);
    // events: queued, started, output, file, done — output as the result
    let ev = events(&run);
    assert!(matches!(ev[0], RunEvent::Queued { position: 0 }));
    assert!(matches!(ev[1], RunEvent::Started { step: Step::Run }));
    assert_eq!(streamed(&ev, Stream::Stdout), r.stdout);
    assert!(
        ev.iter()
            .any(|e| matches!(e, RunEvent::File(f) if f.name == "out/table.csv"))
    );
}

#[tokio::test]
async fn a_run_whose_output_session_cannot_be_opened_fails_with_a_storage_error() {
    // the session is opened while the program runs: its failure must still
    // fail the run (after the program ended), never be lost
    let ran = Arc::new(Mutex::new(0));
    let count = Arc::clone(&ran);
    let f = fixture(vec![Box::new(move |_: &Path, req: &RunRequest| {
        *count.lock().unwrap() += 1;
        Some(wrote(req, ExitStatus::Code(0), "hi\n", ""))
    })])
    .await;
    f.store.close().await;
    let run = RunContext::standalone(alice(), "py");
    let r = f
        .exec
        .execute(&run, Work::Fresh(request("py", "print('hi')")))
        .await;
    assert!(matches!(r, Err(ExecError::Storage(_))), "{r:?}");
    assert_eq!(*ran.lock().unwrap(), 1, "the program ran meanwhile");
}

#[tokio::test]
async fn plotting_code_gets_the_plot_hook_and_compiled_code_a_build_dir() {
    let f = fixture(vec![
        Box::new(|ws: &Path, req: &RunRequest| {
            let hook = ws.join(".kiln/python/sitecustomize.py");
            let m = std::fs::metadata(&hook).unwrap();
            assert_eq!(m.mode() & 0o777, 0o444, "support files are read-only");
            assert!(
                std::fs::read_to_string(hook)
                    .unwrap()
                    .contains("_kiln_patch_pyplot")
            );
            Some(wrote(req, ExitStatus::Code(0), "", ""))
        }),
        Box::new(|ws: &Path, req: &RunRequest| {
            assert!(ws.join(".kiln-build").is_dir());
            assert_eq!(req.argv[0], "/usr/bin/gcc");
            Some(wrote(req, ExitStatus::Code(0), "", "warning: unused\n"))
        }),
        Box::new(|_: &Path, req: &RunRequest| {
            assert_eq!(req.argv[0], "/mnt/data/.kiln-build/main");
            Some(wrote(req, ExitStatus::Code(0), "42\n", ""))
        }),
    ])
    .await;
    let run = RunContext::standalone(alice(), "py");
    f.exec
        .execute(
            &run,
            Work::Fresh(request("py", "import matplotlib.pyplot as plt")),
        )
        .await
        .unwrap();
    let run = RunContext::standalone(alice(), "c");
    let r = f
        .exec
        .execute(&run, Work::Fresh(request("c", "int main(){}")))
        .await
        .unwrap();
    assert_eq!(r.stdout, "42\n");
    assert_eq!(
        r.stderr, "",
        "a successful compile's output is not the result's"
    );
    assert!(r.usage.compile.is_some() && r.usage.run.is_some());
    // pyplot: the data template's profile; both of c's steps in one jail,
    // taken as the generic warm profile
    let seen = f.jails.seen.lock().unwrap();
    assert_eq!(seen[0].0, "py-data");
    assert_eq!(seen[1].0, "exec");
    assert_eq!(seen[1].1.len(), 2);
    let ev = events(&run);
    let steps: Vec<Step> = ev
        .iter()
        .filter_map(|e| match e {
            RunEvent::Started { step } => Some(*step),
            _ => None,
        })
        .collect();
    assert_eq!(steps, [Step::Compile, Step::Run]);
    assert_eq!(
        streamed(&ev, Stream::Stderr),
        "",
        "compile output is not streamed"
    );
}

#[tokio::test]
async fn a_failed_compile_is_the_result_and_nothing_is_harvested() {
    let f = fixture(vec![Box::new(|ws: &Path, req: &RunRequest| {
        std::fs::write(ws.join("junk.txt"), "x").unwrap();
        Some(wrote(
            req,
            ExitStatus::Code(1),
            "",
            "main.c:1: error: expected ';'\n",
        ))
    })])
    .await;
    let run = RunContext::standalone(alice(), "c");
    let r = f
        .exec
        .execute(&run, Work::Fresh(request("c", "int main(){")))
        .await
        .unwrap();
    assert_eq!(r.message.as_deref(), Some("Compilation failed"));
    assert_eq!(r.status, Some(RunStatus::RuntimeError));
    assert!(r.stderr.contains("expected ';'"));
    assert!(r.files.is_empty());
    assert!(r.usage.run.is_none() && r.usage.compile.is_some());
    // the compile output reaches watchers at the end
    assert_eq!(streamed(&events(&run), Stream::Stderr), r.stderr);
}

#[tokio::test]
async fn inputs_are_inherited_modified_or_deleted() {
    let f = fixture(vec![Box::new(|ws: &Path, req: &RunRequest| {
        assert_eq!(std::fs::read_to_string(ws.join("keep.csv")).unwrap(), "k\n");
        std::fs::write(ws.join("data/edit.csv"), "changed\n").unwrap();
        std::fs::remove_file(ws.join("gone.csv")).unwrap();
        Some(wrote(req, ExitStatus::Code(0), "", ""))
    })])
    .await;
    let (s1, keep) = upload(&f.store, &alice(), "keep.csv", b"k\n").await;
    let (s2, edit) = upload(&f.store, &alice(), "edit.csv", b"e\n").await;
    let (s3, gone) = upload(&f.store, &alice(), "gone.csv", b"g\n").await;
    let mut req = request("py", "pass");
    req.files = vec![
        user_ref(&s1, &keep, "keep.csv"),
        user_ref(&s2, &edit, "data/edit.csv"),
        user_ref(&s3, &gone, "gone.csv"),
    ];
    let run = RunContext::standalone(alice(), "py");
    let r = f.exec.execute(&run, Work::Fresh(req)).await.unwrap();
    let by_name: HashMap<&str, &crate::types::OutputFile> =
        r.files.iter().map(|f| (f.name.as_str(), f)).collect();
    let k = by_name["keep.csv"];
    assert!(k.inherited && k.id == keep && k.storage_session_id == s1);
    let e = by_name["data/edit.csv"];
    assert!(!e.inherited);
    assert_eq!(e.modified_from, Some((edit, s2)));
    assert_eq!(r.deleted_files, ["gone.csv"]);
}

#[tokio::test]
async fn a_reference_the_caller_may_not_read_takes_no_jail() {
    let f = fixture(vec![]).await;
    let bob = Caller::identified("local", "bob");
    let (sid, fid) = upload(&f.store, &bob, "secret.csv", b"s").await;
    let mut req = request("py", "pass");
    req.files = vec![user_ref(&sid, &fid, "secret.csv")];
    let run = RunContext::standalone(alice(), "py");
    let e = f.exec.execute(&run, Work::Fresh(req)).await.unwrap_err();
    assert_eq!(e, ExecError::Unauthorized);
    assert_eq!(*f.jails.acquired.lock().unwrap(), 0);
    // a missing storage session is the same answer
    let mut req = request("py", "pass");
    req.files = vec![user_ref(&Nanoid::random(), &Nanoid::random(), "x.csv")];
    let run = RunContext::standalone(alice(), "py");
    assert_eq!(
        f.exec.execute(&run, Work::Fresh(req)).await.unwrap_err(),
        ExecError::Unauthorized
    );
}

#[tokio::test]
async fn a_reference_without_a_claim_follows_the_no_claim_rule() {
    let f = fixture(vec![]).await;
    let bob = Caller::identified("local", "bob");
    let (sid, fid) = upload(&f.store, &bob, "b.csv", b"b").await;
    let bare = || {
        let mut r = user_ref(&sid, &fid, "b.csv");
        if let InputFile::Ref(r) = &mut r {
            r.kind = None;
        }
        r
    };
    let open = Policy::default();
    let strict = Policy {
        require_identity: true,
    };
    // its owner and an identity-less caller read it; another user does not
    assert!(
        authorize::inputs(&f.store, open, &bob, vec![bare()])
            .await
            .is_ok()
    );
    let anon = Caller::anonymous("local");
    assert!(
        authorize::inputs(&f.store, open, &anon, vec![bare()])
            .await
            .is_ok()
    );
    assert_eq!(
        authorize::inputs(&f.store, open, &alice(), vec![bare()])
            .await
            .err(),
        Some(ExecError::Unauthorized)
    );
    // unless the deployment requires an identity
    assert_eq!(
        authorize::inputs(&f.store, strict, &anon, vec![bare()])
            .await
            .err(),
        Some(ExecError::Unauthorized)
    );
    assert!(
        authorize::inputs(&f.store, strict, &bob, vec![bare()])
            .await
            .is_ok()
    );
}

#[tokio::test]
async fn a_cancel_on_request_ends_with_a_result_and_a_disconnect_with_nothing() {
    let f = fixture(vec![
        Box::new(|ws: &Path, req: &RunRequest| {
            std::fs::write(ws.join("partial.txt"), "half").unwrap();
            if let Some(sink) = &req.output {
                sink.call(OutputStream::Stdout, b"started\n");
            }
            None
        }),
        Box::new(|_: &Path, _: &RunRequest| None),
    ])
    .await;
    let run = RunContext::standalone(alice(), "py");
    let (r, ()) = tokio::join!(
        f.exec.execute(&run, Work::Fresh(request("py", "loop"))),
        async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            run_cancel(&run, CancelReason::Requested);
        }
    );
    let r = r.unwrap();
    assert!(r.cancelled);
    assert_eq!(r.message.as_deref(), Some(CANCELLED));
    assert_eq!(r.status, Some(RunStatus::Signal));
    assert_eq!(r.exit, ExitStatus::Signal(9));
    assert_eq!(r.stdout, "started\n");
    assert!(r.stderr.ends_with("[kiln] execution stopped: cancelled\n"));
    assert_eq!(streamed(&events(&run), Stream::Stderr), r.stderr);
    // what it wrote before the kill is harvested
    assert!(r.files.iter().any(|f| f.name == "partial.txt"));

    let run = RunContext::standalone(alice(), "py");
    let (r, ()) = tokio::join!(
        f.exec.execute(&run, Work::Fresh(request("py", "loop"))),
        async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            run_cancel(&run, CancelReason::Disconnected);
        }
    );
    assert_eq!(r.unwrap_err(), ExecError::Cancelled);
}

fn run_cancel(run: &RunContext, reason: CancelReason) {
    run.cancel(reason);
}

#[tokio::test]
async fn kiln_stopping_a_program_is_said_on_stderr_and_streamed_too() {
    let f = fixture(vec![Box::new(|_: &Path, req: &RunRequest| {
        let mut r = wrote(req, ExitStatus::Signal(9), "tick\n", "partial");
        r.timed_out = true;
        r.wall_time = Duration::from_secs(5);
        Some(r)
    })])
    .await;
    let run = RunContext::standalone(alice(), "py");
    let r = f
        .exec
        .execute(&run, Work::Fresh(request("py", "while 1: pass")))
        .await
        .unwrap();
    assert_eq!(r.status, Some(RunStatus::Timeout));
    assert_eq!(
        r.stderr,
        "partial\n[kiln] execution stopped: time limit of 5.0 s exceeded\n"
    );
    let ev = events(&run);
    assert_eq!(streamed(&ev, Stream::Stdout), r.stdout);
    assert_eq!(streamed(&ev, Stream::Stderr), r.stderr);
}

#[tokio::test]
async fn into_a_workspace_session_outputs_replace_and_deletions_delete() {
    let f = fixture(vec![Box::new(|ws: &Path, req: &RunRequest| {
        std::fs::write(ws.join("a.csv"), "new a\n").unwrap();
        std::fs::remove_file(ws.join("b.csv")).unwrap();
        std::fs::write(ws.join("c.csv"), "new c\n").unwrap();
        Some(wrote(req, ExitStatus::Code(0), "", ""))
    })])
    .await;
    let sid = Nanoid::random();
    f.store
        .create_session(&sid, &alice().principal.user_key())
        .await
        .unwrap();
    let mut ids = HashMap::new();
    for (name, body) in [("a.csv", "a\n"), ("b.csv", "b\n"), ("c.csv", "old c\n")] {
        let fid = Nanoid::random();
        let obj = NewObject {
            session_id: sid.clone(),
            file_id: fid.clone(),
            name: RelPath::parse(name).unwrap(),
            content_type: "text/csv".into(),
            read_only: false,
        };
        let b = futures::stream::iter([Ok::<_, std::io::Error>(bytes::Bytes::from(body))]);
        f.store.put_stream(obj, b, 100).await.unwrap();
        ids.insert(name, fid);
    }
    let mut req = request("py", "pass");
    // c.csv is in the session but not staged: the new one still replaces it
    req.files = vec![
        user_ref(&sid, &ids["a.csv"], "a.csv"),
        user_ref(&sid, &ids["b.csv"], "b.csv"),
    ];
    req.outputs = Outputs::Workspace(sid.clone());
    let run = RunContext::standalone(alice(), "py");
    let r = f.exec.execute(&run, Work::Fresh(req)).await.unwrap();
    assert_eq!(r.session_id, sid);
    let mut left: Vec<(String, u64)> = f
        .store
        .list(&sid)
        .await
        .unwrap()
        .into_iter()
        .map(|o| (o.name, o.size))
        .collect();
    left.sort();
    assert_eq!(
        left,
        [("a.csv".to_owned(), 6), ("c.csv".to_owned(), 6)],
        "one object per name, b.csv gone"
    );
    // someone else's session cannot be a workspace
    let mut req = request("py", "pass");
    req.outputs = Outputs::Workspace(sid.clone());
    let bob = Caller::identified("local", "bob");
    let run = RunContext::standalone(bob, "py");
    assert_eq!(
        f.exec.execute(&run, Work::Fresh(req)).await.unwrap_err(),
        ExecError::Unauthorized
    );
}

#[tokio::test]
async fn a_link_planted_over_an_input_directory_reveals_nothing_about_the_host() {
    let host = tempfile::tempdir().unwrap();
    std::fs::write(host.path().join("data.csv"), "host file\n").unwrap();
    let host_dir: PathBuf = host.path().to_path_buf();
    let f = fixture(vec![Box::new(move |ws: &Path, req: &RunRequest| {
        std::fs::remove_dir_all(ws.join("in")).unwrap();
        std::os::unix::fs::symlink(&host_dir, ws.join("in")).unwrap();
        Some(wrote(req, ExitStatus::Code(0), "", ""))
    })])
    .await;
    let (sid, fid) = upload(&f.store, &alice(), "data.csv", b"x\n").await;
    let mut req = request("py", "pass");
    req.files = vec![user_ref(&sid, &fid, "in/data.csv")];
    let run = RunContext::standalone(alice(), "py");
    let r = f.exec.execute(&run, Work::Fresh(req)).await.unwrap();
    assert_eq!(r.deleted_files, ["in/data.csv"]);
    assert!(r.files.is_empty(), "{:?}", r.files);
}
