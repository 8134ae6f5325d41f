//! What a running server tells the tools in front of it. The OpenAPI
//! document: it is OpenAPI 3.1, every operation it lists is a route the
//! server has (and with the method it says), every route LibreChat and the
//! seed call is in it, every schema it references exists, and its security
//! says which operations need the key. Under CI the document also passes an
//! independent validator (`openapi-spec-validator`, installed by
//! scripts/test.sh). The Prometheus exposition at `/metrics` (help texts,
//! histograms, series that exist before their first event) and the Grafana
//! dashboard in `deploy/grafana/` that reads it.

mod common;

use std::collections::BTreeSet;

use common::*;
use serde_json::Value;

const METHODS: [&str; 5] = ["get", "post", "put", "delete", "patch"];

/// (method, path) of every operation in `doc`.
fn operations(doc: &Value) -> BTreeSet<(String, String)> {
    let mut out = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for m in METHODS {
            if item.get(m).is_some() {
                out.insert((m.to_owned(), path.clone()));
            }
        }
    }
    out
}

/// A concrete URL path for a templated one.
fn concrete(path: &str) -> String {
    path.split('/')
        .map(|seg| match seg {
            "{file_id}" if path.starts_with("/v1/librechat") => "a".repeat(42),
            s if s.starts_with('{') => "a".repeat(21),
            s => s.to_owned(),
        })
        .collect::<Vec<_>>()
        .join("/")
}

/// Every `$ref` in `v`.
fn refs(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                if k == "$ref" {
                    out.extend(x.as_str().map(str::to_owned));
                } else {
                    refs(x, out);
                }
            }
        }
        Value::Array(a) => a.iter().for_each(|x| refs(x, out)),
        _ => {}
    }
}

#[tokio::test]
async fn the_document_matches_the_routes_the_server_has() {
    let s = server_with(|c| c.warm_jails = 0).await;
    let r = client()
        .get(format!("{}/openapi.json", s.base_url))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "application/json");
    let doc: Value = r.json().await.unwrap();
    assert!(
        doc["openapi"].as_str().unwrap().starts_with("3.1"),
        "{}",
        doc["openapi"]
    );
    assert_eq!(doc["info"]["title"], "Kiln");
    // also under /v1
    let again: Value = client()
        .get(format!("{}/openapi.json", s.v1()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(again, doc);

    let ops = operations(&doc);
    // every documented operation is routed (our fallbacks answer exactly
    // these bodies for an unknown path or method)
    for (method, path) in &ops {
        let url = format!("{}{}", s.base_url, concrete(path));
        let req = client().request(method.to_uppercase().parse().unwrap(), &url);
        let r = req.send().await.unwrap();
        let status = r.status().as_u16();
        let body = r.text().await.unwrap_or_default();
        assert!(
            !(status == 404 && body == r#"{"error":"Not found"}"#),
            "{method} {path} is documented but not routed"
        );
        assert_ne!(status, 405, "{method} {path} is documented but not allowed");
    }
    // every route the clients call is documented, and its method
    for (method, path) in [
        ("post", "/v1/exec"),
        ("post", "/v1/exec/programmatic"),
        ("post", "/v1/exec/programmatic/cancel"),
        ("post", "/v1/upload"),
        ("post", "/v1/upload/batch"),
        ("get", "/v1/download/{session_id}/{file_id}"),
        ("get", "/v1/files/{session_id}"),
        ("delete", "/v1/files/{session_id}/{file_id}"),
        ("get", "/v1/sessions/{session_id}/objects/{file_id}"),
        ("delete", "/v1/sessions/{session_id}/objects/{file_id}"),
        ("get", "/v1/health"),
        ("get", "/v1/runs/{run_id}"),
        ("get", "/v1/runs/{run_id}/events"),
        ("post", "/v1/runs/{run_id}/cancel"),
        ("post", "/v1/librechat/runs"),
        ("post", "/v1/librechat/files"),
        ("get", "/v1/librechat/files"),
        ("get", "/v1/librechat/files/{file_id}"),
        ("delete", "/v1/librechat/files/{file_id}"),
        ("get", "/v1/librechat/health"),
        ("post", "/v1/mcp"),
        ("delete", "/v1/mcp"),
        ("post", "/v1/sandbox"),
        ("delete", "/v1/sandbox/{id}"),
        ("get", "/v1/sandbox/{id}/running"),
        ("post", "/v1/sandbox/{id}/exec"),
        ("get", "/v1/sandbox/{id}/file/{path}"),
        ("put", "/v1/sandbox/{id}/file/{path}"),
        ("get", "/metrics"),
        ("get", "/openapi.json"),
    ] {
        assert!(
            ops.contains(&(method.to_owned(), path.to_owned())),
            "{method} {path} is served but not documented"
        );
    }
    // a method the document does not list is not served
    let r = client()
        .put(format!("{}/v1/exec", s.base_url))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 405);

    // every reference resolves
    let mut all = Vec::new();
    refs(&doc, &mut all);
    assert!(!all.is_empty());
    for r in all {
        let name = r
            .strip_prefix("#/components/schemas/")
            .unwrap_or_else(|| panic!("unexpected $ref {r}"));
        assert!(
            doc["components"]["schemas"].get(name).is_some(),
            "{r} does not resolve"
        );
    }

    validate_externally(&doc);
}

/// `python3` with `openapi-spec-validator` importable (scripts/test.sh puts
/// it in `KILN_OPENAPI_PYTHONPATH` when python3 lacks it).
fn python() -> std::process::Command {
    let mut cmd = std::process::Command::new("python3");
    if let Some(path) = std::env::var_os("KILN_OPENAPI_PYTHONPATH") {
        cmd.env("PYTHONPATH", path);
    }
    cmd
}

/// `openapi-spec-validator` (PyPI) on the document: present under CI
/// (scripts/test.sh installs it), else skipped.
fn validate_externally(doc: &Value) {
    let probe = python()
        .args(["-c", "import openapi_spec_validator"])
        .output();
    if !probe.is_ok_and(|o| o.status.success()) {
        assert!(
            std::env::var_os("CI").is_none(),
            "openapi-spec-validator is missing; scripts/test.sh installs it"
        );
        eprintln!("openapi-spec-validator not installed: external validation skipped");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("openapi.json");
    std::fs::write(&file, doc.to_string()).unwrap();
    let out = python()
        .args(["-m", "openapi_spec_validator"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "openapi-spec-validator: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `GET url`, sent.
async fn get(url: &str) -> reqwest::Response {
    client().get(url).send().await.unwrap()
}

/// The operation object of `method path`.
fn operation<'a>(doc: &'a Value, method: &str, path: &str) -> &'a Value {
    let op = &doc["paths"][path][method];
    assert!(op.is_object(), "{method} {path} is not documented");
    op
}

#[tokio::test]
async fn every_protected_operation_lists_401_and_the_key_schemes_and_public_ones_need_none() {
    let s = server_with(|c| {
        c.warm_jails = 0;
        c.api_key = Some("openapi-key".into());
    })
    .await;
    let doc: Value = get(&format!("{}/openapi.json", s.base_url))
        .await
        .json()
        .await
        .unwrap();
    let schemes = &doc["components"]["securitySchemes"];
    assert_eq!(schemes["apiKey"]["type"], "apiKey");
    assert_eq!(schemes["apiKey"]["in"], "header");
    assert_eq!(schemes["apiKey"]["name"], "X-API-Key");
    assert_eq!(schemes["bearer"]["type"], "http");
    assert_eq!(schemes["bearer"]["scheme"], "bearer");

    let public = [
        ("get", "/v1/health"),
        ("get", "/health"),
        ("get", "/v1/librechat/health"),
        ("get", "/metrics"),
        ("get", "/openapi.json"),
    ];
    let mut protected = 0;
    for (method, path) in operations(&doc) {
        let op = operation(&doc, &method, &path);
        if public.contains(&(method.as_str(), path.as_str())) {
            assert_eq!(op["security"], serde_json::json!([]), "{method} {path}");
            // and the server agrees: no key needed
            let r = get(&format!("{}{path}", s.base_url)).await;
            assert_ne!(r.status(), 401, "{method} {path} is public");
            continue;
        }
        protected += 1;
        let names: Vec<&str> = op["security"]
            .as_array()
            .unwrap_or_else(|| panic!("{method} {path} has no security"))
            .iter()
            .flat_map(|req| req.as_object().unwrap().keys().map(String::as_str))
            .collect();
        assert_eq!(names, ["apiKey", "bearer"], "{method} {path}");
        assert!(
            op["responses"]["401"].is_object(),
            "{method} {path} does not list 401"
        );
        // and the server agrees: without the key, 401
        let r = client()
            .request(
                method.to_uppercase().parse().unwrap(),
                format!("{}{}", s.base_url, concrete(&path)),
            )
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 401, "{method} {path} is protected");
    }
    assert!(protected > 20, "{protected} protected operations");

    // `detail=simple` lists strings; the schema says so
    let list = operation(&doc, "get", "/v1/files/{session_id}");
    let item = &list["responses"]["200"]["content"]["application/json"]["schema"]["items"];
    let name = item["$ref"].as_str().unwrap().rsplit('/').next().unwrap();
    let shapes = doc["components"]["schemas"][name]["oneOf"]
        .as_array()
        .unwrap();
    assert!(shapes.iter().any(|s| s["type"] == "string"), "{shapes:?}");
    assert!(shapes.iter().any(|s| s.get("$ref").is_some()), "{shapes:?}");

    // the event stream and the 413 of /v1/exec
    let exec = operation(&doc, "post", "/v1/exec");
    assert!(exec["responses"]["200"]["content"]["text/event-stream"].is_object());
    assert!(exec["responses"]["200"]["content"]["application/json"].is_object());
    assert!(exec["responses"]["413"].is_object());

    validate_externally(&doc);
    s.stop().await.unwrap();
}

/// Metric names a PromQL expression reads (`kiln_*` and `process_*`).
fn metric_names(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    let bytes = expr.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let word_start = i == 0 || !(bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_');
        let rest = &expr[i..];
        if word_start && (rest.starts_with("kiln_") || rest.starts_with("process_")) {
            let len = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            out.push(rest[..len].to_owned());
            i += len;
        } else {
            i += 1;
        }
    }
    out
}

#[tokio::test]
async fn metrics_have_help_histogram_buckets_process_figures_and_zeroed_counters() {
    let s = server_with(|c| c.warm_jails = 0).await;
    // one request, so that the HTTP series exist
    assert_eq!(get(&format!("{}/health", s.v1())).await.status(), 200);
    let text = get(&format!("{}/metrics", s.base_url))
        .await
        .text()
        .await
        .unwrap();
    for line in [
        "# HELP kiln_http_requests_total ",
        "# TYPE kiln_http_requests_total counter",
        "# HELP kiln_http_request_duration_seconds ",
        "# TYPE kiln_http_request_duration_seconds histogram",
        "# TYPE process_resident_memory_bytes gauge",
        "# TYPE process_cpu_seconds_total counter",
        // counters alerts watch exist before their first increment
        "kiln_sessions_lost_total 0",
        "kiln_http_connections_shed_total 0",
        "kiln_runs_refused_total{reason=\"queue_full\"} 0",
    ] {
        assert!(text.contains(line), "no {line:?} in\n{text}");
    }
    assert!(
        text.contains(&format!(
            "kiln_build_info{{version=\"{}\"}} 1",
            env!("CARGO_PKG_VERSION")
        )),
        "{text}"
    );
    // buckets, cumulative up to +Inf, with their sum and count
    let health = |suffix: &str| {
        text.lines()
            .filter(|l| l.starts_with(&format!("kiln_http_request_duration_seconds_{suffix}")))
            .filter(|l| l.contains("route=\"/health\""))
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    let buckets = health("bucket");
    assert!(buckets.len() > 10, "{buckets:?}");
    assert!(
        buckets.iter().any(|l| l.contains("le=\"0.005\"")),
        "{buckets:?}"
    );
    assert!(
        buckets.iter().any(|l| l.contains("le=\"+Inf\"")),
        "{buckets:?}"
    );
    assert_eq!(health("count").len(), 1);
    assert_eq!(health("sum").len(), 1);
    assert!(!text.contains("quantile=\""), "no summaries:\n{text}");
    let rss: f64 = text
        .lines()
        .find_map(|l| l.strip_prefix("process_resident_memory_bytes "))
        .expect("process_resident_memory_bytes")
        .parse()
        .unwrap();
    assert!(rss > 1_000_000.0, "{rss}");
    s.stop().await.unwrap();
}

/// `kiln_missing_modules_total`: what programs tried to import and the image lacks, per
/// module — the measurement docs/runtimes.md tells operators to add to an image from.
#[tokio::test]
async fn a_program_that_dies_on_a_missing_import_is_counted_by_module() {
    let s = server().await;
    let r = run(&s, "py", "import numpy\nimport kiln_test_absent_py.sub\n").await;
    assert_ne!(r["code"], 0, "{r}");
    let r = run(&s, "js", "require('@kiln-test/absent-js/deep');\n").await;
    assert_ne!(r["code"], 0, "{r}");
    // the same words printed by a program that succeeds are not a failed import
    let r = run(
        &s,
        "py",
        "import sys\nprint(\"ModuleNotFoundError: No module named 'kiln_test_printed'\", file=sys.stderr)\n",
    )
    .await;
    assert_eq!(r["code"], 0, "{r}");
    let text = get(&format!("{}/metrics", s.base_url))
        .await
        .text()
        .await
        .unwrap();
    let count = |labels: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("kiln_missing_modules_total{{{labels}}} ")))
            .map(str::to_owned)
    };
    assert_eq!(
        count(r#"lang="py",ecosystem="python",module="kiln_test_absent_py""#).as_deref(),
        Some("1"),
        "{text}"
    );
    assert_eq!(
        count(r#"lang="js",ecosystem="node",module="@kiln-test/absent-js""#).as_deref(),
        Some("1"),
        "{text}"
    );
    assert!(!text.contains("kiln_test_printed"), "{text}");
    assert!(
        text.contains("# HELP kiln_missing_modules_total "),
        "{text}"
    );
    s.stop().await.unwrap();
}

#[test]
fn the_grafana_dashboard_reads_only_metrics_kiln_exports() {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/grafana/kiln.json");
    let text = std::fs::read_to_string(&path).unwrap();
    let dash: Value = serde_json::from_str(&text).expect("well-formed JSON");
    assert!(dash["title"].is_string() && dash["uid"].is_string());
    let panels = dash["panels"].as_array().expect("panels");
    let exported: Vec<&str> = kiln_api::telemetry::SERIES.iter().map(|s| s.name).collect();
    let mut read = BTreeSet::new();
    for p in panels {
        let targets = p["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "{} reads nothing", p["title"]);
        for t in targets {
            let expr = t["expr"].as_str().expect("expr");
            for name in metric_names(expr) {
                // a histogram's series
                let base = ["_bucket", "_sum", "_count"]
                    .iter()
                    .find_map(|s| name.strip_suffix(s))
                    .filter(|b| exported.contains(b))
                    .unwrap_or(&name);
                assert!(
                    exported.contains(&base),
                    "panel {} reads {name}, which Kiln does not export",
                    p["title"]
                );
                read.insert(base.to_owned());
            }
        }
    }
    // the dashboard's variable too
    for v in dash["templating"]["list"].as_array().unwrap() {
        for name in metric_names(v["query"].as_str().unwrap_or_default()) {
            assert!(exported.contains(&name.as_str()), "{name}");
        }
    }
    assert!(read.len() >= 15, "{read:?}");
    assert_eq!(
        metric_names("rate(kiln_exec_total[5m]) / max(process_open_fds)"),
        ["kiln_exec_total", "process_open_fds"]
    );
}
