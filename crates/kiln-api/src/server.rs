//! The connection layer: accepting TCP connections and serving the router
//! on them with the limits a public endpoint needs.
//!
//! `axum::serve` gives hyper no timer, so none of hyper's timeouts fire:
//! a client that sends half a request head holds its connection (and a
//! task) forever, before any authentication. This loop serves each
//! connection with hyper's HTTP/1.1 server and a Tokio timer:
//!
//! - **head timeout** — a request head must arrive within `header_timeout`
//!   of the connection opening or of the previous answer (so it is also
//!   the idle limit of a kept-alive connection), or the connection is
//!   closed;
//! - **body idle timeout** — every request body is wrapped so that a pause
//!   longer than `body_idle_timeout` between two frames fails the read
//!   (the handler answers 408);
//! - **connection cap** — at most `max_connections` are served at once;
//!   past it a connection gets a canned `503` with `Retry-After` and is
//!   closed (load shedding), so the server never runs out of fds or memory
//!   on connections alone;
//! - **graceful shutdown** — when `shutdown` resolves the listener closes,
//!   connections finish their in-flight requests and then close.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tower::ServiceExt;
use tower_http::timeout::TimeoutBody;

/// Connection-level limits (see the module docs).
#[derive(Debug, Clone)]
pub struct ConnLimits {
    /// Time allowed for a request head to arrive.
    pub header_timeout: Duration,
    /// Longest pause allowed between two frames of a request body.
    pub body_idle_timeout: Duration,
    /// Connections served at once; more are answered 503 and closed.
    pub max_connections: usize,
}

impl Default for ConnLimits {
    fn default() -> Self {
        ConnLimits {
            header_timeout: Duration::from_secs(10),
            body_idle_timeout: Duration::from_secs(30),
            max_connections: 512,
        }
    }
}

/// What a shed connection is told (the contract's coded-error envelope).
const SHED_BODY: &str = r#"{"error":"server_busy","message":"Too many connections. Please retry in 1 seconds.","retry_after_seconds":1}"#;

/// Serves `app` on `listener` until `shutdown` resolves, then waits for
/// open connections to finish their requests.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: ConnLimits,
    shutdown: impl Future<Output = ()> + Send,
) -> std::io::Result<()> {
    // HTTP/1.1 only: every client of the API speaks it, and hyper-util's
    // version sniffing (to offer HTTP/2 as well) reads the first bytes with
    // no timeout at all, which is the hole this loop closes.
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .keep_alive(true);
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let graceful = GracefulShutdown::new();
    let idle = limits.body_idle_timeout;
    tokio::pin!(shutdown);

    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of fds or a connection reset before accept: keep
                    // serving, but do not spin on a persistent error.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
            metrics::counter!("kiln_http_connections_shed_total").increment(1);
            tokio::spawn(shed(stream));
            continue;
        };
        metrics::gauge!("kiln_http_connections").increment(1.0);
        let svc = app
            .clone()
            .map_request(move |req: http::Request<Incoming>| {
                let mut req = req.map(|b| Body::new(TimeoutBody::new(idle, b)));
                // the peer address keys the rate limits of identity-less callers
                req.extensions_mut().insert(ConnectInfo(peer));
                req
            });
        let conn = builder.serve_connection(TokioIo::new(stream), TowerToHyperService::new(svc));
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "connection ended with an error");
            }
            metrics::gauge!("kiln_http_connections").decrement(1.0);
            drop(slot);
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}

/// Answers a connection over the cap with a 503 and closes it, within a
/// half a second whatever the client does.
async fn shed(mut stream: TcpStream) {
    let answer = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
         retry-after: 1\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{SHED_BODY}",
        SHED_BODY.len()
    );
    let _ = tokio::time::timeout(Duration::from_millis(500), async {
        stream.write_all(answer.as_bytes()).await?;
        stream.shutdown().await?;
        // Read what the client sent until it closes (bounded by the
        // timeout): closing with unread bytes would reset the connection
        // and could destroy the answer before the client reads it.
        let mut sink = [0u8; 4096];
        while stream.read(&mut sink).await? > 0 {}
        Ok::<_, std::io::Error>(())
    })
    .await;
}
