//! The tool channel of one run: a TCP listener at `127.0.0.1:81` in a
//! network namespace made for the run's jail (the same mechanism as the
//! egress gateway's, `kiln_sandbox::JailNetwork`): the jail can reach it,
//! nothing else can, and it serves only this run's bridge.
//!
//! The protocol, spoken by the stubs `program.rs` writes:
//! a request is `<length>\n` and that many bytes of JSON, an array of
//! `{"name": <declared tool name>, "input": <object>}`; the answer is, per
//! call in order, `ok <length>\n<bytes>` (the result: JSON for Python; for
//! bash a string as is, anything else as compact JSON) or `err
//! <length>\n<message>`. A request that does not parse gets one `err`.

use std::sync::Arc;
use std::time::Instant;

use kiln_core::Language;
use kiln_sandbox::JailNetwork;
use serde::Deserialize;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;

use super::{Bridge, Reply};
use crate::types::ExecError;

/// The port of the tool channel inside the jail.
pub const TOOLS_PORT: u16 = 81;

/// Largest request the channel reads (a round's inputs).
const MAX_REQUEST: usize = 5 * 1024 * 1024;
/// Most connections served at once (each may hold a request in memory);
/// more are closed at once.
const MAX_CONNECTIONS: usize = 64;

#[derive(Deserialize)]
struct CallIn {
    name: String,
    #[serde(default)]
    input: Value,
}

/// The open channel of one run: its network and the tasks serving it.
pub(crate) struct ToolChannel {
    network: JailNetwork,
    tasks: JoinSet<()>,
}

impl ToolChannel {
    /// Makes the jail's network namespace and serves `bridge` on it.
    pub(crate) fn open(bridge: &Arc<Bridge>) -> Result<ToolChannel, ExecError> {
        let t = Instant::now();
        let (network, listener) = JailNetwork::create(TOOLS_PORT)
            .map_err(|e| ExecError::SandboxSetup(format!("tool channel: {e}")))?;
        let listener = TcpListener::from_std(listener)
            .map_err(|e| ExecError::SandboxSetup(format!("tool channel: {e}")))?;
        let mut tasks = JoinSet::new();
        tasks.spawn(Arc::clone(bridge).rounds());
        tasks.spawn(accept(listener, Arc::clone(bridge)));
        metrics::histogram!("kiln_exec_phase_seconds", "phase" => "tools")
            .record(t.elapsed().as_secs_f64());
        Ok(ToolChannel { network, tasks })
    }

    pub(crate) fn network(&self) -> JailNetwork {
        self.network.clone()
    }

    /// Stops serving (the run's step is over).
    pub(crate) async fn close(mut self) {
        self.tasks.shutdown().await;
    }
}

async fn accept(listener: TcpListener, bridge: Arc<Bridge>) {
    let mut conns = JoinSet::new();
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                // reap finished connections, then refuse past the bound
                while conns.try_join_next().is_some() {}
                if conns.len() < MAX_CONNECTIONS {
                    conns.spawn(serve(stream, Arc::clone(&bridge)));
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "tool channel: accept failed");
                return;
            }
        }
    }
}

async fn serve(stream: TcpStream, bridge: Arc<Bridge>) {
    let (read, mut write) = stream.into_split();
    let mut read = BufReader::new(read);
    let answers = match request(&mut read).await {
        Ok(calls) => {
            let replies = bridge.submit(calls);
            let mut answers = Vec::with_capacity(replies.len());
            for rx in replies {
                answers.push(rx.await.unwrap_or_else(|_| {
                    Reply::Err(
                        bridge
                            .failure()
                            .map_or_else(|| "the execution ended".to_owned(), |f| f.to_string()),
                    )
                }));
            }
            answers
        }
        Err(msg) => vec![Reply::Err(msg)],
    };
    let mut out = Vec::new();
    for a in answers {
        let (tag, body) = match a {
            Reply::Ok(v) => ("ok", render(bridge.lang(), &v)),
            Reply::Err(m) => ("err", m),
        };
        out.extend_from_slice(format!("{tag} {}\n", body.len()).as_bytes());
        out.extend_from_slice(body.as_bytes());
    }
    let _ = write.write_all(&out).await;
    let _ = write.shutdown().await;
}

/// Reads one request: `<length>\n<json>`.
async fn request(
    read: &mut BufReader<tokio::net::tcp::OwnedReadHalf>,
) -> Result<Vec<(String, Value)>, String> {
    let mut header = String::new();
    (&mut *read)
        .take(24)
        .read_line(&mut header)
        .await
        .map_err(|e| format!("tool channel: {e}"))?;
    let len: usize = header
        .trim()
        .parse()
        .map_err(|_| "tool channel: malformed request".to_owned())?;
    if len > MAX_REQUEST {
        return Err(format!(
            "tool input too large: {len} bytes (at most {MAX_REQUEST})"
        ));
    }
    let mut body = vec![0u8; len];
    read.read_exact(&mut body)
        .await
        .map_err(|e| format!("tool channel: {e}"))?;
    let calls: Vec<CallIn> =
        serde_json::from_slice(&body).map_err(|e| format!("invalid JSON tool input: {e}"))?;
    calls
        .into_iter()
        .map(|c| match c.input {
            Value::Object(_) => Ok((c.name, c.input)),
            Value::Null => Ok((c.name, Value::Object(Default::default()))),
            _ => Err(format!(
                "the input of {} must be a JSON object of keyword arguments",
                c.name
            )),
        })
        .collect()
}

/// A result as the program reads it.
fn render(lang: Language, v: &Value) -> String {
    match v {
        Value::String(s) if super::program::is_shell(lang) => s.clone(),
        v => v.to_string(),
    }
}
