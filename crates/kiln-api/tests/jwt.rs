//! LibreChat's CodeAPI token over HTTP (spec §2.2): tokens minted the way
//! LibreChat mints them (header `{alg, typ: "JWT", kid}`, its claims, its
//! `auth_context_hash`), every rejection with the contract's body, and the
//! identity as a boundary: with a token, the caller is the token's user and
//! no hint changes that.

mod common;

use std::sync::Arc;

use common::{TestServer, json, start};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use kiln_api::jwt::{JwtKeys, JwtVerifier};
use kiln_api::{ApiConfig, AuthMode};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/jwt");
const ED_KID: &str = "lc-codeapi-2026-05";
const HS_SECRET: &[u8] = b"a-development-secret-of-32-bytes!";

fn fixture(name: &str) -> String {
    std::fs::read_to_string(format!("{FIXTURES}/{name}")).unwrap()
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// LibreChat's claims for `sub` in `tenant` (`buildClaims`): TTL 300 s,
/// role `USER`, and the hash of the canonical context.
fn librechat_claims(sub: &str, tenant: &str) -> Value {
    let t = now();
    let canonical = json!({
        "chc_user_id": "", "org_id": "", "principal_source": "librechat_jwt",
        "role": "USER", "service_id": "", "sub": sub, "tenant_id": tenant,
    });
    let hash = hex::encode(Sha256::digest(canonical.to_string().as_bytes()));
    json!({
        "iss": "librechat", "aud": "codeapi", "sub": sub,
        "iat": t, "nbf": t, "exp": t + 300, "jti": "0b7f3c1e-5d1a-4a8e-9a43-2f0e6c1d9b77",
        "tenant_id": tenant, "role": "USER", "principal_source": "librechat_jwt",
        "auth_context_hash": hash,
    })
}

fn sign(alg: Algorithm, kid: Option<&str>, claims: &Value) -> String {
    let mut header = Header::new(alg);
    header.kid = kid.map(str::to_owned);
    let key = match alg {
        Algorithm::EdDSA => {
            EncodingKey::from_ed_pem(fixture("ed25519-private.pem").as_bytes()).unwrap()
        }
        Algorithm::RS256 => {
            EncodingKey::from_rsa_pem(fixture("rsa-private.pem").as_bytes()).unwrap()
        }
        Algorithm::HS256 => EncodingKey::from_secret(HS_SECRET),
        other => panic!("no test key for {other:?}"),
    };
    jsonwebtoken::encode(&header, claims, &key).unwrap()
}

/// A token LibreChat would send for `sub` (EdDSA, its default kid).
fn token(sub: &str) -> String {
    sign(
        Algorithm::EdDSA,
        Some(ED_KID),
        &librechat_claims(sub, "legacy"),
    )
}

/// The JWKS fixture (Ed25519 `lc-codeapi-2026-05`, RSA `rsa-1`) plus an
/// HS256 secret under `hs256-dev` when `hs256` is set.
fn verifier(hs256: bool) -> JwtVerifier {
    let mut keys = JwtKeys::default();
    keys.add_jwks(&fixture("jwks.json")).unwrap();
    if hs256 {
        keys.add_hs256("hs256-dev", HS_SECRET);
    }
    JwtVerifier::new(keys, "local").unwrap()
}

async fn server(mode: AuthMode, v: JwtVerifier) -> TestServer {
    start(ApiConfig {
        auth: mode,
        api_key: Some("the-shared-key".into()),
        jwt: Some(Arc::new(v)),
        ..ApiConfig::default()
    })
    .await
}

async fn exec_with(
    s: &TestServer,
    bearer: Option<&str>,
    extra: &[(&str, &str)],
) -> reqwest::Response {
    let mut req = s
        .client
        .post(s.url("/v1/exec"))
        .json(&json!({"lang": "py", "code": "print(1)", "user_id": "mallory"}));
    if let Some(t) = bearer {
        req = req.bearer_auth(t);
    }
    for (k, v) in extra {
        req = req.header(*k, *v);
    }
    req.send().await.unwrap()
}

#[tokio::test]
async fn a_librechat_token_names_the_caller_and_no_hint_changes_it() {
    let s = server(AuthMode::Jwt, verifier(false)).await;
    let r = exec_with(&s, Some(&token("alice")), &[("User-Id", "mallory")]).await;
    assert_eq!(r.status(), 200);
    let (who, _) = s.exec.last();
    assert_eq!(
        (who.tenant.as_str(), who.user_id.as_str()),
        ("legacy", "alice")
    );
}

#[tokio::test]
async fn rs256_keys_from_a_jwks_and_a_pem_directory_verify() {
    let s = server(AuthMode::Jwt, verifier(false)).await;
    let t = sign(
        Algorithm::RS256,
        Some("rsa-1"),
        &librechat_claims("bob", "t1"),
    );
    assert_eq!(exec_with(&s, Some(&t), &[]).await.status(), 200);
    assert_eq!(s.exec.last().0.user_id, "bob");

    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("rsa-2.pem"), fixture("rsa-public.pem")).unwrap();
    std::fs::write(dir.path().join("ed-2.pem"), fixture("ed25519-public.pem")).unwrap();
    let mut keys = JwtKeys::default();
    keys.add_dir(dir.path()).unwrap();
    let s = server(AuthMode::Jwt, JwtVerifier::new(keys, "local").unwrap()).await;
    let rs = sign(
        Algorithm::RS256,
        Some("rsa-2"),
        &librechat_claims("carol", "t1"),
    );
    let ed = sign(
        Algorithm::EdDSA,
        Some("ed-2"),
        &librechat_claims("dave", "t1"),
    );
    assert_eq!(exec_with(&s, Some(&rs), &[]).await.status(), 200);
    assert_eq!(exec_with(&s, Some(&ed), &[]).await.status(), 200);
    assert_eq!(s.exec.last().0.user_id, "dave");
}

#[tokio::test]
async fn every_rejection_answers_401_with_the_contract_body() {
    let s = server(AuthMode::Jwt, verifier(true)).await;
    let good = librechat_claims("alice", "legacy");
    let with = |k: &str, v: Value| {
        let mut c = good.clone();
        c[k] = v;
        c
    };
    let without = |k: &str| {
        let mut c = good.clone();
        c.as_object_mut().unwrap().remove(k);
        c
    };
    let t = now();
    let mut cases: Vec<(&str, String)> = vec![
        ("garbage", "not.a.jwt".into()),
        (
            "unknown kid",
            sign(Algorithm::EdDSA, Some("other-kid"), &good),
        ),
        ("no kid", sign(Algorithm::EdDSA, None, &good)),
        // an RSA signature under the Ed25519 key's kid
        (
            "alg against the key",
            sign(Algorithm::RS256, Some(ED_KID), &good),
        ),
        // the HMAC secret's kid with an asymmetric alg
        (
            "hs kid, eddsa",
            sign(Algorithm::EdDSA, Some("hs256-dev"), &good),
        ),
        (
            "wrong issuer",
            sign(
                Algorithm::EdDSA,
                Some(ED_KID),
                &with("iss", json!("someone")),
            ),
        ),
        (
            "wrong audience",
            sign(Algorithm::EdDSA, Some(ED_KID), &with("aud", json!("other"))),
        ),
        (
            "audience list without ours",
            sign(
                Algorithm::EdDSA,
                Some(ED_KID),
                &with("aud", json!(["a", "b"])),
            ),
        ),
        (
            "no sub",
            sign(Algorithm::EdDSA, Some(ED_KID), &without("sub")),
        ),
        (
            "sub not an id",
            sign(Algorithm::EdDSA, Some(ED_KID), &with("sub", json!("a/b"))),
        ),
        (
            "no jti",
            sign(Algorithm::EdDSA, Some(ED_KID), &without("jti")),
        ),
        (
            "jti too long",
            sign(
                Algorithm::EdDSA,
                Some(ED_KID),
                &with("jti", json!("j".repeat(257))),
            ),
        ),
        (
            "no iat",
            sign(Algorithm::EdDSA, Some(ED_KID), &without("iat")),
        ),
        (
            "no nbf",
            sign(Algorithm::EdDSA, Some(ED_KID), &without("nbf")),
        ),
        (
            "no exp",
            sign(Algorithm::EdDSA, Some(ED_KID), &without("exp")),
        ),
        (
            "expired past the skew",
            sign(
                Algorithm::EdDSA,
                Some(ED_KID),
                &with("iat", json!(t - 400)).pipe(|mut c| {
                    c["nbf"] = json!(t - 400);
                    c["exp"] = json!(t - 31);
                    c
                }),
            ),
        ),
        (
            "not yet valid",
            sign(Algorithm::EdDSA, Some(ED_KID), &with("nbf", json!(t + 60))),
        ),
        (
            "issued in the future",
            sign(
                Algorithm::EdDSA,
                Some(ED_KID),
                &with("iat", json!(t + 60)).pipe(|mut c| {
                    c["exp"] = json!(t + 120);
                    c
                }),
            ),
        ),
        (
            "lives too long",
            sign(Algorithm::EdDSA, Some(ED_KID), &with("exp", json!(t + 301))),
        ),
        (
            "unknown principal source",
            sign(
                Algorithm::EdDSA,
                Some(ED_KID),
                &with("principal_source", json!("api_key")),
            ),
        ),
        (
            "no auth context hash",
            sign(
                Algorithm::EdDSA,
                Some(ED_KID),
                &without("auth_context_hash"),
            ),
        ),
        (
            "tenant that splits keys",
            sign(
                Algorithm::EdDSA,
                Some(ED_KID),
                &with("tenant_id", json!("a:user:b")),
            ),
        ),
    ];
    // a valid token with its signature altered
    let valid = token("alice");
    let (head, sig) = valid.rsplit_once('.').unwrap();
    let flipped = if sig.starts_with('A') { "B" } else { "A" };
    cases.push(("bad signature", format!("{head}.{flipped}{}", &sig[1..])));
    // alg none, unsigned
    let b64 = |v: Value| {
        use base64::Engine as _;
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string())
    };
    cases.push((
        "alg none",
        format!(
            "{}.{}.",
            b64(json!({"alg": "none", "typ": "JWT", "kid": ED_KID})),
            b64(good.clone())
        ),
    ));
    let mut jose = Header::new(Algorithm::EdDSA);
    jose.kid = Some(ED_KID.into());
    jose.typ = Some("JOSE".into());
    let key = EncodingKey::from_ed_pem(fixture("ed25519-private.pem").as_bytes()).unwrap();
    cases.push((
        "typ not JWT",
        jsonwebtoken::encode(&jose, &good, &key).unwrap(),
    ));

    for (what, t) in &cases {
        let r = exec_with(&s, Some(t), &[]).await;
        assert_eq!(r.status(), 401, "{what}");
        assert_eq!(
            json(r).await,
            json!({"error": "Invalid bearer token"}),
            "{what}"
        );
    }
    assert_eq!(
        s.exec.call_count(),
        0,
        "no refused request reached the executor"
    );

    // no token at all (an X-API-Key is no token in this mode)
    for extra in [&[][..], &[("X-API-Key", "the-shared-key")][..]] {
        let r = exec_with(&s, None, extra).await;
        assert_eq!(r.status(), 401);
        assert_eq!(json(r).await, json!({"error": "Bearer token is required"}));
    }
    // the boundaries of the time rules pass: 30 s of skew, 300 s of life
    let edge = with("exp", json!(t + 300)).pipe(|mut c| {
        c["nbf"] = json!(t + 25);
        c["iat"] = json!(t + 25);
        c["exp"] = json!(t + 320);
        c
    });
    let r = exec_with(&s, Some(&sign(Algorithm::EdDSA, Some(ED_KID), &edge)), &[]).await;
    assert_eq!(r.status(), 200);
    // and HS256 is accepted because a secret is configured
    let hs = sign(Algorithm::HS256, Some("hs256-dev"), &good);
    assert_eq!(exec_with(&s, Some(&hs), &[]).await.status(), 200);
}

#[tokio::test]
async fn hs256_is_refused_unless_a_secret_is_configured() {
    let s = server(AuthMode::Jwt, verifier(false)).await;
    let hs = sign(
        Algorithm::HS256,
        Some("hs256-dev"),
        &librechat_claims("alice", "legacy"),
    );
    let r = exec_with(&s, Some(&hs), &[]).await;
    assert_eq!(r.status(), 401);
    assert_eq!(json(r).await, json!({"error": "Invalid bearer token"}));
}

#[tokio::test]
async fn jwt_without_a_verifier_is_a_500_misconfiguration() {
    let s = start(ApiConfig {
        auth: AuthMode::Jwt,
        ..ApiConfig::default()
    })
    .await;
    let r = exec_with(&s, Some(&token("alice")), &[]).await;
    assert_eq!(r.status(), 500);
    assert_eq!(
        json(r).await,
        json!({"error": "CodeAPI JWT auth is misconfigured"})
    );
}

#[tokio::test]
async fn api_key_or_jwt_accepts_either_and_only_the_token_is_an_identity() {
    let s = server(AuthMode::ApiKeyOrJwt, verifier(false)).await;
    // the key: identity from the request's hints, as with api-key alone
    let r = exec_with(&s, None, &[("X-API-Key", "the-shared-key")]).await;
    assert_eq!(r.status(), 200);
    assert_eq!(s.exec.last().0.user_id, "mallory");
    let r = exec_with(&s, Some("the-shared-key"), &[]).await;
    assert_eq!(r.status(), 200);
    // a token: the token's user
    assert_eq!(
        exec_with(&s, Some(&token("alice")), &[]).await.status(),
        200
    );
    assert_eq!(s.exec.last().0.user_id, "alice");
    // refusals
    let r = exec_with(&s, None, &[("X-API-Key", "wrong")]).await;
    assert_eq!(
        (r.status().as_u16(), json(r).await),
        (
            401,
            json!({"error": "Unauthorized: the API key sent does not match the server's"})
        )
    );
    let r = exec_with(&s, Some("wrong"), &[]).await;
    assert_eq!(
        (r.status().as_u16(), json(r).await),
        (401, json!({"error": "Invalid bearer token"}))
    );
    let r = exec_with(&s, None, &[]).await;
    assert_eq!(
        (r.status().as_u16(), json(r).await),
        (401, json!({"error": "Bearer token is required"}))
    );
}

#[tokio::test]
async fn with_jwt_one_user_cannot_read_list_or_delete_anothers_files() {
    let s = server(AuthMode::Jwt, verifier(false)).await;
    let (sid, fid) = s
        .seed("legacy:user:alice", "a.txt", b"alice's", "text/plain")
        .await;
    let req = |method: reqwest::Method, path: String, who: &str| {
        s.client
            .request(method, s.url(&path))
            .bearer_auth(token(who))
    };
    let paths = [
        format!("/v1/download/{sid}/{fid}"),
        format!("/v1/files/{sid}?detail=full"),
        format!("/v1/sessions/{sid}/objects/{fid}"),
    ];
    for p in &paths {
        // bob, even naming alice in every hint there is
        let hinted = format!(
            "{p}{}kind=user&id=alice",
            if p.contains('?') { "&" } else { "?" }
        );
        for path in [p.clone(), hinted] {
            let r = req(reqwest::Method::GET, path.clone(), "bob")
                .header("User-Id", "alice")
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 403, "{path}");
        }
        let r = req(reqwest::Method::GET, p.clone(), "alice")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{p}");
    }
    let r = req(
        reqwest::Method::DELETE,
        format!("/v1/files/{sid}/{fid}?kind=user&id=alice"),
        "bob",
    )
    .header("User-Id", "alice")
    .send()
    .await
    .unwrap();
    assert_eq!(r.status(), 403);
    let r = req(
        reqwest::Method::GET,
        format!("/v1/download/{sid}/{fid}"),
        "alice",
    )
    .send()
    .await
    .unwrap();
    assert_eq!(r.bytes().await.unwrap().as_ref(), b"alice's", "still there");
    // another tenant's alice is someone else
    let other = sign(
        Algorithm::EdDSA,
        Some(ED_KID),
        &librechat_claims("alice", "tenant-b"),
    );
    let r = s
        .client
        .get(s.url(&format!("/v1/download/{sid}/{fid}")))
        .bearer_auth(other)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
}

#[tokio::test]
async fn uploads_with_a_token_belong_to_the_tokens_user() {
    let s = server(AuthMode::Jwt, verifier(false)).await;
    let form = reqwest::multipart::Form::new()
        .text("kind", "user")
        .text("id", "mallory")
        .part(
            "file",
            reqwest::multipart::Part::bytes(b"x".to_vec()).file_name("x.txt"),
        );
    let r = s
        .client
        .post(s.url("/v1/upload"))
        .bearer_auth(token("alice"))
        .header("User-Id", "mallory")
        .multipart(form)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let v = json(r).await;
    let sid = kiln_core::Nanoid::parse(v["storage_session_id"].as_str().unwrap()).unwrap();
    let info = s.store.session(&sid).await.unwrap().unwrap();
    assert_eq!(info.key.as_str(), "legacy:user:alice");
}

/// `value.pipe(f)`: build a variant of a claim set in one expression.
trait Pipe: Sized {
    fn pipe(self, f: impl FnOnce(Self) -> Self) -> Self {
        f(self)
    }
}
impl Pipe for Value {}

async fn admin_get(s: &TestServer, path: &str, headers: &[(&str, &str)]) -> (u16, Value) {
    let mut req = s.client.get(s.url(path));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let r = req.send().await.unwrap();
    (r.status().as_u16(), json(r).await)
}

#[tokio::test]
async fn a_users_token_never_opens_the_operators_view() {
    let paths = ["/v1/admin/status", "/v1/admin/runs", "/v1/admin/egress"];
    for (mode, name) in [
        (AuthMode::Jwt, "jwt"),
        (AuthMode::ApiKeyOrJwt, "api-key,jwt"),
    ] {
        let s = server(mode, verifier(false)).await;
        let bearer = format!("Bearer {}", token("alice"));
        for path in paths {
            let (st, body) = admin_get(&s, path, &[("authorization", &bearer)]).await;
            assert_eq!(st, 403, "{name} {path}: {body}");
            assert_eq!(body["error"], "operator_only", "{body}");
            assert!(
                body["message"].as_str().unwrap().contains("API key"),
                "{body}"
            );
            // nothing at all: 401 as before
            let (st, _) = admin_get(&s, path, &[]).await;
            assert_eq!(st, 401, "{name} {path}");
            // the operator's key opens it, in either mode
            let (st, body) = admin_get(&s, path, &[("x-api-key", "the-shared-key")]).await;
            assert_eq!(st, 200, "{name} {path}: {body}");
        }
        // and the status names the mode it runs in
        let (_, status) = admin_get(&s, paths[0], &[("x-api-key", "the-shared-key")]).await;
        assert_eq!(status["auth"], name, "{status}");
        // a user's token still works where it belongs
        assert_eq!(
            exec_with(&s, Some(&token("alice")), &[]).await.status(),
            200
        );
    }
}

#[tokio::test]
async fn jwt_without_a_configured_key_keeps_the_operators_view_closed() {
    let s = start(ApiConfig {
        auth: AuthMode::Jwt,
        api_key: None,
        jwt: Some(Arc::new(verifier(false))),
        ..ApiConfig::default()
    })
    .await;
    let bearer = format!("Bearer {}", token("alice"));
    let (st, body) = admin_get(&s, "/v1/admin/status", &[("authorization", &bearer)]).await;
    assert_eq!(st, 403, "{body}");
    assert!(
        body["message"].as_str().unwrap().contains("set api_key"),
        "{body}"
    );
}
