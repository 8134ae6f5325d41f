//! Files through the real server: uploads injected into runs, outputs
//! harvested and downloadable at once, the walker's rules, each client
//! generation's shapes, scoping, and garbage collection.

mod common;

use common::*;
use serde_json::{Value, json};

/// Upload `name` for `user` as kind=user and return its G2/G3 ref.
async fn user_file(s: &kiln::testing::TestServer, user: &str, name: &str, bytes: &[u8]) -> Value {
    let (st, v) = upload(
        s,
        user,
        &[("kind", "user"), ("id", user)],
        name,
        bytes.to_vec(),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    json!({
        "id": v["files"][0]["fileId"],
        "storage_session_id": v["storage_session_id"],
        "resource_id": user,
        "kind": "user",
        "name": name,
    })
}

#[tokio::test]
async fn generated_files_come_back_with_nanoid_ids_and_download_at_once() {
    let s = server().await;
    let r = exec(
        &s,
        json!({"lang":"py","user_id":"alice","code":"import os\nos.makedirs('out', exist_ok=True)\nopen('out/data.csv','w').write('a,b\\n1,2\\n')\nimport matplotlib.pyplot as plt\nplt.plot([1,2,3])\nplt.savefig('chart.png')\nopen('model.pkl','wb').write(b'x')"}),
    )
    .await;
    let sid = r["session_id"].as_str().unwrap();
    let csv = file(&r, "out/data.csv");
    let png = file(&r, "chart.png");
    assert_eq!(
        r["files"].as_array().unwrap().len(),
        2,
        "pkl is not reported: {r}"
    );
    for f in [csv, png] {
        assert!(is_nanoid(&f["id"]));
        assert_eq!(f["storage_session_id"], sid);
        assert!(f.get("inherited").is_none());
    }
    let (st, bytes) = download(&s, sid, csv["id"].as_str().unwrap(), "?kind=user&id=alice").await;
    assert_eq!(st, 200);
    assert_eq!(bytes, b"a,b\n1,2\n");
    let resp = client()
        .get(format!(
            "{}/download/{sid}/{}",
            s.v1(),
            png["id"].as_str().unwrap()
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.headers()["content-type"], "image/png");
    let cd = resp.headers()["content-disposition"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(
        cd.contains("attachment") && cd.contains("chart.png"),
        "{cd}"
    );
    let body = resp.bytes().await.unwrap();
    assert_eq!(&body[..8], b"\x89PNG\r\n\x1a\n");
}

#[tokio::test]
async fn uploaded_inputs_are_materialised_and_unchanged_ones_are_inherited() {
    let s = server().await;
    let data = user_file(&s, "alice", "data/in.csv", b"x\n1\n2\n").await;
    let r = exec(
        &s,
        json!({"lang":"py","user_id":"alice","files":[data.clone()],
               "code":"import pandas as pd\ndf = pd.read_csv('data/in.csv')\nprint(df['x'].sum())"}),
    )
    .await;
    assert_eq!(r["stdout"], "3\n", "{r}");
    let f = file(&r, "data/in.csv");
    assert_eq!(f["inherited"], true);
    assert_eq!(f["id"], data["id"]);
    assert_eq!(f["storage_session_id"], data["storage_session_id"]);
}

#[tokio::test]
async fn modified_inputs_become_new_files_with_modified_from() {
    let s = server().await;
    let data = user_file(&s, "alice", "d.csv", b"x\n1\n").await;
    let r = exec(
        &s,
        json!({"lang":"bash","user_id":"alice","files":[data.clone()],"code":"echo 2 >> d.csv"}),
    )
    .await;
    let f = file(&r, "d.csv");
    assert_ne!(f["id"], data["id"]);
    assert_eq!(f["storage_session_id"], r["session_id"]);
    assert_eq!(f["modified_from"]["id"], data["id"]);
    assert_eq!(
        f["modified_from"]["storage_session_id"],
        data["storage_session_id"]
    );
    let (_, bytes) = download(
        &s,
        r["session_id"].as_str().unwrap(),
        f["id"].as_str().unwrap(),
        "",
    )
    .await;
    assert_eq!(bytes, b"x\n1\n2\n");
}

#[tokio::test]
async fn a_second_run_sees_the_first_runs_outputs_when_refs_are_resent() {
    let s = server().await;
    let r1 = exec(
        &s,
        json!({"lang":"py","user_id":"u","code":"open('a.txt','w').write('one')"}),
    )
    .await;
    let a = file(&r1, "a.txt").clone();
    let refs = json!([{ "id": a["id"], "storage_session_id": a["storage_session_id"], "name": "a.txt",
                        "kind": "user", "resource_id": "u" }]);
    let r2 = exec(
        &s,
        json!({"lang":"bash","user_id":"u","files":refs,"code":"cat a.txt"}),
    )
    .await;
    assert_eq!(r2["stdout"], "one");
    assert_eq!(file(&r2, "a.txt")["inherited"], true);
}

#[tokio::test]
async fn g1_shapes_work_end_to_end() {
    let s = server().await;
    // G1 upload: entity_id, no kind; reply carries session_id too
    let form = reqwest::multipart::Form::new()
        .text("entity_id", "agent_abc")
        .part(
            "file",
            reqwest::multipart::Part::bytes(b"hello".to_vec()).file_name("g1.txt"),
        );
    let v: Value = client()
        .post(format!("{}/upload", s.v1()))
        .header("User-Id", "bob")
        .multipart(form)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v["message"], "success");
    assert_eq!(v["session_id"], v["storage_session_id"]);
    let refs = json!([{ "id": v["files"][0]["fileId"], "session_id": v["session_id"], "name": "g1.txt",
                        "entity_id": "agent_abc" }]);
    let r = exec(
        &s,
        json!({"lang":"bash","user_id":"bob","files":refs,"code":"cat g1.txt"}),
    )
    .await;
    assert_eq!(r["stdout"], "hello", "{r}");
    let f = file(&r, "g1.txt");
    assert_eq!(f["inherited"], true);
    assert_eq!(f["entity_id"], "agent_abc");
}

/// Upload one file with exactly these form fields, and a `User-Id` header
/// only when `user` is given (community clients send none); the reply.
async fn upload_as(
    user: Option<&str>,
    s: &kiln::testing::TestServer,
    fields: &[(&str, &str)],
    name: &str,
    bytes: &[u8],
) -> Value {
    let mut form = reqwest::multipart::Form::new();
    for (k, v) in fields {
        form = form.text(k.to_string(), v.to_string());
    }
    form = form.part(
        "file",
        reqwest::multipart::Part::bytes(bytes.to_vec()).file_name(name.to_owned()),
    );
    let mut req = client().post(format!("{}/upload", s.v1())).multipart(form);
    if let Some(u) = user {
        req = req.header("User-Id", u);
    }
    let resp = req.send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["message"], "success", "{v}");
    v
}

#[tokio::test]
async fn older_librechat_reads_agent_files_through_a_top_level_entity_id() {
    let s = server().await;
    // the X-API-Key era: agent files uploaded with entity_id and User-Id
    let kb = upload_as(
        Some("bob"),
        &s,
        &[("entity_id", "agent_abc")],
        "kb.txt",
        b"agent knowledge",
    )
    .await;
    let own = upload_as(
        Some("bob"),
        &s,
        &[("entity_id", "bob")],
        "mine.txt",
        b"bob's own",
    )
    .await;
    let g1 = |v: &Value, name: &str| json!({"id": v["files"][0]["fileId"], "session_id": v["session_id"], "name": name});
    let refs = json!([g1(&kb, "kb.txt")]);
    // /exec names the agent at the top level; the refs carry no claim
    for who in [json!("bob"), Value::Null] {
        let r = exec(
            &s,
            json!({"lang":"bash","user_id":who,"entity_id":"agent_abc","files":refs,"code":"cat kb.txt"}),
        )
        .await;
        assert_eq!(r["stdout"], "agent knowledge", "user {who}: {r}");
        let f = file(&r, "kb.txt");
        assert_eq!(f["inherited"], true);
        assert_eq!(f["entity_id"], "agent_abc");
    }
    // the same refs without the top-level entity: read as a download
    // without a claim is — bob may read his tenant's agent files
    let r = exec(
        &s,
        json!({"lang":"bash","user_id":"bob","files":refs,"code":"cat kb.txt"}),
    )
    .await;
    assert_eq!(r["stdout"], "agent knowledge", "{r}");
    // bob's own upload (entity_id = his user id) next to the agent's
    let both = json!([g1(&kb, "kb.txt"), g1(&own, "mine.txt")]);
    let r = exec(
        &s,
        json!({"lang":"bash","user_id":"bob","entity_id":"agent_abc","files":both,"code":"cat mine.txt"}),
    )
    .await;
    assert_eq!(r["stdout"], "bob's own", "{r}");
    // the agent's next turn gets the previous turn's output back, by a bare
    // ref under the same top-level entity (outputs live in bob's scope)
    let r = exec(
        &s,
        json!({"lang":"bash","user_id":"bob","entity_id":"agent_abc","files":refs,"code":"wc -c < kb.txt > count.txt"}),
    )
    .await;
    let out = file(&r, "count.txt");
    let next = json!([{ "id": out["id"], "session_id": r["session_id"], "name": "count.txt" }]);
    let r = exec(
        &s,
        json!({"lang":"bash","user_id":"bob","entity_id":"agent_abc","files":next,"code":"cat count.txt"}),
    )
    .await;
    assert_eq!(r["stdout"], "15\n", "{r}");
    // another identified user gets neither bob's own file by a bare ref
    // nor by claiming it through entity_id
    let mine = json!([g1(&own, "mine.txt")]);
    for body in [
        json!({"lang":"bash","user_id":"mallory","files":mine,"code":"cat mine.txt"}),
        json!({"lang":"bash","user_id":"mallory","entity_id":"bob","files":mine,"code":"cat mine.txt"}),
        json!({"lang":"bash","user_id":"mallory","entity_id":"agent_abc","files":mine,"code":"cat mine.txt"}),
    ] {
        let (st, v) = exec_raw(&s, body.clone()).await;
        assert_eq!(st, 403, "{body}: {v}");
        assert_eq!(v["error"], "Unauthorized file reference");
    }
}

#[tokio::test]
async fn community_clients_without_identity_read_files_by_reference() {
    let s = server().await;
    // no identity anywhere: no User-Id, no kind, no user_id
    let up = upload_as(None, &s, &[], "data.csv", b"a,b\n1,2\n").await;
    let refs = json!([{ "id": up["files"][0]["fileId"], "storage_session_id": up["storage_session_id"], "name": "data.csv" }]);
    let r = exec(
        &s,
        json!({"lang":"bash","files":refs,"code":"cat data.csv"}),
    )
    .await;
    assert_eq!(r["stdout"], "a,b\n1,2\n", "{r}");
    assert_eq!(file(&r, "data.csv")["inherited"], true);
    // ids are capabilities for identity-less callers (as for downloads
    // without a claim), so they read what LibreChat uploaded for a user
    let alice = user_file(&s, "alice", "a.txt", b"alice's").await;
    let bare = json!([{ "id": alice["id"], "storage_session_id": alice["storage_session_id"], "name": "a.txt" }]);
    let r = exec(&s, json!({"lang":"bash","files":bare,"code":"cat a.txt"})).await;
    assert_eq!(r["stdout"], "alice's", "{r}");
    // an identified caller does not: the same bare ref is refused to bob
    let (st, v) = exec_raw(
        &s,
        json!({"lang":"bash","user_id":"bob","files":bare,"code":"cat a.txt"}),
    )
    .await;
    assert_eq!(st, 403, "{v}");
    assert_eq!(v["error"], "Unauthorized file reference");
}

#[tokio::test]
async fn with_require_identity_an_identity_less_bare_ref_is_refused() {
    let s = server_with(|c| c.require_identity = true).await;
    let alice = user_file(&s, "alice", "a.txt", b"alice's").await;
    let bare = json!([{ "id": alice["id"], "storage_session_id": alice["storage_session_id"], "name": "a.txt" }]);
    let (st, v) = exec_raw(&s, json!({"lang":"bash","files":bare,"code":"cat a.txt"})).await;
    assert_eq!(st, 401, "{v}");
    // alice herself, with the same bare ref, reads it
    let r = exec(
        &s,
        json!({"lang":"bash","user_id":"alice","files":bare,"code":"cat a.txt"}),
    )
    .await;
    assert_eq!(r["stdout"], "alice's", "{r}");
}

#[tokio::test]
async fn with_jwt_a_user_cannot_mount_anothers_files_whatever_the_ref_claims() {
    let s = server_with(|c| {
        c.auth = Some("jwt".into());
        c.jwt_hs256_secret = Some("integration-test-secret".into());
    })
    .await;
    let post = |body: Value, who: &str| {
        client()
            .post(format!("{}/exec", s.v1()))
            .bearer_auth(codeapi_token(who))
            .json(&body)
            .send()
    };
    let form = reqwest::multipart::Form::new().text("kind", "user").part(
        "file",
        reqwest::multipart::Part::bytes(b"alice's".to_vec()).file_name("a.txt"),
    );
    let up: Value = client()
        .post(format!("{}/upload", s.v1()))
        .bearer_auth(codeapi_token("alice"))
        .multipart(form)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(up["message"], "success", "{up}");
    let (id, sid) = (
        up["files"][0]["fileId"].clone(),
        up["storage_session_id"].clone(),
    );
    let refs = [
        json!({"id": id, "storage_session_id": sid, "name": "a.txt"}),
        json!({"id": id, "storage_session_id": sid, "name": "a.txt", "kind": "user", "resource_id": "alice"}),
        json!({"id": id, "session_id": sid, "name": "a.txt", "entity_id": "alice"}),
    ];
    for r in &refs {
        let body = json!({"lang": "bash", "user_id": "alice", "files": [r], "code": "cat a.txt"});
        let resp = post(body.clone(), "bob").await.unwrap();
        assert_eq!(resp.status(), 403, "{r}");
        let v: Value = resp.json().await.unwrap();
        assert_eq!(v["error"], "Unauthorized file reference");
        let resp = post(body, "alice").await.unwrap();
        assert_eq!(resp.status(), 200, "{r}");
        let v: Value = resp.json().await.unwrap();
        assert_eq!(v["stdout"], "alice's", "{r}");
    }
    // and without a token nothing runs
    let (st, _) = exec_raw(&s, json!({"lang": "bash", "code": "echo hi"})).await;
    assert_eq!(st, 401);
}

#[tokio::test]
async fn read_only_inputs_cannot_be_changed_and_are_echoed_as_inherited() {
    let s = server().await;
    let form = reqwest::multipart::Form::new()
        .text("kind", "skill")
        .text("id", "skill1")
        .text("version", "3")
        .text("read_only", "true")
        .part(
            "file",
            reqwest::multipart::Part::bytes(b"# skill".to_vec()).file_name("pptx/SKILL.md"),
        )
        .part(
            "file",
            reqwest::multipart::Part::bytes(Vec::new()).file_name("pptx/__init__.py"),
        );
    let v: Value = client()
        .post(format!("{}/upload/batch", s.v1()))
        .header("User-Id", "carol")
        .multipart(form)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v["message"], "success", "{v}");
    let sid = v["storage_session_id"].clone();
    let refs: Vec<Value> = v["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            json!({"id": f["fileId"], "storage_session_id": sid, "name": f["filename"],
                        "kind": "skill", "resource_id": "skill1", "version": 3})
        })
        .collect();
    let r = exec(
        &s,
        json!({"lang":"bash","user_id":"dave","files":refs,
               "code":"cat pptx/SKILL.md; echo; wc -c < pptx/__init__.py; echo hacked > pptx/SKILL.md && echo WROTE || echo DENIED"}),
    )
    .await;
    assert_eq!(r["stdout"], "# skill\n0\nDENIED\n", "{r}");
    assert_eq!(file(&r, "pptx/SKILL.md")["inherited"], true);
}

#[tokio::test]
async fn deleted_inputs_and_empty_directories_are_reported() {
    let s = server().await;
    let gone = user_file(&s, "u", "gone.txt", b"bye").await;
    let r = exec(&s, json!({"lang":"bash","user_id":"u","files":[gone],"code":"rm gone.txt; mkdir -p empty/dir"})).await;
    assert_eq!(r["deleted_files"], json!(["gone.txt"]), "{r}");
    let marker = file(&r, "empty/dir/.dirkeep");
    assert!(is_nanoid(&marker["id"]));
}

#[tokio::test]
async fn symlinks_in_the_workspace_never_leak_host_files() {
    let s = server().await;
    let r = run(&s, "bash", "ln -s /etc/shadow shadow.txt; ln -s / root.txt; ln /etc/hostname hard.txt 2>/dev/null; echo ok").await;
    assert_eq!(r["stdout"], "ok\n");
    let names: Vec<&str> = r["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["name"].as_str().unwrap())
        .collect();
    assert!(
        !names.contains(&"shadow.txt") && !names.contains(&"root.txt"),
        "{r}"
    );
    // a hard link could only point at a file inside the jail's own view
    for f in r["files"].as_array().unwrap() {
        let (_, bytes) = download(
            &s,
            r["session_id"].as_str().unwrap(),
            f["id"].as_str().unwrap(),
            "",
        )
        .await;
        assert!(
            !String::from_utf8_lossy(&bytes).contains("root:"),
            "leaked host file"
        );
    }
}

#[tokio::test]
async fn another_users_files_cannot_be_read_or_injected() {
    let s = server().await;
    let secret = user_file(&s, "alice", "secret.txt", b"alice's").await;
    // mallory references alice's upload in her own run
    let mut stolen = secret.clone();
    stolen["resource_id"] = json!("mallory");
    let (st, v) = exec_raw(
        &s,
        json!({"lang":"bash","user_id":"mallory","files":[stolen],"code":"cat secret.txt"}),
    )
    .await;
    assert_eq!(st, 403, "{v}");
    assert_eq!(v["error"], "Unauthorized file reference");
    // and cannot download it while identifying as herself
    let sid = secret["storage_session_id"].as_str().unwrap();
    let fid = secret["id"].as_str().unwrap();
    let (st, _) = download(&s, sid, fid, "?kind=user&id=mallory").await;
    assert_eq!(st, 403);
    let (st, body) = download(&s, sid, fid, "?kind=user&id=alice").await;
    assert_eq!((st, body), (200, b"alice's".to_vec()));
}

#[tokio::test]
async fn agent_files_are_shared_with_every_user() {
    let s = server().await;
    let (st, v) = upload(
        &s,
        "owner",
        &[("kind", "agent"), ("id", "agent_1")],
        "kb.txt",
        b"shared".to_vec(),
    )
    .await;
    assert_eq!(st, 200);
    let refs = json!([{ "id": v["files"][0]["fileId"], "storage_session_id": v["storage_session_id"],
                        "name": "kb.txt", "kind": "agent", "resource_id": "agent_1" }]);
    let r = exec(
        &s,
        json!({"lang":"bash","user_id":"someone-else","files":refs,"code":"cat kb.txt"}),
    )
    .await;
    assert_eq!(r["stdout"], "shared");
}

#[tokio::test]
async fn malformed_refs_are_rejected_before_running() {
    let s = server().await;
    for bad in [
        json!({"id":"short","storage_session_id":"V1StGXR8_Z5jdHi6B-myT","name":"a.txt","kind":"user","resource_id":"u"}),
        json!({"id":"V1StGXR8_Z5jdHi6B-myT","storage_session_id":"V1StGXR8_Z5jdHi6B-myT","name":"../a.txt","kind":"user","resource_id":"u"}),
        json!({"id":"V1StGXR8_Z5jdHi6B-myT","storage_session_id":"V1StGXR8_Z5jdHi6B-myT","name":"/etc/passwd","kind":"user","resource_id":"u"}),
        json!({"id":"V1StGXR8_Z5jdHi6B-myT","storage_session_id":"V1StGXR8_Z5jdHi6B-myT","name":"a.txt","kind":"martian","resource_id":"u"}),
    ] {
        let (st, v) = exec_raw(&s, json!({"lang":"bash","code":"echo ran","files":[bad]})).await;
        assert_eq!(st, 400, "{v}");
    }
    // a well-formed ref to nothing is refused, not run
    let ghost = json!({"id":"V1StGXR8_Z5jdHi6B-myT","storage_session_id":"V1StGXR8_Z5jdHi6B-myU","name":"a.txt","kind":"user","resource_id":"u"});
    let (st, _) = exec_raw(&s, json!({"lang":"bash","code":"echo ran","files":[ghost]})).await;
    assert_eq!(st, 403);
}

#[tokio::test]
async fn expired_files_are_garbage_collected() {
    let s = server_with(|c| {
        c.retention_hours = 0;
        c.gc_interval_secs = 1;
    })
    .await;
    let f = user_file(&s, "u", "old.txt", b"old").await;
    tokio::time::sleep(std::time::Duration::from_millis(2500)).await;
    let sid = f["storage_session_id"].as_str().unwrap();
    let r = client()
        .get(format!("{}/files/{sid}?detail=summary", s.v1()))
        .send()
        .await
        .unwrap();
    let st = r.status().as_u16();
    let listed: Value = r.json().await.unwrap_or(Value::Null);
    assert!(
        st == 404 || listed == json!([]),
        "still listed: {st} {listed}"
    );
    let blobs = walk_files(&s.data_dir.path().join("store"));
    assert!(
        blobs.iter().all(|p| !p.contains(f["id"].as_str().unwrap())),
        "blob kept: {blobs:?}"
    );
}

fn walk_files(dir: &std::path::Path) -> Vec<String> {
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                out.extend(walk_files(&p));
            } else {
                out.push(p.display().to_string());
            }
        }
    }
    out
}
