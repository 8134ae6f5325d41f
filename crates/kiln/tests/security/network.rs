//! No network of any kind leaves the jail.

use std::os::linux::net::SocketAddrExt;

use crate::*;

#[tokio::test]
async fn tcp_to_the_internet_fails() {
    let r = attack("py", "import socket\ntry:\n    socket.create_connection(('1.1.1.1', 80), timeout=2); print('CONNECTED')\nexcept OSError as e:\n    print('blocked')").await;
    assert_eq!(out(&r), "blocked\n", "{r}");
    assert_healthy().await;
}

#[tokio::test]
async fn tcp_to_the_servers_own_port_fails() {
    let port = shared().port;
    let code = format!(
        "import socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}), timeout=2); print('CONNECTED')\nexcept OSError:\n    print('blocked')"
    );
    let r = attack("py", &code).await;
    assert_eq!(out(&r), "blocked\n", "{r}");
}

#[tokio::test]
async fn udp_and_dns_fail() {
    let r = attack(
        "py",
        "import socket\ntry:\n    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.sendto(b'x', ('8.8.8.8', 53)); print('SENT')\nexcept OSError:\n    print('udp blocked')\ntry:\n    socket.getaddrinfo('example.com', 80); print('RESOLVED')\nexcept OSError:\n    print('dns blocked')",
    )
    .await;
    assert_eq!(out(&r), "udp blocked\ndns blocked\n", "{r}");
}

#[tokio::test]
async fn ipv6_loopback_fails() {
    let r = attack("py", "import socket\ntry:\n    socket.create_connection(('::1', 8000), timeout=2); print('CONNECTED')\nexcept OSError:\n    print('blocked')").await;
    assert_eq!(out(&r), "blocked\n", "{r}");
}

#[tokio::test]
async fn netlink_and_packet_sockets_are_denied() {
    let r = attack(
        "py",
        "import socket\nfor fam, typ in [(socket.AF_NETLINK, socket.SOCK_RAW), (socket.AF_PACKET, socket.SOCK_RAW), (socket.AF_INET, socket.SOCK_RAW)]:\n    try:\n        socket.socket(fam, typ); print('OPENED', fam)\n    except OSError:\n        print('denied')",
    )
    .await;
    assert_eq!(out(&r), "denied\ndenied\ndenied\n", "{r}");
}

#[tokio::test]
async fn only_a_down_loopback_interface_exists() {
    let r = attack("bash", "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '; cat /sys/class/net/lo/operstate 2>/dev/null || echo nosys").await;
    let o = out(&r);
    let ifaces: Vec<&str> = o.lines().filter(|l| *l != "nosys").collect();
    assert!(ifaces.iter().all(|i| *i == "lo"), "{r}");
    // SIOCGIFFLAGS through a unix socket (inet sockets are denied)
    let r = attack(
        "py",
        "import fcntl, socket, struct\ns = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)\nres = fcntl.ioctl(s, 0x8913, struct.pack('16sH14x', b'lo', 0))\nprint('up' if struct.unpack('16sH', res[:18])[1] & 1 else 'down')",
    )
    .await;
    assert_eq!(out(&r), "down\n", "{r}");
}

#[tokio::test]
async fn abstract_unix_sockets_of_the_host_are_unreachable() {
    // the host listens on an abstract socket; a netns has its own abstract namespace
    let name = format!("kiln-attack-{}", std::process::id());
    let listener = std::os::unix::net::UnixListener::bind_addr(
        &std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap(),
    )
    .unwrap();
    let code = format!(
        "import socket\ns = socket.socket(socket.AF_UNIX)\ntry:\n    s.connect('\\0{name}'); print('CONNECTED')\nexcept OSError:\n    print('blocked')"
    );
    let r = attack("py", &code).await;
    assert_eq!(out(&r), "blocked\n", "{r}");
    drop(listener);
}

#[tokio::test]
async fn node_cannot_fetch_or_connect() {
    let port = shared().port;
    let code = format!(
        "const net = require('net');\nconst s = net.connect({port}, '127.0.0.1');\ns.on('connect', () => {{ console.log('CONNECTED'); process.exit(0); }});\ns.on('error', () => {{ fetch('http://1.1.1.1/').then(() => console.log('FETCHED')).catch(() => console.log('blocked')); }});"
    );
    let r = attack("js", &code).await;
    assert_eq!(out(&r), "blocked\n", "{r}");
}

#[tokio::test]
async fn bash_dev_tcp_fails() {
    let port = shared().port;
    let r = attack(
        "bash",
        &format!(
            "(echo > /dev/tcp/127.0.0.1/{port}) 2>/dev/null && echo CONNECTED || echo blocked"
        ),
    )
    .await;
    assert_eq!(out(&r), "blocked\n", "{r}");
}
