//! The tool surface a programmatic run's program gets (spec §7.4), written
//! in front of the user's code:
//!
//! - Python: one `async def` per tool under the client's normalised name
//!   (required parameters first, optional ones `= None`, any other keyword
//!   through `**kwargs`), `ToolExecutionError` for a failed tool, and the
//!   user's code compiled with top-level `await` allowed and run on an
//!   event loop. Calls pending at the same moment (`asyncio.gather`) go to
//!   the host in one request, once nothing else is ready to run.
//! - bash: one shell function per tool taking one JSON string argument
//!   (none: `{}`); it prints the result (a string as is, anything else as
//!   compact JSON, ready for `jq`) or, for a failed tool, the message on
//!   stderr with status 1.
//!
//! Names are normalised exactly as `@librechat/agents` does, so the names
//! the model was told are the names that exist.

use kiln_core::Language;
use kiln_core::lang::ToolStyle;
use serde_json::Value;

use super::{TOOLS_PORT, ToolDef};

const PYTHON_KEYWORDS: &[&str] = &[
    "False", "None", "True", "and", "as", "assert", "async", "await", "break", "class", "continue",
    "def", "del", "elif", "else", "except", "finally", "for", "from", "global", "if", "import",
    "in", "is", "lambda", "nonlocal", "not", "or", "pass", "raise", "return", "try", "while",
    "with", "yield",
];

const BASH_RESERVED: &[&str] = &[
    "if", "then", "else", "elif", "fi", "case", "esac", "for", "while", "until", "do", "done",
    "in", "function", "select", "time", "coproc", "declare", "typeset", "local", "readonly",
    "export", "unset",
];

/// `name` with `separators` made `_`, anything else outside
/// `[A-Za-z0-9_]` dropped, a leading digit prefixed with `_` and a
/// reserved word suffixed with `_tool`.
fn normalise(name: &str, separators: &[char], reserved: &[&str]) -> String {
    let mut out: String = name
        .chars()
        .filter_map(|c| {
            if separators.contains(&c) || c.is_whitespace() {
                Some('_')
            } else if c.is_ascii_alphanumeric() || c == '_' {
                Some(c)
            } else {
                None
            }
        })
        .collect();
    if out.starts_with(|c: char| c.is_ascii_digit()) {
        out.insert(0, '_');
    }
    if reserved.contains(&out.as_str()) {
        out.push_str("_tool");
    }
    out
}

/// A tool's Python function name (the client's `normalizeToPythonIdentifier`).
pub fn python_name(name: &str) -> String {
    normalise(name, &['-'], PYTHON_KEYWORDS)
}

/// A tool's shell function name (the client's `normalizeToBashIdentifier`).
pub fn bash_name(name: &str) -> String {
    normalise(name, &['-', '.'], BASH_RESERVED)
}

/// Whether `lang`'s tools are shell functions (the table's tool style).
pub(crate) fn is_shell(lang: Language) -> bool {
    lang.tools().map(|t| t.style) == Some(ToolStyle::Shell)
}

/// The function name of `name` in `lang`'s surface.
pub fn function_name(lang: Language, name: &str) -> String {
    if is_shell(lang) {
        bash_name(name)
    } else {
        python_name(name)
    }
}

/// The whole program: the surface, then `code`.
pub fn program(lang: Language, tools: &[ToolDef], code: &str) -> String {
    if is_shell(lang) {
        bash_program(tools, code)
    } else {
        python_program(tools, code)
    }
}

fn is_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// The parameters a stub names: `(name, required)`, required first; a
/// property that is no usable identifier is left to `**kwargs`.
fn parameters(schema: Option<&Value>) -> Vec<(String, bool)> {
    let Some(props) = schema
        .and_then(|s| s.get("properties"))
        .and_then(Value::as_object)
    else {
        return Vec::new();
    };
    let required: Vec<&str> = schema
        .and_then(|s| s.get("required"))
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let usable = |p: &&String| {
        is_identifier(p)
            && !PYTHON_KEYWORDS.contains(&p.as_str())
            && !p.starts_with("_ptc")
            && p.as_str() != "self"
    };
    let mut out: Vec<(String, bool)> = props
        .keys()
        .filter(usable)
        .map(|p| (p.clone(), required.contains(&p.as_str())))
        .collect();
    // required first, keeping the schema's order otherwise
    out.sort_by_key(|(_, req)| !*req);
    out
}

const PYTHON_RUNTIME: &str = r#"import asyncio as _ptc_asyncio
import ast as _ptc_ast
import json as _ptc_json
import linecache as _ptc_linecache
import socket as _ptc_socket
import sys as _ptc_sys


class ToolExecutionError(Exception):
    """A tool the program called failed on the host."""

    def __init__(self, message, tool_name=None):
        super().__init__(message)
        self.tool_name = tool_name


_ptc_pending = []
_ptc_flush_at = None


def _ptc_exchange(calls):
    _ptc_sys.stdout.flush()
    _ptc_sys.stderr.flush()
    body = _ptc_json.dumps(calls).encode()
    with _ptc_socket.create_connection(("127.0.0.1", _PTC_PORT)) as s:
        s.sendall(b"%d\n" % len(body) + body)
        f = s.makefile("rb")
        out = []
        for _ in calls:
            head = f.readline().split()
            if len(head) != 2:
                raise RuntimeError("the tool channel closed")
            data = f.read(int(head[1]))
            if head[0] == b"ok":
                out.append((True, _ptc_json.loads(data)))
            else:
                out.append((False, data.decode("utf-8", "replace")))
        return out


def _ptc_flush(spins=0):
    global _ptc_flush_at
    loop = _ptc_asyncio.get_running_loop()
    # let every task that can still run make its calls first
    if getattr(loop, "_ready", None) and spins < 100:
        loop.call_soon(_ptc_flush, spins + 1)
        return
    _ptc_flush_at = None
    batch = _ptc_pending[:]
    del _ptc_pending[:]
    try:
        answers = _ptc_exchange([{"name": n, "input": i} for n, i, _ in batch])
    except BaseException as e:
        for _, _, fut in batch:
            if not fut.done():
                fut.set_exception(RuntimeError("tool channel failed: %s" % e))
        return
    for (name, _, fut), (ok, value) in zip(batch, answers):
        if fut.done():
            continue
        if ok:
            fut.set_result(value)
        else:
            fut.set_exception(ToolExecutionError(value, name))


async def _ptc_call(name, args):
    global _ptc_flush_at
    loop = _ptc_asyncio.get_running_loop()
    fut = loop.create_future()
    _ptc_pending.append((name, args, fut))
    if _ptc_flush_at is None:
        _ptc_flush_at = loop.call_soon(_ptc_flush)
    return await fut


def _ptc_args(given, extra):
    args = {k: v for k, v in given.items() if v is not None}
    args.update(extra)
    return args
"#;

const PYTHON_MAIN: &str = r#"

def _ptc_run(source):
    filename = "<code>"
    _ptc_linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    code = compile(source, filename, "exec", flags=_ptc_ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)

    async def main():
        result = eval(code, globals())
        if _ptc_asyncio.iscoroutine(result):
            await result

    _ptc_asyncio.run(main())


_ptc_run(_PTC_CODE)
"#;

fn python_program(tools: &[ToolDef], code: &str) -> String {
    let mut s = String::with_capacity(code.len() + 4096);
    s.push_str(PYTHON_RUNTIME);
    s.push_str(&format!("\n_PTC_PORT = {TOOLS_PORT}\n"));
    for t in tools {
        let params = parameters(t.parameters.as_ref());
        let mut sig: Vec<String> = params
            .iter()
            .map(|(p, req)| if *req { p.clone() } else { format!("{p}=None") })
            .collect();
        sig.push("**_ptc_kw".to_owned());
        let given: Vec<String> = params
            .iter()
            .map(|(p, _)| format!("{}: {p}", json_str(p)))
            .collect();
        s.push_str(&format!(
            "\n\nasync def {}({}):\n    return await _ptc_call({}, _ptc_args({{{}}}, _ptc_kw))\n",
            python_name(&t.name),
            sig.join(", "),
            json_str(&t.name),
            given.join(", "),
        ));
    }
    // a JSON string is a Python string literal (serde_json escapes only
    // quotes, backslashes and control characters)
    s.push_str(&format!("\n\n_PTC_CODE = {}\n", json_str(code)));
    s.push_str(PYTHON_MAIN);
    s
}

fn json_str(s: &str) -> String {
    Value::String(s.to_owned()).to_string()
}

/// `s` as a single-quoted shell word.
fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

const BASH_RUNTIME: &str = r#"__kiln_ptc_call() {
  local LC_ALL=C __kiln_in="${2-}" __kiln_body __kiln_fd __kiln_head __kiln_len __kiln_out
  [ -n "$__kiln_in" ] || __kiln_in='{}'
  __kiln_body="[{\"name\":$1,\"input\":$__kiln_in}]"
  exec {__kiln_fd}<>"/dev/tcp/127.0.0.1/__KILN_PORT__" || { echo "tool channel unavailable" >&2; return 2; }
  printf '%s\n%s' "${#__kiln_body}" "$__kiln_body" >&"$__kiln_fd"
  IFS=' ' read -r __kiln_head __kiln_len <&"$__kiln_fd"
  __kiln_out=
  if [ "${__kiln_len:-0}" -gt 0 ] 2>/dev/null; then
    IFS= read -r -d '' -N "$__kiln_len" __kiln_out <&"$__kiln_fd"
  fi
  exec {__kiln_fd}>&-
  case "$__kiln_head" in
    ok) printf '%s\n' "$__kiln_out" ;;
    err) printf '%s\n' "$__kiln_out" >&2; return 1 ;;
    *) echo "tool channel closed" >&2; return 2 ;;
  esac
}
"#;

fn bash_program(tools: &[ToolDef], code: &str) -> String {
    let mut s = BASH_RUNTIME.replace("__KILN_PORT__", &TOOLS_PORT.to_string());
    for t in tools {
        s.push_str(&format!(
            "{}() {{ __kiln_ptc_call {} \"$@\"; }}\n",
            bash_name(&t.name),
            shell_quote(&json_str(&t.name)),
        ));
    }
    s.push_str(code);
    if !code.ends_with('\n') {
        s.push('\n');
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_normalised_like_the_client() {
        assert_eq!(python_name("get-weather now"), "get_weather_now");
        assert_eq!(python_name("mcp.server/tool"), "mcpservertool");
        assert_eq!(python_name("3d"), "_3d");
        assert_eq!(python_name("class"), "class_tool");
        assert_eq!(bash_name("mcp.server-x"), "mcp_server_x");
        assert_eq!(bash_name("local"), "local_tool");
        assert_eq!(bash_name("print"), "print");
    }

    #[test]
    fn python_stubs_take_required_parameters_first() {
        let tools = [ToolDef {
            name: "get-weather".into(),
            parameters: Some(serde_json::json!({
                "type": "object",
                "properties": {"city": {"type": "string"}, "units": {"type": "string"},
                               "bad name": {}, "class": {}},
                "required": ["units"]
            })),
        }];
        let p = python_program(&tools, "print(1)");
        assert!(
            p.contains("async def get_weather(units, city=None, **_ptc_kw):"),
            "{p}"
        );
        assert!(p.contains(
            r#"_ptc_call("get-weather", _ptc_args({"units": units, "city": city}, _ptc_kw))"#
        ));
        assert!(p.contains(r#"_PTC_CODE = "print(1)""#));
    }

    #[test]
    fn bash_functions_pass_the_declared_name() {
        let tools = [ToolDef {
            name: "it's.x".into(),
            parameters: None,
        }];
        let p = bash_program(&tools, "its_x '{}'");
        assert!(
            p.contains(r#"its_x() { __kiln_ptc_call '"it'\''s.x"' "$@"; }"#),
            "{p}"
        );
        assert!(p.ends_with("its_x '{}'\n"));
        assert!(p.contains("/dev/tcp/127.0.0.1/81"));
    }
}
