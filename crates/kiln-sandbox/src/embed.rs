//! The fork-server's embedded CPython: `dlopen`s the host's shared
//! libpython (no link-time dependency, so Kiln runs on hosts without it),
//! initialises it once, runs the preload, and later — in a jailed fork —
//! runs one program through the preload's `_kiln_zygote.run`.
//!
//! Together with `sys/` this is the only code with `unsafe`: calls into a C
//! library through function pointers looked up by name. The fork-server
//! process is single-threaded and holds the GIL for its whole life (nothing
//! else ever runs Python in it), which is what the CPython API requires.

#![allow(unsafe_code)]

use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::path::Path;
use std::sync::OnceLock;

/// The few CPython entry points the fork-server uses.
struct Api {
    initialize_ex: unsafe extern "C" fn(c_int),
    run_simple_string: unsafe extern "C" fn(*const c_char) -> c_int,
    before_fork: unsafe extern "C" fn(),
    after_fork_parent: unsafe extern "C" fn(),
    after_fork_child: unsafe extern "C" fn(),
}

static API: OnceLock<Api> = OnceLock::new();

/// Why the interpreter could not be embedded.
#[derive(Debug, thiserror::Error)]
pub(crate) enum EmbedError {
    #[error("dlopen {path}: {message}")]
    Open { path: String, message: String },
    #[error("{path} has no symbol {symbol}")]
    Symbol { path: String, symbol: &'static str },
    #[error("the interpreter is already initialised")]
    Twice,
    #[error("the preload raised an exception (its traceback went to stderr)")]
    Preload,
    #[error("{0}")]
    Invalid(String),
}

fn dl_error() -> String {
    // SAFETY: dlerror returns NULL or a pointer to a NUL-terminated string
    // that stays valid until the next dl* call on this (the only) thread.
    unsafe {
        let e = libc::dlerror();
        if e.is_null() {
            "unknown error".to_owned()
        } else {
            CStr::from_ptr(e).to_string_lossy().into_owned()
        }
    }
}

fn symbol(handle: *mut c_void, path: &str, name: &'static str) -> Result<*mut c_void, EmbedError> {
    let cname = CString::new(name).map_err(|_| EmbedError::Invalid(name.to_owned()))?;
    // SAFETY: `handle` came from a successful dlopen that is never closed;
    // `cname` is NUL-terminated and outlives the call.
    let p = unsafe { libc::dlsym(handle, cname.as_ptr()) };
    if p.is_null() {
        return Err(EmbedError::Symbol {
            path: path.to_owned(),
            symbol: name,
        });
    }
    Ok(p)
}

/// Replaces this process's environment by exactly `env`: what the
/// interpreter reads at start-up (PYTHON* variables, `os.environ`).
pub(crate) fn set_environment(env: &[(String, String)]) -> Result<(), EmbedError> {
    for (k, v) in env {
        if k.is_empty() || k.contains(['=', '\0']) || v.contains('\0') {
            return Err(EmbedError::Invalid(format!("environment variable {k:?}")));
        }
    }
    let old: Vec<_> = std::env::vars_os().map(|(k, _)| k).collect();
    // SAFETY: the fork-server is single-threaded (checked by the caller
    // before it loads anything) and nothing reads the environment
    // concurrently.
    unsafe {
        for k in old {
            std::env::remove_var(k);
        }
        for (k, v) in env {
            std::env::set_var(k, v);
        }
    }
    Ok(())
}

/// Loads `libpython`, initialises the interpreter (with Python's usual
/// signal handlers, like `python3` itself) and runs `preload` as
/// `__main__`-level code.
pub(crate) fn initialize(libpython: &Path, preload: &str) -> Result<(), EmbedError> {
    if API.get().is_some() {
        return Err(EmbedError::Twice);
    }
    let path = libpython.to_string_lossy().into_owned();
    let cpath = CString::new(path.clone()).map_err(|_| EmbedError::Invalid(path.clone()))?;
    let preload = CString::new(preload)
        .map_err(|_| EmbedError::Invalid("the preload contains a NUL byte".to_owned()))?;
    // SAFETY: `cpath` is NUL-terminated. RTLD_GLOBAL: extension modules
    // (numpy's, pandas') resolve the Py* symbols against this library.
    let handle = unsafe { libc::dlopen(cpath.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
    if handle.is_null() {
        return Err(EmbedError::Open {
            path,
            message: dl_error(),
        });
    }
    let init = symbol(handle, &path, "Py_InitializeEx")?;
    let run = symbol(handle, &path, "PyRun_SimpleString")?;
    let before = symbol(handle, &path, "PyOS_BeforeFork")?;
    let parent = symbol(handle, &path, "PyOS_AfterFork_Parent")?;
    let after = symbol(handle, &path, "PyOS_AfterFork_Child")?;
    // SAFETY: these are the documented signatures of the CPython C API
    // functions of these names (stable ABI since 3.2 / 3.7).
    let api = unsafe {
        Api {
            initialize_ex: std::mem::transmute::<*mut c_void, unsafe extern "C" fn(c_int)>(init),
            run_simple_string: std::mem::transmute::<
                *mut c_void,
                unsafe extern "C" fn(*const c_char) -> c_int,
            >(run),
            before_fork: std::mem::transmute::<*mut c_void, unsafe extern "C" fn()>(before),
            after_fork_parent: std::mem::transmute::<*mut c_void, unsafe extern "C" fn()>(parent),
            after_fork_child: std::mem::transmute::<*mut c_void, unsafe extern "C" fn()>(after),
        }
    };
    let api = API.get_or_init(|| api);
    // SAFETY: first and only initialisation, on the process's only thread.
    unsafe { (api.initialize_ex)(1) };
    // SAFETY: the interpreter is initialised and this thread holds the GIL;
    // `preload` is NUL-terminated.
    let rc = unsafe { (api.run_simple_string)(preload.as_ptr()) };
    if rc != 0 {
        return Err(EmbedError::Preload);
    }
    Ok(())
}

/// Before the fork-server forks: the interpreter takes the locks a fork
/// must not copy half-held (CPython 3.13 checks that the child's
/// [`run_in_child`] releases exactly these) and runs its before-fork hooks.
/// Must be followed by [`after_fork_parent`] in this process. A no-op
/// before the interpreter is initialised.
pub(crate) fn before_fork() {
    if let Some(api) = API.get() {
        // SAFETY: the interpreter is initialised and the fork-server's only
        // thread holds the GIL, as `PyOS_BeforeFork` requires.
        unsafe { (api.before_fork)() };
    }
}

/// In the fork-server after a fork (or a failed one): releases what
/// [`before_fork`] took and runs the parent's after-fork hooks.
pub(crate) fn after_fork_parent() {
    if let Some(api) = API.get() {
        // SAFETY: called once after each `before_fork`, on the same (only)
        // thread, holding the GIL.
        unsafe { (api.after_fork_parent)() };
    }
}

/// In a forked child: tells the interpreter it is a new process, then runs
/// `code`. Returns only if the code returned (the preload's runner ends the
/// process itself); the value is what `PyRun_SimpleString` reported.
pub(crate) fn run_in_child(code: &str) -> Result<c_int, EmbedError> {
    let Some(api) = API.get() else {
        return Err(EmbedError::Invalid(
            "the interpreter is not initialised".to_owned(),
        ));
    };
    let code = CString::new(code)
        .map_err(|_| EmbedError::Invalid("code contains a NUL byte".to_owned()))?;
    // SAFETY: this process is a single-threaded fork of the initialised
    // fork-server, whose only thread held the GIL (and, through
    // `before_fork`, the runtime's fork locks) at the fork; CPython requires
    // exactly this call before any other use after such a fork.
    unsafe { (api.after_fork_child)() };
    // SAFETY: as in `initialize`: initialised interpreter, GIL held,
    // NUL-terminated code.
    Ok(unsafe { (api.run_simple_string)(code.as_ptr()) })
}
