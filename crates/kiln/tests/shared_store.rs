//! The server on Postgres + S3 (the servers `kiln-store`'s tests start:
//! a throwaway Postgres cluster and moto's S3 server on loopback): upload,
//! exec with the file, download, list and delete over HTTP, with nothing
//! kept in the data dir's store.

mod common;
#[path = "../../kiln-store/tests/support/servers.rs"]
mod servers;

use common::*;
use serde_json::{Value, json};

#[tokio::test]
async fn upload_exec_download_list_and_delete_on_postgres_and_s3() {
    let (Some(pg), Some(s3)) = (servers::postgres(), servers::s3()) else {
        return;
    };
    let url = pg.fresh_database();
    let bucket = s3.fresh_bucket();
    let s = server_with(|c| {
        c.database_url = Some(url.clone());
        c.s3_bucket = Some(bucket.clone());
        c.s3_endpoint = Some(s3.endpoint.clone());
        c.s3_region = Some("us-east-1".into());
        c.s3_path_style = true;
        c.s3_access_key_id = Some("kiln-test".into());
        c.s3_secret_access_key = Some("kiln-test-secret".into());
    })
    .await;
    assert_eq!(
        (s.store.metadata_backend(), s.store.blob_backend()),
        ("postgres", "s3")
    );

    // upload
    let (st, up) = upload(
        &s,
        "alice",
        &[("kind", "user"), ("id", "alice")],
        "in.csv",
        b"x\n1\n2\n".to_vec(),
    )
    .await;
    assert_eq!(st, 200, "{up}");
    let input = json!({
        "id": up["files"][0]["fileId"],
        "storage_session_id": up["storage_session_id"],
        "resource_id": "alice",
        "kind": "user",
        "name": "in.csv",
    });

    // exec with the file: staged from S3, output stored back
    let r = exec(
        &s,
        json!({"lang":"py","user_id":"alice","files":[input.clone()],
               "code":"rows = open('in.csv').read().split()\nprint(sum(int(v) for v in rows[1:]))\nopen('out.txt','w').write('sum=' + str(sum(int(v) for v in rows[1:])))"}),
    )
    .await;
    assert_eq!(r["stdout"], "3\n", "{r}");
    let out = file(&r, "out.txt");
    let sid = r["session_id"].as_str().unwrap();

    // download
    let (st, bytes) = download(&s, sid, out["id"].as_str().unwrap(), "?kind=user&id=alice").await;
    assert_eq!(st, 200);
    assert_eq!(bytes, b"sum=3");
    let upload_sid = input["storage_session_id"].as_str().unwrap();
    let upload_id = input["id"].as_str().unwrap();
    let (st, bytes) = download(&s, upload_sid, upload_id, "?kind=user&id=alice").await;
    assert_eq!(st, 200);
    assert_eq!(bytes, b"x\n1\n2\n");

    // list
    let list = |session: String| {
        let url = format!("{}/files/{session}?detail=summary", s.v1());
        async move {
            let r = client()
                .get(url)
                .header("User-Id", "alice")
                .send()
                .await
                .unwrap();
            (
                r.status().as_u16(),
                r.json::<Value>().await.unwrap_or(Value::Null),
            )
        }
    };
    let (st, listed) = list(upload_sid.to_owned()).await;
    assert_eq!(st, 200, "{listed}");
    assert_eq!(listed.as_array().map(Vec::len), Some(1), "{listed}");

    // delete, then it is gone from the listing and the download
    let r = client()
        .delete(format!("{}/files/{upload_sid}/{upload_id}", s.v1()))
        .header("User-Id", "alice")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let (_, listed) = list(upload_sid.to_owned()).await;
    assert!(
        listed.as_array().is_none_or(Vec::is_empty),
        "still listed: {listed}"
    );
    let (st, _) = download(&s, upload_sid, upload_id, "?kind=user&id=alice").await;
    assert_eq!(st, 404);

    // the rows are in Postgres, no byte in the data dir's store
    let db = url.rsplit('/').next().unwrap();
    assert_eq!(pg.psql(db, "SELECT count(*) FROM objects").trim(), "1");
    assert!(!s.data_dir.path().join("store").join("blobs").exists());
    assert!(!s.data_dir.path().join("store").join("kiln.db").exists());
}

#[tokio::test]
async fn with_the_bucket_unreachable_uploads_and_outputs_fail_quickly_and_store_nothing() {
    let Some(pg) = servers::postgres() else {
        return;
    };
    let url = pg.fresh_database();
    // a port nothing listens on: every S3 request is refused
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let s = server_with(|c| {
        c.database_url = Some(url.clone());
        c.s3_bucket = Some("gone".into());
        c.s3_endpoint = Some(format!("http://127.0.0.1:{closed}"));
        c.s3_region = Some("us-east-1".into());
        c.s3_path_style = true;
        c.s3_access_key_id = Some("kiln-test".into());
        c.s3_secret_access_key = Some("kiln-test-secret".into());
    })
    .await;

    let started = std::time::Instant::now();
    let (st, v) = upload(
        &s,
        "alice",
        &[("kind", "user"), ("id", "alice")],
        "in.csv",
        b"x\n1\n".to_vec(),
    )
    .await;
    assert!(st >= 500, "{st} {v}");
    assert!(
        v.get("error").is_some() || v.get("message").is_some(),
        "{v}"
    );
    let took = started.elapsed();
    assert!(took < std::time::Duration::from_secs(30), "{took:?}");

    // a run still runs; its output is not kept and not offered
    let r = exec(
        &s,
        json!({"lang":"py","user_id":"alice","code":"open('out.txt','w').write('x')\nprint('ran')"}),
    )
    .await;
    assert_eq!(r["stdout"], "ran\n", "{r}");
    let offered = r["files"].as_array().cloned().unwrap_or_default();
    assert!(
        offered.iter().all(|f| f["name"] != "out.txt"),
        "an output that was never stored is offered: {r}"
    );

    let db = url.rsplit('/').next().unwrap();
    assert_eq!(pg.psql(db, "SELECT count(*) FROM objects").trim(), "0");
}
