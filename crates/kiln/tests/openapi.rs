//! The OpenAPI document against the running server: it is OpenAPI 3.1,
//! every operation it lists is a route the server has (and with the method
//! it says), every route LibreChat and the seed call is in it, and every
//! schema it references exists. Under CI the document also passes an
//! independent validator (`openapi-spec-validator`, installed by
//! scripts/test.sh).

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
