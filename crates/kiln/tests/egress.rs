//! Egress services end to end (issue 15's proof): a DeepL-like fake
//! upstream on loopback, Kiln configured with it as a service, and a Python
//! program in the sandbox that translates an uploaded `contract.docx`
//! through the gateway and writes `contract.de.docx`, which comes back from
//! `/v1/exec` as an output file. The upstream saw the injected key; the jail
//! never did.

mod common;

#[path = "../../kiln-egress/tests/support/fake_deepl.rs"]
mod fake_deepl;

use common::*;
use fake_deepl::{FakeDeepl, docx_paragraphs, make_docx, to_german};
use serde_json::{Value, json};

const KEY: &str = "kiln-e2e-deepl-key-7d41c0b9e2:fx";

fn deepl(upstream: &str) -> kiln_egress::ServiceConfig {
    kiln_egress::ServiceConfig {
        upstream: upstream.to_owned(),
        description: "DeepL document translation (multipart upload, poll, download)".to_owned(),
        allowed_methods: vec!["POST".into(), "GET".into()],
        allowed_paths: vec!["/v2/document".into(), "/v2/document/*".into()],
        inject_header: [("Authorization".to_owned(), format!("DeepL-Auth-Key {KEY}"))].into(),
        inject_query: Default::default(),
        max_body_bytes: 31_457_280,
        max_response_bytes: 64 << 20,
        rate: Some("60/min".into()),
        user_rate: None,
        timeout_secs: 30,
        users: vec![],
        tenants: vec![],
        allow_private_upstream: true,
        forward_headers: vec![],
        response_headers: vec![],
        allow_range: false,
        max_requests_per_grant: 100,
    }
}

const TRANSLATE: &str = r#"
import json, os, time
import requests
import docx

base = os.environ["KILN_SERVICES_URL"]
listing = requests.get(base + "/").json()
print("SERVICES", ",".join(s["name"] for s in listing["services"]), os.environ["KILN_SERVICES"])

with open("/mnt/data/contract.docx", "rb") as f:
    r = requests.post(base + "/deepl/v2/document",
                      files={"file": ("contract.docx", f)}, data={"target_lang": "DE"})
r.raise_for_status()
doc = r.json()
for _ in range(50):
    st = requests.post(base + "/deepl/v2/document/" + doc["document_id"],
                       data={"document_key": doc["document_key"]}).json()
    if st["status"] == "done":
        break
    time.sleep(0.1)
r = requests.post(base + "/deepl/v2/document/" + doc["document_id"] + "/result",
                  data={"document_key": doc["document_key"]})
r.raise_for_status()
with open("/mnt/data/contract.de.docx", "wb") as f:
    f.write(r.content)
for p in docx.Document("/mnt/data/contract.de.docx").paragraphs:
    print("DE", p.text)
# everything the jail can see of its environment and its answers' headers
print("ENV", json.dumps(dict(os.environ)))
print("HEADERS", json.dumps(dict(r.headers)))
for pid in ("self", "1"):
    try:
        print("PROC", pid, open("/proc/%s/environ" % pid, "rb").read())
    except OSError as e:
        print("PROC", pid, "unreadable", e.errno)
"#;

#[tokio::test]
async fn a_sandboxed_program_translates_a_docx_through_the_gateway_without_seeing_the_key() {
    let fake = FakeDeepl::start(KEY).await;
    let s = server_with(|c| {
        c.services.insert("deepl".into(), deepl(&fake.url));
    })
    .await;
    let contract = make_docx(&[
        "Service Agreement",
        "This contract is signed by both parties.",
        "Payment is due within thirty days.",
    ]);
    let (st, up) = upload(
        &s,
        "alice",
        &[("kind", "user"), ("id", "alice")],
        "contract.docx",
        contract,
    )
    .await;
    assert_eq!(st, 200, "{up}");
    kiln_egress::install_crypto_provider();
    let resp = reqwest::Client::new()
        .post(format!("{}/exec", s.v1()))
        .json(&json!({
            "lang": "py",
            "user_id": "alice",
            "code": TRANSLATE,
            "files": [{
                "id": up["files"][0]["fileId"],
                "storage_session_id": up["storage_session_id"],
                "name": "contract.docx",
                "kind": "user",
                "resource_id": "alice",
            }],
        }))
        .send()
        .await
        .expect("exec");
    assert_eq!(resp.status(), 200);
    // the ledger names the run (every answer carries its id)
    let run_id = resp.headers()["x-kiln-run-id"]
        .to_str()
        .expect("run id")
        .to_owned();
    let r: Value = resp.json().await.expect("exec answer");
    let stdout = r["stdout"].as_str().unwrap_or("");
    assert!(
        stdout.starts_with("SERVICES deepl deepl\n"),
        "stdout: {stdout}\nstderr: {}",
        r["stderr"]
    );
    let german: Vec<String> = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("DE "))
        .map(str::to_owned)
        .collect();
    assert_eq!(
        german,
        vec![
            to_german("Service Agreement"),
            to_german("This contract is signed by both parties."),
            to_german("Payment is due within thirty days."),
        ]
    );
    // the translated file is an output of the run, downloadable
    let out = file(&r, "contract.de.docx");
    let sid = r["session_id"].as_str().expect("session id");
    let (st, bytes) = download(&s, sid, out["id"].as_str().expect("id"), "").await;
    assert_eq!(st, 200);
    assert_eq!(
        docx_paragraphs(&bytes).expect("a docx"),
        german,
        "the downloaded file is the translation"
    );
    // the upstream saw the injected key on every call ...
    let seen = fake.seen();
    assert!(seen.len() >= 4, "{seen:?}");
    assert!(
        seen.iter()
            .all(|c| c.authorization.as_deref() == Some(&*format!("DeepL-Auth-Key {KEY}"))),
        "{seen:?}"
    );
    // ... the jail never did: not in its environment, not in any answer
    let everything = r.to_string();
    assert!(!everything.contains(KEY), "the key reached the jail: {r}");
    assert!(
        !everything.contains("7d41c0b9e2"),
        "part of the key reached the jail: {r}"
    );
    assert!(stdout.contains("ENV {"), "{stdout}");
    // and every call is in the ledger, under this run and user
    let calls = s
        .store
        .egress_calls(&format!("run:{run_id}"))
        .await
        .expect("ledger");
    assert!(calls.len() >= 4, "{calls:?}");
    assert!(calls.iter().all(|c| c.user_id == "alice"
        && c.service == "deepl"
        && c.status == 200
        && c.outcome == "ok"));
    // (the listing, GET /, never leaves the host and is not a call)
    // (rows are written as calls end, so their order is not the calls')
    // (status polls are POSTs too: find the upload by its path)
    let upload = calls
        .iter()
        .find(|c| c.method == "POST" && c.path == "/v2/document")
        .unwrap_or_else(|| panic!("the upload: {calls:?}"));
    assert!(upload.bytes_up > 0);
    assert!(
        calls
            .iter()
            .any(|c| c.path.ends_with("/result") && c.bytes_down as usize == bytes.len()),
        "the download: {calls:?}"
    );
    // the operator sees the same calls, newest first, in the admin view
    let seen: Vec<Value> = client()
        .get(format!("{}/admin/egress", s.v1()))
        .send()
        .await
        .expect("admin egress")
        .json()
        .await
        .expect("json");
    let owner = format!("run:{run_id}");
    let ours: Vec<&Value> = seen
        .iter()
        .filter(|c| c["owner"] == owner.as_str())
        .collect();
    assert_eq!(ours.len(), calls.len(), "{seen:?}");
    assert!(
        ours.iter().any(|c| c["method"] == "POST"
            && c["path"] == "/v2/document"
            && c["user_id"] == "alice"),
        "{seen:?}"
    );
    let started: Vec<i64> = seen
        .iter()
        .map(|c| c["started_at_ms"].as_i64().unwrap())
        .collect();
    assert!(
        started.windows(2).all(|w| w[0] >= w[1]),
        "newest first: {started:?}"
    );
}

#[tokio::test]
async fn runs_of_users_without_a_service_keep_warm_jails_and_no_network() {
    let fake = FakeDeepl::start(KEY).await;
    let s = server_with(|c| {
        let mut d = deepl(&fake.url);
        d.users = vec!["translator".into()];
        c.services.insert("deepl".into(), d);
    })
    .await;
    let code = "import os, socket\nprint(os.environ.get('KILN_SERVICES_URL'), os.getppid())\ntry:\n    socket.socket(socket.AF_INET); print('inet')\nexcept OSError: print('no inet')";
    let r = exec(
        &s,
        json!({"lang": "py", "user_id": "someone", "code": code}),
    )
    .await;
    // no grant: no URL, no AF_INET, and (when the fork-server runs) a warm
    // jail, where getppid() is 0
    let out = r["stdout"].as_str().unwrap_or("");
    assert!(out.starts_with("None "), "{r}");
    assert!(out.ends_with("no inet\n"), "{r}");
    let granted = exec(
        &s,
        json!({"lang": "py", "user_id": "translator", "code": code}),
    )
    .await;
    assert_eq!(
        granted["stdout"], "http://127.0.0.1 1\ninet\n",
        "a granted run is a jail of its own (cold: ppid 1): {granted}"
    );
    let v: Value = granted;
    assert!(v["files"].as_array().is_none_or(|f| f.is_empty()));
}
