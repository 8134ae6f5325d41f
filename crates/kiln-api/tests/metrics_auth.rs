//! `/metrics` behind the API key (`metrics_require_key`). Apart from
//! `metrics.rs`, whose counts its requests would change.

mod common;

use common::start_with;
use kiln_api::ApiConfig;

#[tokio::test]
async fn metrics_can_be_put_behind_the_api_key() {
    // a handle of a recorder that is not installed: the page renders, empty
    let handle = metrics_exporter_prometheus::PrometheusBuilder::new()
        .build_recorder()
        .handle();
    let config = ApiConfig {
        auth: kiln_api::AuthMode::ApiKey,
        api_key: Some("k3y-for-metrics".into()),
        metrics_require_key: true,
        ..ApiConfig::default()
    };
    let s = start_with(config, Some(handle)).await;
    let r = s.client.get(s.url("/metrics")).send().await.unwrap();
    assert_eq!(r.status(), 401, "no key");
    let r = s
        .client
        .get(s.url("/metrics"))
        .header("x-api-key", "wrong")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401, "wrong key");
    let r = s
        .client
        .get(s.url("/metrics"))
        .header("x-api-key", "k3y-for-metrics")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    // health stays open for probes
    let r = s.client.get(s.url("/health")).send().await.unwrap();
    assert_eq!(r.status(), 200);
}
