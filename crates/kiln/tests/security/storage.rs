//! Storage budgets: sparse files cost a jail nothing but are stored at
//! their full length, so what one run, one user, or everyone together may
//! leave in the store is bounded — past a budget outputs are skipped and
//! reported, uploads get 507, and the disk never fills.

use crate::*;

/// Writes `n` sparse files of `mib` MiB each (a second of work for the
/// program, `n × mib` MiB for the store).
fn sparse(n: u32, mib: u32) -> String {
    format!(
        "import os\nfor i in range({n}):\n    \
         with open('/mnt/data/sparse_%02d.csv' % i, 'wb') as f:\n        \
         f.truncate({mib} * 1024 * 1024)\nprint('made', {n})"
    )
}

fn new_outputs(r: &Value) -> Vec<&Value> {
    r["files"]
        .as_array()
        .map(|a| a.iter().filter(|f| f["inherited"] != true).collect())
        .unwrap_or_default()
}

#[tokio::test]
async fn sparse_outputs_are_capped_by_the_runs_output_total_and_reported() {
    // the shared server keeps at most 20 MiB of outputs per run
    let r = attack("py", &sparse(40, 9)).await;
    assert_eq!(out(&r), "made 40\n", "{r}");
    let kept = new_outputs(&r);
    assert_eq!(kept.len(), 2, "two 9 MiB files fit in 20 MiB: {r}");
    let t = &r["artifact_truncation"];
    assert_eq!(t["reasons"]["storage"], 38, "{r}");
    assert_eq!(t["skipped_count"], 38, "{r}");
    assert!(
        r["stderr"]
            .as_str()
            .unwrap()
            .contains("38 output file(s) not kept"),
        "the reader is told: {r}"
    );
    // what was kept is whole
    let s = shared();
    let f = kept[0];
    let got = client()
        .get(format!(
            "{}/download/{}/{}",
            s.v1,
            f["storage_session_id"].as_str().unwrap(),
            f["id"].as_str().unwrap()
        ))
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    assert_eq!(got.len(), 9 * 1024 * 1024);
    assert_healthy().await;
}

async fn upload_as(s: &kiln::testing::TestServer, user: &str, kib: usize) -> (u16, Value) {
    common::upload(s, user, &[], "blob.bin", vec![7u8; kib * 1024]).await
}

#[tokio::test]
async fn a_users_quota_refuses_uploads_with_507_and_keeps_outputs_out_but_not_others() {
    let s = common::server_with(|c| {
        c.user_storage_mb = 1;
        c.warm_jails = 0;
    })
    .await;
    let (st, first) = upload_as(&s, "hoarder", 600).await;
    assert_eq!(st, 200, "{first}");
    let (st, v) = upload_as(&s, "hoarder", 600).await;
    assert_eq!(st, 507, "{v}");
    assert!(v["error"].as_str().unwrap().contains("quota"), "{v}");
    // another user is not affected
    let (st, v) = upload_as(&s, "neighbour", 600).await;
    assert_eq!(st, 200, "{v}");
    // the hoarder's outputs are kept out too, and reported
    let r = common::exec(
        &s,
        json!({"lang": "py", "user_id": "hoarder",
               "code": "open('/mnt/data/out.csv','wb').write(b'x' * 600 * 1024)\nprint('ok')"}),
    )
    .await;
    assert_eq!(r["stdout"], "ok\n");
    assert!(new_outputs(&r).is_empty(), "{r}");
    assert_eq!(r["artifact_truncation"]["reasons"]["storage"], 1, "{r}");
    // small outputs still fit in what is left
    let r = common::exec(
        &s,
        json!({"lang": "py", "user_id": "hoarder",
               "code": "open('/mnt/data/small.txt','w').write('hi')"}),
    )
    .await;
    assert_eq!(new_outputs(&r).len(), 1, "{r}");
    // deleting frees the quota
    let sid = first["storage_session_id"].as_str().unwrap();
    let fid = first["files"][0]["fileId"].as_str().unwrap();
    let del = common::client()
        .delete(format!("{}/files/{sid}/{fid}", s.v1()))
        .header("User-Id", "hoarder")
        .send()
        .await
        .unwrap();
    assert!(del.status().is_success(), "{}", del.status());
    let (st, v) = upload_as(&s, "hoarder", 600).await;
    assert_eq!(st, 200, "{v}");
    s.stop().await.unwrap();
}

/// A user over the quota keeps uploading: each file is refused with 507 (a
/// batch's per file), and the session a batch answers exists, empty — the
/// same whether the refusal came after the bytes were written (the first
/// time) or cut them at what was left (every time after).
#[tokio::test]
async fn a_user_over_the_quota_gets_refusals_and_an_empty_session_every_time() {
    let s = common::server_with(|c| {
        c.user_storage_mb = 1;
        c.warm_jails = 0;
    })
    .await;
    let (st, v) = upload_as(&s, "hoarder", 900).await;
    assert_eq!(st, 200, "{v}");
    for round in 0..3 {
        let (st, v) = upload_as(&s, "hoarder", 600).await;
        assert_eq!(st, 507, "round {round}: {v}");
        let form = reqwest::multipart::Form::new()
            .part(
                "files",
                reqwest::multipart::Part::bytes(vec![1u8; 300 * 1024]).file_name("a.bin"),
            )
            .part(
                "files",
                reqwest::multipart::Part::bytes(vec![2u8; 300 * 1024]).file_name("b.bin"),
            );
        let v = common::json_of(
            common::client()
                .post(format!("{}/upload/batch", s.v1()))
                .header("User-Id", "hoarder")
                .multipart(form),
        )
        .await;
        assert_eq!(v["failed"], 2, "round {round}: {v}");
        let sid = v["storage_session_id"].as_str().unwrap();
        let (st, files) = common::status_json(
            common::client()
                .get(format!("{}/files/{sid}", s.v1()))
                .header("User-Id", "hoarder"),
        )
        .await;
        assert_eq!(st, 200, "round {round}");
        assert_eq!(files, json!([]), "round {round}");
    }
    s.stop().await.unwrap();
}

#[tokio::test]
async fn below_the_free_space_floor_nothing_is_stored_and_the_service_goes_on() {
    // a floor no disk can meet: every non-empty file is refused
    let s = common::server_with(|c| {
        c.min_free_disk_mb = u64::MAX / 4;
        c.warm_jails = 0;
    })
    .await;
    let (st, v) = upload_as(&s, "someone", 4).await;
    assert_eq!(st, 507, "{v}");
    assert!(
        v["error"]
            .as_str()
            .unwrap()
            .contains("Insufficient storage"),
        "{v}"
    );
    // a batch reports it per file
    let form = reqwest::multipart::Form::new().part(
        "files",
        reqwest::multipart::Part::bytes(vec![1u8; 1024]).file_name("a.bin"),
    );
    let r = common::client()
        .post(format!("{}/upload/batch", s.v1()))
        .header("User-Id", "someone")
        .multipart(form)
        .send()
        .await
        .unwrap();
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["failed"], 1, "{v}");
    assert!(
        v["files"][0]["error"]
            .as_str()
            .unwrap()
            .contains("Insufficient"),
        "{v}"
    );
    // runs still run; their outputs are reported as not kept
    let r = common::exec(
        &s,
        json!({"lang": "py", "user_id": "someone",
               "code": "open('/mnt/data/o.txt','w').write('x')\nprint('ran')"}),
    )
    .await;
    assert_eq!(r["stdout"], "ran\n");
    assert!(new_outputs(&r).is_empty(), "{r}");
    assert_eq!(r["artifact_truncation"]["reasons"]["storage"], 1, "{r}");
    let h = common::client()
        .get(format!("{}/health", s.v1()))
        .send()
        .await
        .unwrap();
    assert_eq!(h.status(), 200);
    s.stop().await.unwrap();
}
