//! The services channel: a jail with a [`JailNetwork`] reaches the
//! server's listener on `127.0.0.1:<port>` with ordinary clients and
//! nothing else; a jail without one keeps no network at all.

mod common;

use std::io::{Read, Write};

use common::*;
use kiln_sandbox::JailNetwork;
use tokio_util::sync::CancellationToken;

const UID_BASE: u32 = 1_880_000_000;

/// Serves one HTTP answer per connection on `listener` (blocking, in a
/// thread) until it has served `n`.
fn answer(listener: std::net::TcpListener, n: usize) -> std::thread::JoinHandle<Vec<String>> {
    listener.set_nonblocking(false).expect("blocking");
    std::thread::spawn(move || {
        let mut requests = Vec::new();
        for _ in 0..n {
            let Ok((mut c, _)) = listener.accept() else {
                break;
            };
            let mut buf = [0u8; 4096];
            let got = c.read(&mut buf).unwrap_or(0);
            requests.push(String::from_utf8_lossy(&buf[..got]).into_owned());
            let _ = c.write_all(
                b"HTTP/1.1 200 OK\r\ncontent-length: 6\r\nconnection: close\r\n\r\nhello\n",
            );
        }
        requests
    })
}

const PROBE: &str = r#"
import socket, urllib.request, os
port = int(os.environ["PORT"])
print(urllib.request.urlopen("http://127.0.0.1:%d/x" % port, timeout=5).read().decode(), end="")
def attempt(what, f):
    try:
        f(); print(what, "OPEN")
    except OSError as e:
        print(what, "refused")
attempt("other-port", lambda: socket.create_connection(("127.0.0.1", port + 1), timeout=2))
attempt("internet", lambda: socket.create_connection(("1.1.1.1", 80), timeout=2))
attempt("udp", lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM))
attempt("raw", lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW, 1))
attempt("inet6", lambda: socket.socket(socket.AF_INET6, socket.SOCK_STREAM))
attempt("netlink", lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW))
def listen():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen()
attempt("listen", listen)
def lo_down():
    import fcntl, struct
    s = socket.socket()
    fcntl.ioctl(s, 0x8914, struct.pack("16sH14x", b"lo", 0))
attempt("lo-down", lo_down)
"#;

#[tokio::test]
async fn a_jail_with_a_channel_reaches_its_listener_and_nothing_else() {
    let Some(sb) = sandbox(UID_BASE) else { return };
    let (net, listener) = JailNetwork::create(8080).expect("network");
    let served = answer(listener, 1);
    let slot = sb.acquire_slot().await;
    let ws = workspace(&slot);
    let mut req = request(&ws, &["/usr/bin/python3", "-c", PROBE], limits());
    req.env.push(("PORT".into(), net.port().to_string()));
    req.network = Some(net);
    let r = sb
        .run(&slot, req, CancellationToken::new())
        .await
        .expect("run");
    assert_eq!(
        stdout(&r),
        "hello\nother-port refused\ninternet refused\nudp refused\nraw refused\ninet6 refused\nnetlink refused\nlisten refused\nlo-down refused\n",
        "stderr: {}",
        stderr(&r)
    );
    let requests = served.join().expect("server thread");
    assert!(requests[0].starts_with("GET /x HTTP/1.1"), "{requests:?}");
}

#[tokio::test]
async fn curl_and_node_reach_the_listener_too() {
    let Some(sb) = sandbox(UID_BASE) else { return };
    let mut clients: Vec<Vec<&str>> = Vec::new();
    if std::path::Path::new("/usr/bin/curl").exists() {
        clients.push(vec!["/usr/bin/curl", "-s", "http://127.0.0.1:8080/y"]);
    }
    if std::path::Path::new("/usr/bin/node").exists() {
        clients.push(vec![
            "/usr/bin/node",
            "-e",
            "fetch('http://127.0.0.1:8080/y').then(r => r.text()).then(t => process.stdout.write(t))",
        ]);
    }
    assert!(
        !clients.is_empty() || std::env::var_os("CI").is_none(),
        "CI is set but neither curl nor node is installed"
    );
    for argv in clients {
        let (net, listener) = JailNetwork::create(8080).expect("network");
        let served = answer(listener, 1);
        let slot = sb.acquire_slot().await;
        let ws = workspace(&slot);
        let mut req = request(&ws, &argv, limits());
        req.network = Some(net);
        let r = sb
            .run(&slot, req, CancellationToken::new())
            .await
            .expect("run");
        assert_eq!(stdout(&r), "hello\n", "{argv:?}: {}", stderr(&r));
        served.join().expect("server thread");
    }
}

#[tokio::test]
async fn a_jail_without_a_channel_still_has_no_network() {
    let Some(sb) = sandbox(UID_BASE) else { return };
    let r = sh(
        sb,
        &sb.acquire_slot().await,
        "/usr/bin/python3 -c 'import socket\ntry:\n    socket.socket(socket.AF_INET); print(\"OPEN\")\nexcept OSError: print(\"refused\")'",
    )
    .await;
    assert_eq!(stdout(&r), "refused\n", "{}", stderr(&r));
}
