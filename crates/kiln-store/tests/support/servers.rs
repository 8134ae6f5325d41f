//! Real Postgres and S3 servers on loopback for tests: a throwaway Postgres
//! cluster (`initdb` + `postgres` from Debian's postgresql package) and
//! moto's S3 server (PyPI `moto[server]`), each started once per test
//! process and stopped when it exits.
//!
//! Each server runs under a small `sh` watchdog whose stdin is a pipe from
//! the test process: when the process exits (however it exits) the pipe
//! closes, and the watchdog stops the server and removes its files.
//!
//! Without a server's programs a test is skipped, except under `CI`, where
//! it fails: `scripts/test.sh` installs them.
//!
//! This file is shared (`#[path]`) by the store's tests and the server's.

#![allow(dead_code)]

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The uid/gid Postgres runs as when the tests run as root (initdb refuses
/// root): Debian's `nobody`/`nogroup`.
const NOBODY: u32 = 65534;

/// Watchdogs of the servers started; their stdin closes with the process.
static WATCHDOGS: Mutex<Vec<Child>> = Mutex::new(Vec::new());

fn in_ci() -> bool {
    std::env::var_os("CI").is_some_and(|v| !v.is_empty() && v != "0" && v != "false")
}

/// Skip (or, under CI, fail) for want of `what`.
fn unavailable<T>(what: &str) -> Option<T> {
    assert!(!in_ci(), "{what} (scripts/test.sh installs it)");
    eprintln!("skipped: {what}");
    None
}

fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    l.local_addr().expect("local addr").port()
}

fn wait_for_port(port: u16, what: &str, log: &Path) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "{what} did not listen on {port}: {}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Run `cmd` (a shell command line) under a watchdog that runs `stop` and
/// removes `dir` when this process's end of its stdin closes.
fn supervise(cmd: &str, stop: &str, dir: &Path) {
    let script = format!(
        "{cmd} & p=$!; cat >/dev/null; {stop}; wait $p; rm -rf '{}'",
        dir.display()
    );
    let child = Command::new("sh")
        .arg("-c")
        .arg(script)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn sh");
    WATCHDOGS.lock().unwrap().push(child);
}

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// `initdb` and `postgres`: on PATH, else the newest of Debian's versioned
/// directories.
fn pg_bin_dir() -> Option<PathBuf> {
    if let Ok(path) = std::env::var("PATH") {
        for dir in std::env::split_paths(&path) {
            if dir.join("initdb").is_file() {
                let real = std::fs::canonicalize(dir.join("initdb")).ok()?;
                return real.parent().map(Path::to_path_buf);
            }
        }
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|e| {
            let e = e.ok()?;
            let v = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").is_file().then_some((v, bin))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, bin)| bin)
}

/// A Postgres cluster on 127.0.0.1 (trust auth, user `kiln`).
pub struct Postgres {
    pub port: u16,
}

impl Postgres {
    /// A fresh, empty database; returns its URL.
    pub fn fresh_database(&self) -> String {
        let name = format!("t_{}", hex_suffix());
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let out = Command::new("psql")
                .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
                .args([
                    "-U",
                    "kiln",
                    "-d",
                    "postgres",
                    "-v",
                    "ON_ERROR_STOP=1",
                    "-q",
                ])
                .args(["-c", &format!("CREATE DATABASE {name}")])
                .output()
                .expect("run psql");
            if out.status.success() {
                break;
            }
            // "the database system is starting up"
            assert!(
                Instant::now() < deadline,
                "create database: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        format!("postgres://kiln@127.0.0.1:{}/{name}", self.port)
    }

    /// Run one SQL statement as the superuser in database `db`.
    pub fn psql(&self, db: &str, sql: &str) -> String {
        let out = Command::new("psql")
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(["-U", "kiln", "-d", db, "-v", "ON_ERROR_STOP=1", "-qAt"])
            .args(["-c", sql])
            .output()
            .expect("run psql");
        assert!(
            out.status.success(),
            "psql: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

fn hex_suffix() -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "{}x{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// The test process's Postgres (started on first use); `None` (skip) when
/// Postgres is not installed, outside CI.
pub fn postgres() -> Option<&'static Postgres> {
    static PG: OnceLock<Option<Postgres>> = OnceLock::new();
    PG.get_or_init(start_postgres).as_ref()
}

fn start_postgres() -> Option<Postgres> {
    let Some(bin) = pg_bin_dir() else {
        return unavailable("Postgres (initdb) is not installed");
    };
    if Command::new("psql").arg("--version").output().is_err() {
        return unavailable("psql is not installed");
    }
    let dir = tempfile::Builder::new()
        .prefix("kiln-pg-")
        .tempdir()
        .expect("tempdir")
        .keep();
    let data = dir.join("data");
    let log = dir.join("postgres.log");
    // initdb refuses to run as root: the cluster belongs to nobody
    let as_user = if is_root() {
        std::os::unix::fs::chown(&dir, Some(NOBODY), Some(NOBODY)).expect("chown");
        format!("setpriv --reuid={NOBODY} --regid={NOBODY} --clear-groups ")
    } else {
        String::new()
    };
    let initdb = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "{as_user}'{}' -D '{}' -U kiln --auth=trust -E UTF8 --locale=C.UTF-8 --no-sync",
            bin.join("initdb").display(),
            data.display()
        ))
        .output()
        .expect("run initdb");
    assert!(
        initdb.status.success(),
        "initdb: {}",
        String::from_utf8_lossy(&initdb.stderr)
    );
    let port = free_port();
    // durability off: a throwaway cluster
    let server = format!(
        "{as_user}'{}' -D '{}' -p {port} -c listen_addresses=127.0.0.1 \
         -c unix_socket_directories='' -c fsync=off -c synchronous_commit=off \
         -c full_page_writes=off -c max_connections=200 >'{}' 2>&1",
        bin.join("postgres").display(),
        data.display(),
        log.display()
    );
    supervise(&server, "kill -INT $p", &dir);
    wait_for_port(port, "postgres", &log);
    Some(Postgres { port })
}

/// moto's S3 server on 127.0.0.1.
pub struct S3Server {
    pub endpoint: String,
}

impl S3Server {
    /// A fresh, empty bucket; returns its name.
    pub fn fresh_bucket(&self) -> String {
        use std::io::{Read as _, Write as _};
        let name = format!("kiln-{}", hex_suffix().to_lowercase());
        let addr = self.endpoint.trim_start_matches("http://");
        let mut conn = std::net::TcpStream::connect(addr).expect("connect to S3");
        write!(
            conn,
            "PUT /{name} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        )
        .expect("create bucket");
        let mut reply = String::new();
        conn.read_to_string(&mut reply).expect("read reply");
        assert!(reply.starts_with("HTTP/1.1 200"), "create bucket: {reply}");
        name
    }
}

/// The test process's S3 server (started on first use); `None` (skip) when
/// moto is not installed, outside CI.
pub fn s3() -> Option<&'static S3Server> {
    static S3: OnceLock<Option<S3Server>> = OnceLock::new();
    S3.get_or_init(start_s3).as_ref()
}

fn start_s3() -> Option<S3Server> {
    // scripts/test.sh installs moto into a directory of its own when
    // python3 lacks it, and says where
    let pythonpath = std::env::var("KILN_MOTO_PYTHONPATH").unwrap_or_default();
    let probe = Command::new("python3")
        .args(["-c", "import moto.server"])
        .env("PYTHONPATH", &pythonpath)
        .output();
    if !probe.is_ok_and(|o| o.status.success()) {
        return unavailable("moto[server] (PyPI) is not installed for python3");
    }
    let dir = tempfile::Builder::new()
        .prefix("kiln-s3-")
        .tempdir()
        .expect("tempdir")
        .keep();
    let log = dir.join("moto.log");
    let port = free_port();
    let server = format!(
        "PYTHONPATH='{pythonpath}' python3 -m moto.server -H 127.0.0.1 -p {port} >'{}' 2>&1",
        log.display()
    );
    supervise(&server, "kill $p", &dir);
    wait_for_port(port, "moto", &log);
    Some(S3Server {
        endpoint: format!("http://127.0.0.1:{port}"),
    })
}
