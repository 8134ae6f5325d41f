//! `kiln exec --server URL`: run one file on a running Kiln server and
//! print its output as the program writes it. `POST /v1/exec` with
//! `Accept: text/event-stream` (the key, when there is one, in
//! `X-API-Key`); the `stdout`/`stderr` events are written through, the
//! `result` event gives the exit code, an `error` event the reason.
//! Input files (`--file`) go inline in the body (hex); with `--out` the
//! result's files are downloaded from `GET /v1/download/...`.

use std::process::ExitCode;

use anyhow::{Context as _, bail};
use futures::StreamExt as _;
use kiln_exec::Stream;
use serde_json::{Value, json};

/// Splits a `text/event-stream` body into `(event, data)` pairs.
#[derive(Debug, Default)]
pub(crate) struct SseParser {
    buf: String,
}

impl SseParser {
    /// Feeds `chunk`; returns the events it completed.
    pub(crate) fn push(&mut self, chunk: &str) -> Vec<(String, String)> {
        self.buf.push_str(&chunk.replace("\r\n", "\n"));
        let mut out = Vec::new();
        while let Some(end) = self.buf.find("\n\n") {
            let block: String = self.buf.drain(..end + 2).collect();
            let mut name = "message".to_owned();
            let mut data: Vec<&str> = Vec::new();
            for line in block.lines() {
                if line.starts_with(':') {
                    continue; // keep-alive comment
                }
                let (field, value) = line.split_once(':').unwrap_or((line, ""));
                let value = value.strip_prefix(' ').unwrap_or(value);
                match field {
                    "event" => name = value.to_owned(),
                    "data" => data.push(value),
                    _ => {}
                }
            }
            if !data.is_empty() {
                out.push((name, data.join("\n")));
            }
        }
        out
    }
}

/// The exit code for a `result` event: the program's, or 128 + the signal.
fn exit_code(result: &Value) -> u8 {
    if let Some(c) = result["code"].as_i64() {
        return u8::try_from(c.clamp(0, 255)).unwrap_or(1);
    }
    let signal = match result["signal"].as_str() {
        Some("SIGKILL") => 9,
        Some("SIGTERM") => 15,
        Some("SIGSEGV") => 11,
        Some("SIGABRT") => 6,
        Some("SIGXCPU") => 24,
        Some("SIGXFSZ") => 25,
        _ => 1,
    };
    128 + signal
}

/// Runs `job` on the server at `base` (`http://host:port`, with or
/// without `/v1`).
pub async fn exec_remote(
    base: &str,
    api_key: Option<&str>,
    job: crate::ExecFiles<'_>,
    args: Vec<String>,
) -> anyhow::Result<ExitCode> {
    let code = job.code()?;
    let files: Vec<Value> = job
        .input_files()?
        .into_iter()
        .map(|(name, bytes)| {
            json!({
                "name": name,
                "content": hex::encode(bytes),
                "encoding": "hex",
            })
        })
        .collect();
    let base = base.trim_end_matches('/');
    let base = base.strip_suffix("/v1").unwrap_or(base);
    kiln_egress::install_crypto_provider();
    let http = reqwest::Client::new();
    let key = api_key.filter(|k| !k.is_empty());
    let with_key = |req: reqwest::RequestBuilder| match key {
        Some(k) => req.header("X-API-Key", k),
        None => req,
    };
    let req = with_key(
        http.post(format!("{base}/v1/exec"))
            .header("Accept", "text/event-stream")
            .json(&json!({ "lang": job.lang, "code": code, "args": args, "files": files })),
    );
    let resp = req
        .send()
        .await
        .with_context(|| format!("POST {base}/v1/exec"))?;
    let status = resp.status();
    let is_stream = resp
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    if !status.is_success() || !is_stream {
        let body = resp.text().await.unwrap_or_default();
        bail!("the server answered {status}: {body}");
    }
    let mut parser = SseParser::default();
    let mut body = resp.bytes_stream();
    let mut pending = Vec::new();
    while let Some(chunk) = body.next().await {
        pending.extend_from_slice(&chunk.context("reading the event stream")?);
        // split only on whole UTF-8 characters
        let valid = match std::str::from_utf8(&pending) {
            Ok(_) => pending.len(),
            Err(e) => e.valid_up_to(),
        };
        let text = String::from_utf8_lossy(&pending[..valid]).into_owned();
        pending.drain(..valid);
        for (event, data) in parser.push(&text) {
            let v: Value = serde_json::from_str(&data).unwrap_or(Value::Null);
            match event.as_str() {
                "stdout" => crate::write_through(Stream::Stdout, v["text"].as_str().unwrap_or("")),
                "stderr" => crate::write_through(Stream::Stderr, v["text"].as_str().unwrap_or("")),
                "result" => {
                    for f in v["files"].as_array().into_iter().flatten() {
                        let name = f["name"].as_str().unwrap_or("?");
                        let dest = job.output_path(name)?;
                        if let Some(dest) = &dest {
                            let url = format!(
                                "{base}/v1/download/{}/{}",
                                f["storage_session_id"].as_str().unwrap_or_default(),
                                f["id"].as_str().unwrap_or_default()
                            );
                            let got = with_key(http.get(&url))
                                .send()
                                .await
                                .and_then(reqwest::Response::error_for_status)
                                .with_context(|| format!("download {name}"))?;
                            let bytes = got
                                .bytes()
                                .await
                                .with_context(|| format!("download {name}"))?;
                            std::fs::write(dest, &bytes)
                                .with_context(|| format!("save {}", dest.display()))?;
                        }
                        crate::report_output(name, dest.as_deref());
                    }
                    return Ok(ExitCode::from(exit_code(&v)));
                }
                "error" => bail!("the run failed ({}): {}", v["status"], v["error"]),
                _ => {}
            }
        }
    }
    bail!("the event stream ended without a result")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_parsed_across_chunks_and_comments_are_skipped() {
        let mut p = SseParser::default();
        assert!(p.push(": keep-alive\n\nevent: std").is_empty());
        let got = p.push("out\ndata: {\"text\":\"a\"}\n\nevent: result\r\ndata: {}\r\n\r\n");
        assert_eq!(
            got,
            [
                ("stdout".to_owned(), "{\"text\":\"a\"}".to_owned()),
                ("result".to_owned(), "{}".to_owned())
            ]
        );
    }

    #[test]
    fn a_signal_exits_128_plus_its_number() {
        assert_eq!(exit_code(&json!({"code": 3})), 3);
        assert_eq!(exit_code(&json!({"code": null, "signal": "SIGKILL"})), 137);
    }
}
