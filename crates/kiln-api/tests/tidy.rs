//! Tidy tests: structural invariants of ARCHITECTURE.md checked
//! mechanically (in the spirit of rust-analyzer's tidy tests).

mod common;

use std::sync::Arc;

use axum::http::Method;
use kiln_api::kit::routes::{ROUTES, by_template};
use kiln_api::kit::{Mount, Route};
use kiln_api::{ApiConfig, AppState};

/// The documented operations (path, method) of a router's OpenAPI half.
fn operations(doc: &utoipa::openapi::OpenApi) -> Vec<(String, Method)> {
    let value = serde_json::to_value(doc).unwrap();
    let mut ops = Vec::new();
    for (path, item) in value["paths"].as_object().unwrap() {
        for (m, method) in [
            ("get", Method::GET),
            ("post", Method::POST),
            ("put", Method::PUT),
            ("delete", Method::DELETE),
            ("patch", Method::PATCH),
        ] {
            if item.get(m).is_some() {
                ops.push((path.clone(), method));
            }
        }
    }
    ops
}

fn declared(route: &Route) -> (String, Method) {
    (route.path.to_owned(), route.verb.method())
}

#[tokio::test]
async fn every_documented_route_is_declared_with_its_rate_class_and_affinity() {
    let dir = tempfile::tempdir().unwrap();
    let store = kiln_store::Store::open(kiln_store::StoreConfig {
        dir: dir.path().to_path_buf(),
        retention: std::time::Duration::from_secs(3600),
        budget: Default::default(),
    })
    .await
    .unwrap();
    let exec = Arc::new(common::RecordingExec::new());
    let state = AppState::new(store, exec, ApiConfig::default(), common::health_info());
    let (_, api) = kiln_api::api_routes(&state).split_for_parts();
    let (_, root) = kiln_api::root_routes(&state).split_for_parts();
    for (mount, doc) in [(Mount::Api, &api), (Mount::Root, &root)] {
        let served = operations(doc);
        for (path, method) in &served {
            let route = by_template(method, path).unwrap_or_else(|| {
                panic!("{method} {path} is served without a declared rate class")
            });
            assert_eq!(
                route.mount, mount,
                "{method} {path} is declared on another mount"
            );
        }
        for route in ROUTES.iter().filter(|r| r.mount == mount) {
            let documented = served.contains(&declared(route));
            // the console's pages, `/v1/openapi.json` and seed 004's routes
            // are not in the document: probed below
            assert!(
                documented || mount == Mount::Root,
                "{route:?} is declared but not served"
            );
        }
    }
}

/// A concrete path for a template (an id where one is expected).
fn concrete(template: &str) -> String {
    template
        .split('/')
        .map(|s| match s {
            "{asset}" => "index.html",
            s if s.starts_with("{*") => "a.txt",
            s if s.starts_with('{') => "V1StGXR8_Z5jdHi6B-myT",
            s => s,
        })
        .collect::<Vec<_>>()
        .join("/")
}

#[tokio::test]
async fn every_declared_route_is_served() {
    // the default configuration turns every face on; `/metrics` needs a
    // recorder
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let s = common::start_with(ApiConfig::default(), Some(recorder.handle())).await;
    let probe = |method: Method, path: String| {
        let req = s.client.request(method, s.url(&path));
        async move {
            let r = req.send().await.unwrap();
            let status = r.status();
            // only a 404's body tells the fallback from a handler's (a
            // route may stream without end)
            let body = if status == 404 {
                r.text().await.unwrap()
            } else {
                String::new()
            };
            (status, body)
        }
    };
    let unknown = probe(Method::GET, "/no/such/route".into()).await;
    assert_eq!(unknown.0, 404);
    for route in ROUTES {
        let path = match route.mount {
            Mount::Api => format!("/v1{}", concrete(route.path)),
            Mount::Root => concrete(route.path),
            Mount::Runtime => format!("/runtime{}", concrete(route.path)),
        };
        let answer = probe(route.verb.method(), path.clone()).await;
        assert_ne!(answer, unknown, "{route:?}: {path} is not served");
        assert_ne!(
            answer.0, 405,
            "{route:?}: {path} is not served with its method"
        );
    }
}
