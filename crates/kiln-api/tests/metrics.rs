//! HTTP metrics: counters per route template and status, latency
//! histogram, rendered on `/metrics`. Alone in its binary because it installs
//! the process-global recorder.

mod common;

use common::start_with;
use kiln_api::ApiConfig;

#[tokio::test]
async fn metrics_count_requests_per_route_template_and_status() {
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    metrics::set_global_recorder(recorder).expect("only this test installs a recorder");
    let s = start_with(ApiConfig::default(), Some(handle)).await;
    s.client.get(s.url("/v1/health")).send().await.unwrap();
    s.client.get(s.url("/health")).send().await.unwrap();
    s.client
        .get(s.url("/v1/download/x/y"))
        .send()
        .await
        .unwrap();
    s.client
        .get(s.url("/v1/no-such-route"))
        .send()
        .await
        .unwrap();
    let r = s.client.get(s.url("/metrics")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert!(
        r.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/plain")
    );
    let text = r.text().await.unwrap();
    assert!(
        text.contains(r#"kiln_http_requests_total{route="/health",status="200"} 2"#),
        "{text}"
    );
    assert!(
        text.contains(
            r#"kiln_http_requests_total{route="/download/{session_id}/{file_id}",status="400"} 1"#
        ),
        "{text}"
    );
    assert!(
        text.contains(r#"kiln_http_requests_total{route="unmatched",status="404"} 1"#),
        "{text}"
    );
    assert!(
        text.contains("kiln_http_request_duration_seconds"),
        "{text}"
    );
}
