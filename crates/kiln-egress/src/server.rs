//! The HTTP/1.1 server of one channel: accepts the holder's connections (at
//! most `connections_per_channel` at once; more wait in the backlog), gives
//! each `header_timeout` to send a request's headers, and drops every
//! connection when the channel closes.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::forward::{self, ChannelCtx};

/// Largest request head (request line and headers) a jail may send.
const MAX_HEAD_BYTES: usize = 64 * 1024;

pub(crate) async fn serve(ctx: Arc<ChannelCtx>, listener: TcpListener, stop: CancellationToken) {
    let settings = &ctx.shared.settings;
    let slots = Arc::new(Semaphore::new(settings.connections_per_channel.max(1)));
    let header_timeout = settings.header_timeout;
    let mut conns = JoinSet::new();
    loop {
        while conns.try_join_next().is_some() {}
        let slot = tokio::select! {
            s = Arc::clone(&slots).acquire_owned() => match s {
                Ok(s) => s,
                Err(_) => break,
            },
            () = stop.cancelled() => break,
        };
        let sock = tokio::select! {
            r = listener.accept() => match r {
                Ok((sock, _)) => sock,
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning
                    tracing::warn!(error = %e, "egress channel: accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = stop.cancelled() => break,
        };
        let ctx = Arc::clone(&ctx);
        conns.spawn(async move {
            let _slot = slot;
            let svc = service_fn(move |req| {
                let ctx = Arc::clone(&ctx);
                async move { Ok::<_, Infallible>(forward::handle(ctx, req).await) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(header_timeout)
                .max_buf_size(MAX_HEAD_BYTES)
                .serve_connection(TokioIo::new(sock), svc);
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "egress channel: connection ended");
            }
        });
    }
    // dropping the set aborts every connection still open
    conns.shutdown().await;
}
