//! Attacks through and around the egress gateway, from inside the jail: a
//! server with services (granted to user `translator` only) in front of a
//! DeepL-like fake upstream on loopback. Every attack is refused with a
//! clear error, the key never shows, and the service stays healthy.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::fake_deepl::FakeDeepl;
use crate::{client, common, out};

const KEY: &str = "attack-suite-deepl-key-93ac51f0d7:fx";
const KEY_PART: &str = "93ac51f0d7";

pub struct EgressShared {
    pub v1: String,
    pub port: u16,
    pub fake_port: u16,
}

fn service(upstream: &str, paths: &[&str]) -> kiln_egress::ServiceConfig {
    kiln_egress::ServiceConfig {
        upstream: upstream.to_owned(),
        description: String::new(),
        allowed_methods: vec!["POST".into(), "GET".into()],
        allowed_paths: paths.iter().map(|p| (*p).to_owned()).collect(),
        inject_header: [
            ("Authorization".to_owned(), format!("DeepL-Auth-Key {KEY}")),
            ("X-Api-Key".to_owned(), KEY.to_owned()),
        ]
        .into(),
        inject_query: Default::default(),
        max_body_bytes: 1 << 20,
        max_response_bytes: 1 << 20,
        rate: None,
        user_rate: None,
        timeout_secs: 10,
        users: vec!["translator".into()],
        tenants: vec![],
        allow_private_upstream: true,
        forward_headers: vec![],
        response_headers: vec![],
        allow_range: false,
        max_requests_per_grant: 100,
    }
}

pub fn egress_server() -> &'static EgressShared {
    static SHARED: OnceLock<EgressShared> = OnceLock::new();
    SHARED.get_or_init(|| {
        common::require_root();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let fake = FakeDeepl::start(KEY).await;
                let s = kiln::testing::TestServer::start(
                    std::path::Path::new(env!("CARGO_BIN_EXE_kiln")),
                    |c| {
                        c.uid_base = common::fresh_uid_base();
                        c.memory_mb = 256;
                        c.timeout_secs = 20;
                        c.max_concurrency = 4;
                        c.services.insert(
                            "deepl".into(),
                            service(&fake.url, &["/v2/document", "/v2/document/*"]),
                        );
                        c.services.insert(
                            "tricks".into(),
                            service(
                                &fake.url,
                                &["/redirect/*", "/echo", "/big/*", "/chunked/*", "/sink"],
                            ),
                        );
                        c.services.insert(
                            "burst".into(),
                            kiln_egress::ServiceConfig {
                                rate: Some("3/min".into()),
                                ..service(&fake.url, &["/v2/usage"])
                            },
                        );
                        c.services.insert(
                            "private".into(),
                            kiln_egress::ServiceConfig {
                                users: vec!["someone-else".into()],
                                ..service(&fake.url, &["/v2/usage"])
                            },
                        );
                    },
                )
                .await
                .expect("start egress server");
                let port = s.base_url.rsplit(':').next().unwrap().parse().unwrap();
                tx.send(EgressShared {
                    v1: s.v1(),
                    port,
                    fake_port: fake.port,
                })
                .unwrap();
                std::future::pending::<()>().await;
                drop((s, fake));
            });
        });
        rx.recv().expect("egress server started")
    })
}

/// Runs `code` as `user` on the egress server; the run must complete.
async fn run_as(user: &str, lang: &str, code: &str) -> Value {
    let s = egress_server();
    let r = client()
        .post(format!("{}/exec", s.v1))
        .json(&json!({"lang": lang, "code": code, "user_id": user}))
        .send()
        .await
        .expect("server unreachable during attack");
    let status = r.status().as_u16();
    let v: Value = r.json().await.unwrap_or(Value::Null);
    assert_eq!(status, 200, "attack did not complete as a normal run: {v}");
    assert!(
        !v.to_string().contains(KEY_PART),
        "the key reached the jail: {v}"
    );
    v
}

/// Python prelude: `call(method, path, body=None, headers={})` prints
/// `<status> <reason header>` for a request to the gateway, sent as raw
/// as http.client allows (no normalisation of the path).
const PY: &str = r#"
import http.client, os, sys
BASE = os.environ.get("KILN_SERVICES_URL", "")
def call(method, path, body=None, headers=None):
    c = http.client.HTTPConnection("127.0.0.1", 80, timeout=15)
    c.request(method, path, body=body, headers=headers or {})
    r = c.getresponse()
    data = r.read()
    print(r.status, r.getheader("x-kiln-egress-error") or "-")
    return r, data
"#;

/// The gateway and the server still work: a granted run lists its services
/// and an ordinary run answers, both quickly.
async fn assert_healthy() {
    let t = Instant::now();
    let r = run_as(
        "translator",
        "py",
        &format!("{PY}\ncall('GET', '/')\nprint('alive')"),
    )
    .await;
    assert_eq!(
        out(&r),
        "200 -\nalive\n",
        "gateway unhealthy after attack: {r}"
    );
    let r = run_as("attacker", "py", "print('alive')").await;
    assert_eq!(out(&r), "alive\n", "service unhealthy after attack: {r}");
    assert!(
        t.elapsed() < Duration::from_secs(20),
        "slow: {:?}",
        t.elapsed()
    );
}

#[tokio::test]
async fn a_service_not_granted_is_refused_inside_the_jail() {
    let r = run_as(
        "translator",
        "py",
        &format!(
            "{PY}\nfor p in ['/private/v2/usage', '/nosuch/v2/usage', '/%2e%2e/deepl/v2/document']:\n    call('GET', p)"
        ),
    )
    .await;
    assert_eq!(
        out(&r),
        "403 not_granted\n403 not_granted\n403 not_granted\n",
        "{r}"
    );
    assert_healthy().await;
}

#[tokio::test]
async fn paths_outside_the_allow_list_and_encoding_tricks_are_refused() {
    let paths = [
        "/deepl/v2/usage",
        "/deepl/v2/document/../../v2/usage",
        "/deepl/v2/document/%2e%2e/%2e%2e/v2/usage",
        "/deepl/v2/document/%2E%2E%2F%2E%2E%2Fv2%2Fusage",
        "/deepl/v2/document/%252e%252e/usage",
        "/deepl/v2/document/..%5c..%5cv2%5cusage",
        "/deepl/v2/document/..;/..;/v2/usage",
        "/deepl//v2/document",
        "/deepl/v2/document/%00",
    ];
    let list = paths
        .iter()
        .map(|p| format!("{p:?}"))
        .collect::<Vec<_>>()
        .join(", ");
    let r = run_as(
        "translator",
        "py",
        &format!("{PY}\nfor p in [{list}]:\n    call('POST', p, body=b'')"),
    )
    .await;
    let lines: Vec<&str> = out(&r).lines().collect();
    assert_eq!(lines.len(), paths.len(), "{r}");
    assert_eq!(lines[0], "403 path_not_allowed", "{r}");
    for l in &lines[1..] {
        assert_eq!(*l, "400 bad_path", "{r}");
    }
    assert_healthy().await;
}

#[tokio::test]
async fn the_gateway_is_no_open_proxy() {
    // an absolute-form request (what a proxy would get) and a Host header
    // naming the metadata service
    let code = format!(
        r#"{PY}
import requests
r = requests.get("http://169.254.169.254/latest/meta-data/", proxies={{"http": BASE}}, timeout=10)
print(r.status_code, r.headers.get("x-kiln-egress-error"))
r, body = call("GET", "/tricks/echo", headers={{"Host": "169.254.169.254"}})
print("host=169.254" in body.decode())
"#
    );
    let r = run_as("translator", "py", &code).await;
    assert_eq!(out(&r), "400 bad_request\n200 -\nFalse\n", "{r}");
    assert_healthy().await;
}

#[tokio::test]
async fn redirects_to_loopback_or_metadata_are_refused() {
    let code = format!(
        "{PY}\nfor to in ['local', 'metadata']:\n    r, _ = call('GET', '/tricks/redirect/' + to)\n    print(r.getheader('location'))"
    );
    let r = run_as("translator", "py", &code).await;
    assert_eq!(
        out(&r),
        "502 upstream_redirect\nNone\n502 upstream_redirect\nNone\n",
        "{r}"
    );
    assert_healthy().await;
}

#[tokio::test]
async fn a_response_echoing_the_key_never_shows_it() {
    let code = format!(
        "{PY}\nr, body = call('GET', '/tricks/echo')\nprint(dict(r.getheaders()))\nprint(body.decode())"
    );
    let r = run_as("translator", "py", &code).await;
    let o = out(&r);
    assert!(o.starts_with("200 -\n"), "{r}");
    // the injected value is a secret as a whole: overwritten entirely
    assert!(o.contains("authorization=*****"), "{r}");
    assert!(!o.to_ascii_lowercase().contains("set-cookie"), "{r}");
    // run_as already checked that no part of the key is anywhere in the result
    assert_healthy().await;
}

#[tokio::test]
async fn oversized_bodies_are_refused_each_way() {
    let code = format!(
        r#"{PY}
call("POST", "/deepl/v2/document", body=b"x" * (2 << 20))
def chunks():
    for _ in range(40):
        yield b"y" * 65536
# an iterable body goes chunked, with no length to check up front
call("POST", "/tricks/sink", body=chunks())
# and a chunked body that is not chunked at all
call("POST", "/tricks/sink", body=b"zz" * 1000, headers={{"Transfer-Encoding": "chunked"}})
call("GET", "/tricks/big/%d" % (2 << 20))
try:
    call("GET", "/tricks/chunked/%d" % (3 << 20))
except Exception as e:
    print("cut", type(e).__name__)
"#
    );
    let r = run_as("translator", "py", &code).await;
    let o = out(&r);
    assert!(
        o.starts_with(
            "413 request_too_large\n413 request_too_large\n400 bad_request\n502 response_too_large\n"
        ),
        "{r}"
    );
    assert!(
        o.contains("cut "),
        "a body over the cap must not arrive whole: {r}"
    );
    assert_healthy().await;
}

#[tokio::test]
async fn a_rate_burst_gets_a_clear_429() {
    let code = format!(
        "{PY}\nfor _ in range(5):\n    r, body = call('GET', '/burst/v2/usage')\nprint(r.getheader('retry-after') is not None, body.decode())"
    );
    let r = run_as("translator", "py", &code).await;
    let o = out(&r);
    assert!(
        o.starts_with("200 -\n200 -\n200 -\n429 rate_limited\n429 rate_limited\nTrue "),
        "{r}"
    );
    assert!(o.contains("3/min"), "the message says the limit: {r}");
    assert_healthy().await;
}

#[tokio::test]
async fn a_granted_jail_can_reach_nothing_but_the_gateway() {
    let s = egress_server();
    let (api, upstream) = (s.port, s.fake_port);
    let code = format!(
        r#"import socket
def attempt(what, f):
    try:
        f(); print(what, "OPEN")
    except OSError:
        print(what, "refused")
attempt("kiln-api", lambda: socket.create_connection(("127.0.0.1", {api}), timeout=3))
attempt("upstream", lambda: socket.create_connection(("127.0.0.1", {upstream}), timeout=3))
attempt("metadata", lambda: socket.create_connection(("169.254.169.254", 80), timeout=3))
attempt("internet", lambda: socket.create_connection(("1.1.1.1", 443), timeout=3))
attempt("ipv6", lambda: socket.create_connection(("::1", {upstream}), timeout=3))
attempt("udp", lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"x", ("8.8.8.8", 53)))
attempt("dns", lambda: socket.getaddrinfo("api.deepl.com", 443))
def listen():
    s = socket.socket(); s.bind(("127.0.0.1", 8080)); s.listen()
attempt("listen", listen)
attempt("gateway", lambda: socket.create_connection(("127.0.0.1", 80), timeout=3))
"#
    );
    let r = run_as("translator", "py", &code).await;
    assert_eq!(
        out(&r),
        "kiln-api refused\nupstream refused\nmetadata refused\ninternet refused\nipv6 refused\nudp refused\ndns refused\nlisten refused\ngateway OPEN\n",
        "{r}"
    );
    // the same from bash and node
    let r = run_as(
        "translator",
        "bash",
        &format!(
            "(echo > /dev/tcp/127.0.0.1/{upstream}) 2>/dev/null && echo OPEN || echo refused; \
             curl -s -o /dev/null -w '%{{http_code}}\\n' http://127.0.0.1:{upstream}/v2/usage || echo curl-refused; \
             curl -s -o /dev/null -w '%{{http_code}}\\n' $KILN_SERVICES_URL/"
        ),
    )
    .await;
    assert_eq!(out(&r), "refused\n000\ncurl-refused\n200\n", "{r}");
    let r = run_as(
        "translator",
        "js",
        &format!(
            "fetch('http://127.0.0.1:{upstream}/v2/usage').then(() => console.log('OPEN')).catch(() => console.log('refused'))\
             .then(() => fetch(process.env.KILN_SERVICES_URL + '/')).then(r => console.log(r.status));"
        ),
    )
    .await;
    assert_eq!(out(&r), "refused\n200\n", "{r}");
    assert_healthy().await;
}

#[tokio::test]
async fn the_key_is_nowhere_in_a_granted_jail() {
    let code = r#"
import os, glob
seen = []
for k, v in os.environ.items():
    seen.append(k + "=" + v)
for p in glob.glob("/proc/[0-9]*/environ") + ["/proc/self/environ"]:
    try:
        seen.append(open(p, "rb").read().decode(errors="replace"))
    except OSError:
        pass
for root in ["/etc", "/mnt/data", "/tmp"]:
    for dirpath, _, files in os.walk(root):
        for f in files:
            try:
                seen.append(open(os.path.join(dirpath, f), "rb").read(1 << 20).decode(errors="replace"))
            except OSError:
                pass
print(os.environ["KILN_SERVICES_URL"], os.environ["KILN_SERVICES"])
print(len(seen) > 3)
print("\n".join(seen))
"#;
    // run_as checks the whole result for the key
    let r = run_as("translator", "py", code).await;
    assert!(
        out(&r).starts_with("http://127.0.0.1 burst,deepl,tricks\nTrue\n"),
        "{r}"
    );
}

#[tokio::test]
async fn a_run_without_a_grant_keeps_todays_socket_rules() {
    let r = run_as(
        "attacker",
        "py",
        "import os, socket\nprint(os.environ.get('KILN_SERVICES_URL'))\ntry:\n    socket.socket(socket.AF_INET); print('inet')\nexcept OSError: print('no inet')",
    )
    .await;
    assert_eq!(out(&r), "None\nno inet\n", "{r}");
}
