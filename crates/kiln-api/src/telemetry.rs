//! What `/metrics` exports, in one table: every series Kiln records, its
//! kind and its help text. At start-up [`describe`] gives each its
//! `# HELP` line, sets the counters that have no labels (and the label sets
//! alerts watch) to zero so that they exist before their first increment,
//! and publishes `kiln_build_info`; every scrape refreshes the `process_*`
//! series from `/proc/self` ([`sample_process`]). Latencies are histograms
//! with the buckets of [`BUCKETS`], so they add up across nodes.

use metrics::Unit;

/// The kind of a series.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

/// One exported series.
#[derive(Debug, Clone, Copy)]
pub struct Series {
    pub name: &'static str,
    pub kind: Kind,
    /// Its label names (none: one series, which a counter starts at zero).
    pub labels: &'static [&'static str],
    pub help: &'static str,
}

const fn series(
    name: &'static str,
    kind: Kind,
    labels: &'static [&'static str],
    help: &'static str,
) -> Series {
    Series {
        name,
        kind,
        labels,
        help,
    }
}

/// Histogram buckets of every `*_seconds` histogram, in seconds: from a
/// quick HTTP answer to the longest run a limit allows.
pub const BUCKETS: [f64; 15] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
];

/// Labelled counters started at zero with these labels (the ones an alert
/// watches), so that the alert sees a series before the first event.
const ZEROED: &[(&str, &[(&str, &str)])] =
    &[("kiln_runs_refused_total", &[("reason", "queue_full")])];

use Kind::{Counter, Gauge, Histogram};

/// Every series Kiln exports (the documentation, the dashboard in
/// `deploy/grafana/` and its test name only these).
pub const SERIES: &[Series] = &[
    series(
        "kiln_build_info",
        Gauge,
        &["version"],
        "Always 1; the label names the running version.",
    ),
    series(
        "kiln_http_requests_total",
        Counter,
        &["route", "status"],
        "HTTP requests answered, by route template and status.",
    ),
    series(
        "kiln_http_request_duration_seconds",
        Histogram,
        &["route"],
        "Time to the response head, by route template (a stream's head comes at once).",
    ),
    series(
        "kiln_http_connections",
        Gauge,
        &[],
        "HTTP connections open now.",
    ),
    series(
        "kiln_http_connections_shed_total",
        Counter,
        &[],
        "Connections refused with 503 because max_connections were open.",
    ),
    series(
        "kiln_exec_total",
        Counter,
        &["lang", "status"],
        "Runs ended, by language and status.",
    ),
    series(
        "kiln_missing_modules_total",
        Counter,
        &["lang", "ecosystem", "module"],
        "Runs that ended on an import of a module the image lacks (Python, Node or R), by module: what to add to the image. At most 200 module names; later ones count as `other`.",
    ),
    series(
        "kiln_exec_duration_seconds",
        Histogram,
        &["lang"],
        "Wall time of a run's run step, by language.",
    ),
    series(
        "kiln_exec_phase_seconds",
        Histogram,
        &["phase"],
        "Time of each phase of a run (queue, acquire, store, stage, run, harvest, egress, tools).",
    ),
    series(
        "kiln_runs_refused_total",
        Counter,
        &["reason"],
        "Runs refused before they started, by reason (queue_full: 503 with Retry-After).",
    ),
    series(
        "kiln_runs_active",
        Gauge,
        &[],
        "Runs not ended yet: queued, running or detached.",
    ),
    series(
        "kiln_warm_takes_total",
        Counter,
        &["profile", "result"],
        "Warm jails asked for, by runtime profile and result (hit or miss).",
    ),
    series(
        "kiln_kept_jails_total",
        Counter,
        &["result"],
        "Parks of a slot that held a kept one-shot jail (keep_jails): reused (found as new, handed a fresh program), replaced (its init found something left, or could not have a program forked) or rebuilt (built from another spec, template or workspace).",
    ),
    series(
        "kiln_slot_cgroups_total",
        Counter,
        &["result"],
        "Resets of a slot's kept cgroups after its run: clean (at the first reading), settled (clean once pids.current reached 0, the run's last process reaped, within a few ms) or replaced (a process or task left, memory still charged, or an error: removed and made anew).",
    ),
    series(
        "kiln_warm_misses_served_early_total",
        Counter,
        &["profile"],
        "Warm-jail misses served by a build already under way before their own was done.",
    ),
    series(
        "kiln_warm_ready",
        Gauge,
        &["profile"],
        "Warm jails parked and ready, by runtime profile.",
    ),
    series(
        "kiln_warm_build_seconds",
        Histogram,
        &["profile"],
        "Time to build one warm jail, by runtime profile.",
    ),
    series(
        "kiln_zygote_rss_bytes",
        Gauge,
        &["template"],
        "Resident memory of each Python template's fork-server.",
    ),
    series(
        "kiln_zygote_pid",
        Gauge,
        &["template"],
        "Process id of each Python template's fork-server.",
    ),
    series(
        "kiln_sessions_live",
        Gauge,
        &[],
        "Live kernels (sessions) on this node.",
    ),
    series(
        "kiln_kernel_pool_takes_total",
        Counter,
        &["lang", "result"],
        "Session creates by language and whether they took a kernel started ahead (hit) or started their own (miss).",
    ),
    series(
        "kiln_kernel_pool_ready",
        Gauge,
        &["lang"],
        "Kernels started ahead and ready for a session create, by language.",
    ),
    series(
        "kiln_sessions_lost_total",
        Counter,
        &[],
        "Kernels lost (died, or killed after an interrupt failed).",
    ),
    series(
        "kiln_egress_grants_total",
        Counter,
        &[],
        "Egress grants minted for runs.",
    ),
    series(
        "kiln_egress_channels_open",
        Gauge,
        &[],
        "Egress channels open into jails now.",
    ),
    series(
        "kiln_egress_calls_total",
        Counter,
        &["service", "outcome"],
        "Calls through the egress gateway, by service and outcome.",
    ),
    series(
        "kiln_egress_bytes_total",
        Counter,
        &["service", "direction"],
        "Bytes through the egress gateway, by service and direction (up, down).",
    ),
    series(
        "kiln_egress_call_seconds",
        Histogram,
        &["service"],
        "Duration of calls through the egress gateway, by service.",
    ),
    series(
        "kiln_egress_ledger_errors_total",
        Counter,
        &[],
        "Egress calls the ledger could not record.",
    ),
    series(
        "kiln_egress_secrets_scrubbed_total",
        Counter,
        &[],
        "Secrets scrubbed from upstream answers before a jail saw them.",
    ),
    series(
        "kiln_rate_limit_store_errors_total",
        Counter,
        &[],
        "Rate-limit checks the shared database could not answer.",
    ),
    series(
        "kiln_forwarded_total",
        Counter,
        &["kind"],
        "Requests forwarded to the node that owns a run or kernel, by kind.",
    ),
    series(
        "kiln_forward_lost_total",
        Counter,
        &["kind"],
        "Requests for a run or kernel whose owner node is gone (410), by kind.",
    ),
    series(
        "process_cpu_seconds_total",
        Counter,
        &[],
        "CPU time of the server process (user and system), whole seconds.",
    ),
    series(
        "process_resident_memory_bytes",
        Gauge,
        &[],
        "Resident memory of the server process.",
    ),
    series(
        "process_virtual_memory_bytes",
        Gauge,
        &[],
        "Virtual memory of the server process.",
    ),
    series(
        "process_open_fds",
        Gauge,
        &[],
        "File descriptors the server process holds.",
    ),
    series(
        "process_max_fds",
        Gauge,
        &[],
        "The server process's limit of open file descriptors.",
    ),
    series(
        "process_threads",
        Gauge,
        &[],
        "Threads of the server process.",
    ),
    series(
        "process_start_time_seconds",
        Gauge,
        &[],
        "When the server process started, seconds since the Unix epoch.",
    ),
];

/// Gives every series its help text, zeroes the counters alerts need to
/// see before their first increment, and publishes the build.
pub fn describe(version: &str) {
    for s in SERIES {
        let help = s.help;
        let unit = s.name.ends_with("_seconds").then_some(Unit::Seconds);
        match (s.kind, unit) {
            (Counter, _) => metrics::describe_counter!(s.name, help),
            (Gauge, _) => metrics::describe_gauge!(s.name, help),
            (Histogram, Some(u)) => metrics::describe_histogram!(s.name, u, help),
            (Histogram, None) => metrics::describe_histogram!(s.name, help),
        }
        if s.kind == Counter && s.labels.is_empty() && !s.name.starts_with("process_") {
            metrics::counter!(s.name).increment(0);
        }
    }
    for (name, labels) in ZEROED {
        let labels: Vec<metrics::Label> = labels
            .iter()
            .map(|(k, v)| metrics::Label::new(*k, *v))
            .collect();
        metrics::counter!(*name, labels).increment(0);
    }
    metrics::gauge!("kiln_build_info", "version" => version.to_owned()).set(1.0);
    sample_process();
}

/// Refreshes the `process_*` series from `/proc/self` (nothing where it
/// cannot be read).
pub fn sample_process() {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let open_fds = std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count() as u64);
    let Some(p) = parse_process(
        &read("/proc/self/stat"),
        &read("/proc/self/status"),
        &read("/proc/stat"),
        &read("/proc/self/limits"),
        open_fds,
    ) else {
        return;
    };
    metrics::counter!("process_cpu_seconds_total").absolute(p.cpu_secs);
    metrics::gauge!("process_resident_memory_bytes").set(p.rss_bytes as f64);
    metrics::gauge!("process_virtual_memory_bytes").set(p.vm_bytes as f64);
    metrics::gauge!("process_threads").set(p.threads as f64);
    metrics::gauge!("process_start_time_seconds").set(p.start_time_secs);
    metrics::gauge!("process_open_fds").set(p.open_fds as f64);
    if let Some(max) = p.max_fds {
        metrics::gauge!("process_max_fds").set(max as f64);
    }
}

/// What `/proc/self` says about this process.
#[derive(Debug, Clone, PartialEq)]
pub struct ProcessStats {
    /// User plus system CPU time, whole seconds (the recorder's counters
    /// are integers).
    pub cpu_secs: u64,
    pub rss_bytes: u64,
    pub vm_bytes: u64,
    pub threads: u64,
    pub start_time_secs: f64,
    pub open_fds: u64,
    pub max_fds: Option<u64>,
}

/// Clock ticks of `/proc` times: Linux reports them in `USER_HZ`, which is
/// 100 on every architecture.
const USER_HZ: f64 = 100.0;

/// [`ProcessStats`] from the text of `/proc/self/stat`, `/proc/self/status`,
/// `/proc/stat` (`btime`) and `/proc/self/limits`.
pub fn parse_process(
    stat: &str,
    status: &str,
    proc_stat: &str,
    limits: &str,
    open_fds: u64,
) -> Option<ProcessStats> {
    // the command name may hold spaces and parentheses: fields start after the last ')'
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // `rest` starts at field 3 (state), so field n is f[n - 3]
    let field = |n: usize| f.get(n - 3).and_then(|v| v.parse::<u64>().ok());
    let (utime, stime, start_ticks) = (field(14)?, field(15)?, field(22)?);
    let status_kb = |key: &str| -> Option<u64> {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    };
    let btime: u64 = proc_stat
        .lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()?;
    let max_fds = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .and_then(|l| l.split_whitespace().nth(3))
        .and_then(|v| v.parse().ok());
    Some(ProcessStats {
        cpu_secs: ((utime + stime) as f64 / USER_HZ) as u64,
        rss_bytes: status_kb("VmRSS:")? * 1024,
        vm_bytes: status_kb("VmSize:")? * 1024,
        threads: status_kb("Threads:")?,
        start_time_secs: btime as f64 + start_ticks as f64 / USER_HZ,
        open_fds,
        max_fds,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn process_stats_are_read_past_a_command_name_with_spaces_and_parentheses() {
        // fields 14/15 utime/stime, 22 starttime
        let stat = "4242 (kiln (x) y) S 1 4242 4242 0 -1 4194560 100 0 0 0 \
                    250 150 0 0 20 0 7 0 5000 123456789 300 18446744073709551615";
        let status = "Name:\tkiln\nVmSize:\t  120000 kB\nVmRSS:\t    3000 kB\nThreads:\t7\n";
        let boot = "cpu  1 2 3\nbtime 1700000000\nprocesses 5\n";
        let limits = "Limit                     Soft Limit           Hard Limit           Units\n\
                      Max open files            1048576              1048576              files\n";
        let p = parse_process(stat, status, boot, limits, 12).unwrap();
        assert_eq!(
            p,
            ProcessStats {
                cpu_secs: 4,
                rss_bytes: 3000 * 1024,
                vm_bytes: 120_000 * 1024,
                threads: 7,
                start_time_secs: 1_700_000_050.0,
                open_fds: 12,
                max_fds: Some(1_048_576),
            }
        );
        assert_eq!(parse_process("garbage", status, boot, limits, 0), None);
    }

    #[test]
    fn every_series_is_named_once_and_histograms_measure_seconds() {
        let mut names: Vec<&str> = SERIES.iter().map(|s| s.name).collect();
        names.sort_unstable();
        let before = names.len();
        names.dedup();
        assert_eq!(names.len(), before, "a series is listed twice");
        for s in SERIES {
            assert!(!s.help.is_empty(), "{} has no help", s.name);
            if s.kind == Kind::Histogram {
                assert!(s.name.ends_with("_seconds"), "{}", s.name);
            }
            if s.kind == Kind::Counter {
                assert!(s.name.ends_with("_total"), "{}", s.name);
            }
        }
        for (name, _) in ZEROED {
            assert!(SERIES.iter().any(|s| s.name == *name), "{name}");
        }
    }
}
