//! How a run ended.

use std::fmt;

/// How the main process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitStatus {
    /// Exited normally with this code.
    Code(i32),
    /// Killed by this signal number.
    Signal(i32),
}

/// Piston-style status: why a run was stopped or failed. `None` = exit 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunStatus {
    /// Runtime error: non-zero exit code.
    RuntimeError,
    /// Killed by a signal (including the memory limit).
    Signal,
    /// Wall-clock (or CPU) time limit exceeded.
    Timeout,
    /// stdout exceeded its cap.
    StdoutOverflow,
    /// stderr exceeded its cap.
    StderrOverflow,
    /// Internal failure of the sandbox.
    Internal,
}

impl RunStatus {
    pub fn code(&self) -> &'static str {
        match self {
            RunStatus::RuntimeError => "RE",
            RunStatus::Signal => "SG",
            RunStatus::Timeout => "TO",
            RunStatus::StdoutOverflow => "OL",
            RunStatus::StderrOverflow => "EL",
            RunStatus::Internal => "XX",
        }
    }
}

impl fmt::Display for RunStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.code())
    }
}

/// Conventional name of a signal number (`SIGKILL`), for the API's `signal`.
pub fn signal_name(sig: i32) -> String {
    let name = match sig {
        1 => "SIGHUP",
        2 => "SIGINT",
        3 => "SIGQUIT",
        4 => "SIGILL",
        5 => "SIGTRAP",
        6 => "SIGABRT",
        7 => "SIGBUS",
        8 => "SIGFPE",
        9 => "SIGKILL",
        10 => "SIGUSR1",
        11 => "SIGSEGV",
        12 => "SIGUSR2",
        13 => "SIGPIPE",
        14 => "SIGALRM",
        15 => "SIGTERM",
        24 => "SIGXCPU",
        25 => "SIGXFSZ",
        31 => "SIGSYS",
        _ => return format!("SIG{sig}"),
    };
    name.to_owned()
}
