//! Runs as objects over HTTP against a real server: streaming output
//! (`Accept: text/event-stream`), `/v1/runs/{run_id}` with its events and
//! cancel, detached runs and the disconnect policy, usage figures.

mod common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::{Value, json};

/// The memory test measures this process (the server runs in it): it runs
/// alone, the others share.
static EXCLUSIVE: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

async fn stream_exec(s: &kiln::testing::TestServer, body: Value) -> reqwest::Response {
    client()
        .post(format!("{}/exec", s.v1()))
        .header("accept", "text/event-stream")
        .json(&body)
        .send()
        .await
        .expect("send")
}

async fn get_run(s: &kiln::testing::TestServer, id: &str) -> (u16, Value) {
    let r = client()
        .get(format!("{}/runs/{id}", s.v1()))
        .send()
        .await
        .expect("send");
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// Polls the run until `pred` holds of it (or `limit` passes).
async fn wait_run(
    s: &kiln::testing::TestServer,
    id: &str,
    limit: Duration,
    pred: impl Fn(&Value) -> bool,
) -> Value {
    let until = Instant::now() + limit;
    loop {
        let (status, v) = get_run(s, id).await;
        assert_eq!(status, 200, "{v}");
        if pred(&v) {
            return v;
        }
        assert!(Instant::now() < until, "run never got there: {v}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Starts a detached run and returns its id at once (`Prefer: respond-async`).
async fn start_detached(s: &kiln::testing::TestServer, lang: &str, code: &str) -> String {
    let r = client()
        .post(format!("{}/exec", s.v1()))
        .header("prefer", "respond-async")
        .json(&json!({"lang": lang, "code": code, "detach": true}))
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), 202);
    let location = r.headers()["location"].to_str().unwrap().to_owned();
    let v: Value = r.json().await.unwrap();
    let id = v["run_id"].as_str().unwrap().to_owned();
    assert_eq!(location, format!("/v1/runs/{id}"));
    assert_eq!(v["links"]["events"], format!("/v1/runs/{id}/events"));
    id
}

async fn no_jail_process_left(s: &kiln::testing::TestServer, limit: Duration) {
    let until = Instant::now() + limit;
    loop {
        let left = jail_processes_of(s);
        if left.is_empty() {
            return;
        }
        assert!(Instant::now() < until, "processes left: {left:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn output_streams_while_the_program_runs() {
    let _shared = EXCLUSIVE.read().await;
    let s = server().await;
    // a line every 200 ms; python runs unbuffered in the jail
    let code = "import time\nfor i in range(5):\n    print(f'line {i}')\n    time.sleep(0.2)\n";
    let resp = stream_exec(&s, json!({"lang": "py", "code": code})).await;
    assert_eq!(resp.status(), 200);
    let run_id = resp.headers()["x-kiln-run-id"].to_str().unwrap().to_owned();
    let events = sse_events(resp, Duration::from_secs(60)).await;

    let names: Vec<&str> = events.iter().filter_map(|e| e.event.as_deref()).collect();
    assert_eq!(names.first(), Some(&"queued"), "{names:?}");
    assert!(names.contains(&"started"), "{names:?}");
    // each line arrived when it was printed, not with the result
    let arrival = |needle: &str| {
        events
            .iter()
            .find(|e| {
                e.event.as_deref() == Some("stdout")
                    && e.data["text"].as_str().is_some_and(|t| t.contains(needle))
            })
            .unwrap_or_else(|| panic!("no stdout event with {needle}: {events:?}"))
            .at
    };
    let (first, last) = (arrival("line 0"), arrival("line 4"));
    let end = events.last().unwrap().at;
    assert!(
        last.duration_since(first) >= Duration::from_millis(600),
        "lines came together: {:?}",
        last.duration_since(first)
    );
    assert!(
        end.duration_since(first) >= Duration::from_millis(700),
        "the first line came {:?} before the end",
        end.duration_since(first)
    );
    // the result event is exactly the non-streaming answer
    let result = sse_result(&events);
    assert_eq!(result["stdout"], "line 0\nline 1\nline 2\nline 3\nline 4\n");
    assert_eq!(
        sse_text(&events, "stdout"),
        result["stdout"].as_str().unwrap()
    );
    for key in [
        "session_id",
        "stderr",
        "files",
        "code",
        "signal",
        "status",
        "message",
        "wall_time",
    ] {
        assert!(result.get(key).is_some(), "{key} missing: {result}");
    }
    assert_eq!(result["code"], 0);
    // the run is kept, with its result and what it used
    let (status, run) = get_run(&s, &run_id).await;
    assert_eq!(status, 200);
    assert_eq!(run["status"], "finished");
    assert_eq!(run["result"]["stdout"], result["stdout"]);
    let usage = &run["usage"]["run"];
    assert!(usage["wall_time_ms"].as_u64().unwrap() >= 1000, "{run}");
}

#[tokio::test]
async fn keep_alive_comments_come_at_least_every_two_seconds() {
    let _shared = EXCLUSIVE.read().await;
    let s = server().await;
    let resp = stream_exec(
        &s,
        json!({"lang": "py", "code": "import time\ntime.sleep(5)\nprint('done')"}),
    )
    .await;
    let opened = Instant::now();
    let events = sse_events(resp, Duration::from_secs(60)).await;
    let mut times = vec![opened];
    times.extend(events.iter().map(|e| e.at));
    let longest = times
        .windows(2)
        .map(|w| w[1].duration_since(w[0]))
        .max()
        .unwrap();
    assert!(
        longest <= Duration::from_millis(2000),
        "{longest:?} without a byte"
    );
    let comments = events.iter().filter(|e| e.event.is_none()).count();
    assert!(comments >= 2, "{comments} keep-alive comments in 5 s");
    assert_eq!(sse_result(&events)["stdout"], "done\n");
}

#[tokio::test]
async fn streamed_output_obeys_the_caps_in_small_utf8_chunks() {
    let _shared = EXCLUSIVE.read().await;
    let s = server_with(|c| c.stdout_bytes = 100_000).await;
    // multi-byte characters, far over the cap
    let code = "import sys\nsys.stdout.write('é✓' * 500000)\n";
    let events = sse_events(
        stream_exec(&s, json!({"lang": "py", "code": code})).await,
        Duration::from_secs(60),
    )
    .await;
    let result = sse_result(&events);
    assert_eq!(result["status"], "OL", "{result}");
    let streamed = sse_text(&events, "stdout");
    assert!(
        streamed == result["stdout"].as_str().unwrap(),
        "streamed {} bytes, the result holds {}",
        streamed.len(),
        result["stdout"].as_str().unwrap().len()
    );
    assert!(streamed.len() <= 100_000 + 3, "{}", streamed.len());
    for e in events
        .iter()
        .filter(|e| e.event.as_deref() == Some("stdout"))
    {
        let t = e.data["text"].as_str().unwrap();
        assert!(t.len() <= 4096, "a chunk of {} bytes", t.len());
    }
    // the cap's note reaches watchers too
    assert_eq!(
        sse_text(&events, "stderr"),
        result["stderr"].as_str().unwrap()
    );
}

#[tokio::test]
async fn a_bad_request_is_an_http_error_not_a_stream() {
    let _shared = EXCLUSIVE.read().await;
    let s = server().await;
    let r = stream_exec(&s, json!({"lang": "cobol", "code": "x"})).await;
    assert_eq!(r.status(), 400);
    let foreign = json!({"lang": "py", "code": "1", "files": [{
        "id": "aaaaaaaaaaaaaaaaaaaaa", "storage_session_id": "bbbbbbbbbbbbbbbbbbbbb", "name": "a.txt"}]});
    let r = stream_exec(&s, foreign).await;
    assert_eq!(r.status(), 403);
    assert_eq!(
        r.json::<Value>().await.unwrap(),
        json!({"error": "Unauthorized file reference"})
    );
}

#[tokio::test]
async fn cancel_kills_the_whole_process_tree_promptly_and_says_so() {
    let _shared = EXCLUSIVE.read().await;
    // no parked jails: every process under the server's uids is this run's
    let s = server_with(|c| c.warm_jails = 0).await;
    let code = "for i in 1 2 3 4; do sleep 300 & done\n\
                python3 -c 'import os, time; os.fork(); time.sleep(300)' &\n\
                echo started\nwait\n";
    // the starter watches over SSE; someone else cancels
    let resp = stream_exec(&s, json!({"lang": "bash", "code": code})).await;
    let run_id = resp.headers()["x-kiln-run-id"].to_str().unwrap().to_owned();
    let watcher = tokio::spawn(sse_events(resp, Duration::from_secs(60)));
    wait_run(&s, &run_id, Duration::from_secs(30), |r| {
        r["status"] == "running"
    })
    .await;
    // wait for the tree to exist
    let until = Instant::now() + Duration::from_secs(20);
    while jail_processes_of(&s).len() < 6 {
        assert!(Instant::now() < until, "{:?}", jail_processes_of(&s));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let t0 = Instant::now();
    let r = client()
        .post(format!("{}/runs/{run_id}/cancel", s.v1()))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202);
    let run = wait_run(&s, &run_id, Duration::from_secs(10), |r| {
        r["status"] == "cancelled"
    })
    .await;
    let took = t0.elapsed();
    assert!(took < Duration::from_secs(3), "cancel took {took:?}");
    no_jail_process_left(&s, Duration::from_secs(3)).await;
    let result = &run["result"];
    assert_eq!(result["message"], "Cancelled", "{run}");
    assert_eq!(result["status"], "SG");
    assert_eq!(result["signal"], "SIGKILL");
    assert_eq!(result["stdout"], "started\n");
    assert!(
        result["stderr"]
            .as_str()
            .unwrap()
            .ends_with("[kiln] execution stopped: cancelled\n"),
        "{result}"
    );
    // the starter got the same result
    let events = watcher.await.unwrap();
    assert_eq!(sse_result(&events)["message"], "Cancelled");
    // cancelling again changes nothing
    let again = client()
        .post(format!("{}/runs/{run_id}/cancel", s.v1()))
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), 200);
}

#[tokio::test]
async fn a_client_that_goes_away_cancels_its_run_unless_it_was_detached() {
    let _shared = EXCLUSIVE.read().await;
    let s = server().await;
    let code = "import time\nprint('up', flush=True)\ntime.sleep(5)\nprint('end')";
    // attached: reading the first output, then hanging up
    let resp = stream_exec(&s, json!({"lang": "py", "code": code})).await;
    let attached = resp.headers()["x-kiln-run-id"].to_str().unwrap().to_owned();
    wait_run(&s, &attached, Duration::from_secs(30), |r| {
        r["status"] == "running"
    })
    .await;
    drop(resp);
    let run = wait_run(&s, &attached, Duration::from_secs(10), |r| {
        r["status"] != "running" && r["status"] != "queued"
    })
    .await;
    assert_eq!(run["status"], "cancelled", "{run}");
    // detached: it goes on and finishes
    let resp = stream_exec(&s, json!({"lang": "py", "code": code, "detach": true})).await;
    let detached = resp.headers()["x-kiln-run-id"].to_str().unwrap().to_owned();
    wait_run(&s, &detached, Duration::from_secs(30), |r| {
        r["status"] == "running"
    })
    .await;
    drop(resp);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(get_run(&s, &detached).await.1["status"], "running");
    let run = wait_run(&s, &detached, Duration::from_secs(20), |r| {
        r["status"] == "finished"
    })
    .await;
    assert_eq!(run["result"]["stdout"], "up\nend\n");
    assert_eq!(run["detached"], true);
}

#[tokio::test]
async fn a_late_watcher_gets_everything_from_the_start() {
    let _shared = EXCLUSIVE.read().await;
    let s = server().await;
    let id = start_detached(
        &s,
        "py",
        "import sys, time\nprint('a')\nprint('oops', file=sys.stderr)\ntime.sleep(1)\nprint('b')",
    )
    .await;
    // halfway through
    tokio::time::sleep(Duration::from_millis(700)).await;
    let watch = |id: String| {
        let v1 = s.v1();
        async move {
            let r = client()
                .get(format!("{v1}/runs/{id}/events"))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
            sse_events(r, Duration::from_secs(30)).await
        }
    };
    let during = watch(id.clone()).await;
    wait_run(&s, &id, Duration::from_secs(20), |r| {
        r["status"] == "finished"
    })
    .await;
    let after = watch(id.clone()).await;
    for events in [&during, &after] {
        assert_eq!(sse_text(events, "stdout"), "a\nb\n");
        assert_eq!(sse_text(events, "stderr"), "oops\n");
        assert_eq!(sse_result(events)["stdout"], "a\nb\n");
        assert_eq!(events[0].event.as_deref(), Some("queued"));
    }
}

#[tokio::test]
async fn runs_are_visible_to_their_owner_only() {
    let _shared = EXCLUSIVE.read().await;
    let s = server().await;
    let r = client()
        .post(format!("{}/exec", s.v1()))
        .header("user-id", "alice")
        .json(&json!({"lang": "bash", "code": "echo hi"}))
        .send()
        .await
        .unwrap();
    let id = r.headers()["x-kiln-run-id"].to_str().unwrap().to_owned();
    assert_eq!(r.json::<Value>().await.unwrap()["stdout"], "hi\n");
    let as_user = |user: &'static str, method: reqwest::Method, path: String| {
        let v1 = s.v1();
        async move {
            client()
                .request(method, format!("{v1}{path}"))
                .header("user-id", user)
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    };
    assert_eq!(
        as_user("alice", reqwest::Method::GET, format!("/runs/{id}")).await,
        200
    );
    assert_eq!(
        as_user("mallory", reqwest::Method::GET, format!("/runs/{id}")).await,
        403
    );
    assert_eq!(
        as_user(
            "mallory",
            reqwest::Method::GET,
            format!("/runs/{id}/events")
        )
        .await,
        403
    );
    assert_eq!(
        as_user(
            "mallory",
            reqwest::Method::POST,
            format!("/runs/{id}/cancel")
        )
        .await,
        403
    );
    assert_eq!(
        as_user(
            "alice",
            reqwest::Method::GET,
            "/runs/aaaaaaaaaaaaaaaaaaaaa".into()
        )
        .await,
        404
    );
    assert_eq!(
        as_user("alice", reqwest::Method::GET, "/runs/nope".into()).await,
        400
    );
}

#[tokio::test]
async fn usage_covers_the_compile_and_the_run_step() {
    let _shared = EXCLUSIVE.read().await;
    let s = server().await;
    // burns about half a second of CPU in a child process the run does not wait for
    let code = "#include <stdio.h>\n#include <unistd.h>\n#include <time.h>\n\
        int main(void){ if(fork()==0){ clock_t t=clock(); while(clock()-t < CLOCKS_PER_SEC/2); return 0; }\n\
        clock_t t=clock(); while(clock()-t < CLOCKS_PER_SEC/4); printf(\"ok\\n\"); sleep(3); return 0; }\n";
    let r = client()
        .post(format!("{}/exec", s.v1()))
        .json(&json!({"lang": "c", "code": code}))
        .send()
        .await
        .unwrap();
    let id = r.headers()["x-kiln-run-id"].to_str().unwrap().to_owned();
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["stdout"], "ok\n", "{body}");
    assert!(
        body.get("usage").is_none(),
        "LibreChat's answer is unchanged"
    );
    let run = get_run(&s, &id).await.1;
    let compile = &run["usage"]["compile"];
    let step = &run["usage"]["run"];
    assert!(compile["cpu_time_ms"].as_u64().unwrap() > 0, "{run}");
    // both processes' CPU: at least 0.7 s of the 0.75 s they burned
    let cpu = step["cpu_time_ms"].as_u64().unwrap();
    assert!(cpu >= 700, "run step CPU {cpu} ms: {run}");
    assert!(
        step["memory_peak_bytes"].as_u64().unwrap() > 100_000,
        "{run}"
    );
    assert!(step["wall_time_ms"].as_u64().unwrap() >= 3000, "{run}");
}

/// Resident memory of this process (the server runs in it), bytes.
fn rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .unwrap()
        * 1024
}

#[tokio::test]
async fn slow_readers_neither_stall_a_run_nor_make_the_server_buffer() {
    let _alone = EXCLUSIVE.write().await;
    const OUT: usize = 4 * 1024 * 1024;
    let s = server_with(|c| c.stdout_bytes = OUT).await;
    let code = format!(
        "import sys\nsys.stdout.write('x' * {OUT})\nsys.stdout.flush()\nimport time\ntime.sleep(1)"
    );
    let id = start_detached(&s, "py", &code).await;
    // 20 watchers that never read a byte
    let mut stalled = Vec::new();
    for _ in 0..20 {
        let r = client()
            .get(format!("{}/runs/{id}/events", s.v1()))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        stalled.push(r);
    }
    // the run does not wait for them
    let run = wait_run(&s, &id, Duration::from_secs(60), |r| {
        r["status"] == "finished"
    })
    .await;
    assert_eq!(run["result"]["stdout"].as_str().unwrap().len(), OUT);
    let before = rss();
    // 20 more, after the output is all there; give the server time to write
    for _ in 0..20 {
        stalled.push(
            client()
                .get(format!("{}/runs/{id}/events", s.v1()))
                .send()
                .await
                .unwrap(),
        );
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let grown = rss().saturating_sub(before);
    // a copy of the output per watcher would be 80 MiB
    assert!(
        grown < (OUT * 4) as u64,
        "20 stalled watchers cost {} MiB",
        grown / (1024 * 1024)
    );
    // and nothing is lost for a watcher that finally reads
    let last = stalled.pop().unwrap();
    let events = sse_events(last, Duration::from_secs(60)).await;
    assert_eq!(sse_text(&events, "stdout").len(), OUT);
}

/// Runs `code` as `py` and returns the answer and the run's usage figures.
async fn py_with_usage(s: &kiln::testing::TestServer, code: &str) -> (Value, Value) {
    let r = client()
        .post(format!("{}/exec", s.v1()))
        .json(&json!({"lang": "py", "code": code}))
        .send()
        .await
        .expect("send");
    let id = r.headers()["x-kiln-run-id"].to_str().unwrap().to_owned();
    let body: Value = r.json().await.unwrap();
    let run = get_run(s, &id).await.1;
    (body, run["usage"]["run"].clone())
}

#[tokio::test]
async fn each_run_of_a_slot_reports_its_own_memory_peak_cpu_time_and_oom() {
    let _shared = EXCLUSIVE.read().await;
    // one slot and no warm jails: every run is a cold jail of the same slot,
    // in the slot's kept cgroups from its second run on
    let s = server_with(|c| {
        c.max_concurrency = 1;
        c.warm_jails = 0;
        c.memory_mb = 128;
    })
    .await;
    let (first, _) = py_with_usage(&s, "print('first')").await;
    assert_eq!(first["stdout"], "first\n", "{first}");
    let kept = format!("{}-u", std::process::id());
    // the pids hierarchy's `kiln/` parent (v2: the one parent)
    let parent = match kiln_sandbox::probe_host().cgroup {
        kiln_sandbox::CgroupSupport::V1 { pids, .. } => pids.join("kiln"),
        kiln_sandbox::CgroupSupport::V2 { group, .. } => group.join("kiln"),
        kiln_sandbox::CgroupSupport::None => panic!("no cgroups: the server could not start"),
    };
    let has_kept_groups = || {
        std::fs::read_dir(&parent)
            .into_iter()
            .flatten()
            .flatten()
            .any(|e| e.file_name().to_string_lossy().starts_with(&kept))
    };
    let until = Instant::now() + Duration::from_secs(10);
    while !has_kept_groups() {
        assert!(Instant::now() < until, "the slot never got kept groups");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let mib = 1024 * 1024;
    let (filled, used) =
        py_with_usage(&s, "b = b'x' * (100 << 20)\nimport time\nt = time.process_time()\nwhile time.process_time() - t < 1: pass\nprint('filled')").await;
    assert_eq!(filled["stdout"], "filled\n", "{filled}");
    assert!(
        used["memory_peak_bytes"].as_u64().unwrap() > 100 * mib,
        "{used}"
    );
    assert!(used["cpu_time_ms"].as_u64().unwrap() >= 1000, "{used}");
    let (hello, used) = py_with_usage(&s, "print('hello')").await;
    assert_eq!(hello["stdout"], "hello\n", "{hello}");
    let peak = used["memory_peak_bytes"].as_u64().unwrap();
    assert!(peak < 48 * mib, "the previous run's peak reported: {used}");
    let cpu = used["cpu_time_ms"].as_u64().unwrap();
    assert!(cpu < 700, "the previous run's CPU time reported: {used}");

    let (bomb, _) = py_with_usage(&s, "b = bytearray(512 << 20)\nprint('survived')").await;
    assert_eq!(bomb["message"], "Out of memory", "{bomb}");
    let (after, _) = py_with_usage(&s, "b = b'x' * (90 << 20)\nprint('fine')").await;
    assert_eq!(after["stdout"], "fine\n", "{after}");
    assert!(
        after["status"].is_null() && after["message"].is_null(),
        "the previous run's OOM reported: {after}"
    );
}
