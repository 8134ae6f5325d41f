//! The benchmark's HTTP client for Kiln's LibreChat API: `POST /v1/exec`,
//! `POST /v1/upload`, `GET /metrics`, each timed from sending the request to
//! having the whole response body. One pooled `reqwest::Client` is shared
//! by every simulated user.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde::Deserialize;
use serde_json::{Value, json};

/// One output file of an execution.
#[derive(Debug, Clone, Deserialize)]
pub struct OutFile {
    #[serde(default)]
    pub name: String,
}

/// The parts of an `/exec` response the scenarios check.
#[derive(Debug, Clone, Deserialize)]
pub struct ExecResponse {
    #[serde(default)]
    pub stdout: String,
    #[serde(default)]
    pub stderr: String,
    #[serde(default)]
    pub files: Vec<OutFile>,
}

/// A stored upload: where `/exec` finds it.
#[derive(Debug, Clone)]
pub struct Uploaded {
    pub storage_session_id: String,
    pub file_id: String,
}

/// A by-reference input for an `/exec` body (LibreChat's current shape).
pub fn file_ref(up: &Uploaded, name: &str, resource_id: &str) -> Value {
    json!({
        "id": up.file_id,
        "storage_session_id": up.storage_session_id,
        "name": name,
        "kind": "user",
        "resource_id": resource_id,
    })
}

/// Talks to one server.
#[derive(Clone)]
pub struct KilnClient {
    http: reqwest::Client,
    /// `http://host:port/v1`.
    v1: String,
    /// `http://host:port`.
    origin: String,
}

impl KilnClient {
    pub fn new(http: reqwest::Client, origin: &str) -> KilnClient {
        KilnClient {
            http,
            v1: format!("{origin}/v1"),
            origin: origin.to_owned(),
        }
    }

    /// The same server through another HTTP client (e.g. one that keeps no
    /// idle connection, so every request opens a new one).
    pub fn with_http(&self, http: reqwest::Client) -> KilnClient {
        KilnClient {
            http,
            v1: self.v1.clone(),
            origin: self.origin.clone(),
        }
    }

    /// POST `body` as JSON to `url` and parse the answer's JSON, timed
    /// send → full body; a status `ok` refuses is an error, as is an answer
    /// that is not a `T`.
    async fn post_json<T: serde::de::DeserializeOwned>(
        &self,
        url: String,
        body: &Value,
        ok: impl Fn(reqwest::StatusCode) -> bool,
    ) -> anyhow::Result<(Duration, T)> {
        let what = format!("POST {}", url.strip_prefix(&self.origin).unwrap_or(&url));
        let t = Instant::now();
        let r = self
            .http
            .post(&url)
            .json(body)
            .send()
            .await
            .with_context(|| what.clone())?;
        let status = r.status();
        let bytes = r
            .bytes()
            .await
            .with_context(|| format!("{what}: read the answer"))?;
        let took = t.elapsed();
        if !ok(status) {
            bail!("{what}: HTTP {status}: {}", snippet(&bytes));
        }
        let v = serde_json::from_slice(&bytes)
            .with_context(|| format!("{what}: unexpected answer: {}", snippet(&bytes)))?;
        Ok((took, v))
    }

    /// Run `body` through `/v1/exec`; the duration covers send → full body.
    pub async fn exec(&self, body: &Value) -> anyhow::Result<(Duration, ExecResponse)> {
        let url = format!("{}/exec", self.v1);
        self.post_json(url, body, |s| s.is_success()).await
    }

    /// Evaluate `code` in `user`'s live kernel through seed 004's face
    /// (`POST /api/v1/execute?user_uuid=`); its `result_text`, timed send →
    /// full body.
    pub async fn stateful(&self, user: &str, code: &str) -> anyhow::Result<(Duration, String)> {
        let url = format!("{}/api/v1/execute?user_uuid={user}", self.origin);
        let (took, v): (Duration, Value) = self
            .post_json(url, &json!({ "code": code }), |s| s.is_success())
            .await?;
        Ok((
            took,
            v["result_text"].as_str().unwrap_or_default().to_owned(),
        ))
    }

    /// Start a live kernel (`POST /v1/sessions`); its id, timed send →
    /// full body.
    pub async fn create_session(&self, lang: &str) -> anyhow::Result<(Duration, String)> {
        let url = format!("{}/sessions", self.v1);
        let (took, v): (Duration, Value) = self
            .post_json(url, &json!({ "lang": lang }), |s| {
                s == reqwest::StatusCode::CREATED
            })
            .await?;
        match v["session_id"].as_str() {
            Some(id) => Ok((took, id.to_owned())),
            None => bail!("POST /v1/sessions: no session_id in {v}"),
        }
    }

    /// Evaluate `code` in live kernel `id` (`POST /v1/sessions/{id}/exec`);
    /// its stdout, timed send → full body.
    pub async fn session_exec(&self, id: &str, code: &str) -> anyhow::Result<(Duration, String)> {
        let url = format!("{}/sessions/{id}/exec", self.v1);
        let (took, r): (Duration, ExecResponse) = self
            .post_json(url, &json!({ "code": code }), |s| s.is_success())
            .await?;
        Ok((took, r.stdout))
    }

    /// Close `user`'s live kernel (`POST /api/v1/release?user_uuid=`).
    pub async fn release(&self, user: &str) -> anyhow::Result<()> {
        let url = format!("{}/api/v1/release?user_uuid={user}", self.origin);
        no_content(self.http.post(url), "POST /api/v1/release").await
    }

    /// Upload one file as LibreChat does for a user attachment
    /// (`kind=user`, `id=<user>`, header `User-Id: <user>`).
    pub async fn upload(
        &self,
        user: &str,
        name: &str,
        content: Vec<u8>,
    ) -> anyhow::Result<(Duration, Uploaded)> {
        let part = reqwest::multipart::Part::bytes(content)
            .file_name(name.to_owned())
            .mime_str("text/plain")
            .context("multipart content type")?;
        let form = reqwest::multipart::Form::new()
            .text("kind", "user")
            .text("id", user.to_owned())
            .part("file", part);
        let t = Instant::now();
        let r = self
            .http
            .post(format!("{}/upload", self.v1))
            .header("User-Id", user)
            .multipart(form)
            .send()
            .await
            .context("POST /v1/upload")?;
        let status = r.status();
        let bytes = r.bytes().await.context("read /v1/upload response")?;
        let took = t.elapsed();
        if !status.is_success() {
            bail!("POST /v1/upload: HTTP {status}: {}", snippet(&bytes));
        }
        let v: Value = serde_json::from_slice(&bytes)
            .with_context(|| format!("POST /v1/upload: not JSON: {}", snippet(&bytes)))?;
        let sid = v["storage_session_id"].as_str();
        let fid = v["files"][0]["fileId"].as_str();
        match (v["message"].as_str(), sid, fid) {
            (Some("success"), Some(sid), Some(fid)) => Ok((
                took,
                Uploaded {
                    storage_session_id: sid.to_owned(),
                    file_id: fid.to_owned(),
                },
            )),
            _ => bail!("POST /v1/upload: unexpected answer: {}", snippet(&bytes)),
        }
    }

    /// Close live kernel `id` (`DELETE /v1/sessions/{id}`).
    pub async fn delete_session(&self, id: &str) -> anyhow::Result<()> {
        let url = format!("{}/sessions/{id}", self.v1);
        no_content(self.http.delete(url), "DELETE /v1/sessions/{id}").await
    }

    /// `GET /v1/health` as JSON.
    pub async fn health(&self) -> anyhow::Result<Value> {
        let r = self
            .http
            .get(format!("{}/health", self.v1))
            .send()
            .await
            .context("GET /v1/health")?;
        r.error_for_status_ref().context("GET /v1/health")?;
        r.json().await.context("GET /v1/health: not JSON")
    }

    /// The Prometheus text of `GET /metrics` (falling back to `/v1/metrics`).
    pub async fn metrics(&self) -> anyhow::Result<String> {
        let mut last = None;
        for url in [
            format!("{}/metrics", self.origin),
            format!("{}/metrics", self.v1),
        ] {
            match self.http.get(&url).send().await {
                Ok(r) if r.status().is_success() => {
                    return r.text().await.with_context(|| format!("read {url}"));
                }
                Ok(r) => last = Some(anyhow::anyhow!("GET {url}: HTTP {}", r.status())),
                Err(e) => last = Some(anyhow::Error::new(e).context(format!("GET {url}"))),
            }
        }
        Err(last.unwrap_or_else(|| anyhow::anyhow!("no metrics endpoint")))
    }
}

/// Sends `req`, which must answer 204 No Content.
async fn no_content(req: reqwest::RequestBuilder, what: &str) -> anyhow::Result<()> {
    let r = req.send().await.context(what.to_owned())?;
    if r.status() != reqwest::StatusCode::NO_CONTENT {
        bail!("{what}: HTTP {}", r.status());
    }
    Ok(())
}

/// The start of a response body, for error messages.
fn snippet(bytes: &[u8]) -> String {
    let s = String::from_utf8_lossy(bytes);
    let mut out: String = s.chars().take(300).collect();
    if s.chars().count() > 300 {
        out.push('…');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_refs_use_librechats_current_shape() {
        let up = Uploaded {
            storage_session_id: "S".repeat(21),
            file_id: "F".repeat(21),
        };
        let v = file_ref(&up, "data.csv", "bench");
        assert_eq!(
            v,
            json!({"id": "F".repeat(21), "storage_session_id": "S".repeat(21), "name": "data.csv", "kind": "user", "resource_id": "bench"})
        );
    }

    #[test]
    fn exec_responses_tolerate_missing_and_extra_fields() {
        let r: ExecResponse = serde_json::from_str(
            r#"{"session_id":"x","stdout":"hello\n","files":[{"id":"a","name":"plot.png","storage_session_id":"b"}],"status":null}"#,
        )
        .unwrap();
        assert_eq!(r.stdout, "hello\n");
        assert_eq!(r.stderr, "");
        assert_eq!(r.files[0].name, "plot.png");
    }

    #[test]
    fn snippets_are_cut_at_300_characters() {
        assert_eq!(snippet(b"short"), "short");
        let long = "é".repeat(400);
        let s = snippet(long.as_bytes());
        assert_eq!(s.chars().count(), 301);
        assert!(s.ends_with('…'));
    }
}
