// Kiln's operator console. Plain JS, no framework, no build step at run
// time. Every request carries the key from sessionStorage as X-API-Key;
// nothing secret goes into a URL or into the page. Server data reaches the
// DOM through textContent only.
"use strict";

const KEY = "kiln.apiKey";
const USER = "kiln.userId";
const $ = (id) => document.getElementById(id);

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v;
    else e.setAttribute(k, v);
  }
  for (const c of children) {
    if (c === null || c === undefined) continue;
    e.append(c instanceof Node ? c : String(c));
  }
  return e;
}

function authHeaders(extra) {
  const h = Object.assign({}, extra || {});
  const key = sessionStorage.getItem(KEY);
  if (key) h["X-API-Key"] = key;
  h["User-Id"] = sessionStorage.getItem(USER) || "console";
  return h;
}

class Unauthorized extends Error {}

async function api(path, opts) {
  const o = Object.assign({}, opts || {});
  o.headers = authHeaders(o.headers);
  const r = await fetch(path, o);
  if (r.status === 401) {
    showLogin("The server refused the key.");
    throw new Unauthorized("401");
  }
  return r;
}

async function json(path, opts) {
  const r = await api(path, opts);
  if (!r.ok) throw new Error(`${path}: HTTP ${r.status} ${await r.text()}`);
  return r.json();
}

// ---------- log-in and navigation ----------

let status = null;

async function boot() {
  const r = await fetch("/v1/admin/status", { headers: authHeaders() });
  if (r.status === 401) {
    showLogin(sessionStorage.getItem(KEY) ? "The server refused the key." : "");
    return;
  }
  if (!r.ok) {
    showLogin(`The server answered HTTP ${r.status}.`);
    return;
  }
  status = await r.json();
  $("login").hidden = true;
  $("nav").hidden = false;
  $("logout").hidden = status.auth === "none";
  $("server").textContent = `v${status.version} · auth ${status.auth}`;
  setupPlayground(status);
  route();
}

function showLogin(message) {
  for (const s of ["playground", "operations"]) $(s).hidden = true;
  $("nav").hidden = true;
  $("login").hidden = false;
  $("login-error").textContent = message || "";
  $("api-key").focus();
}

$("login-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  sessionStorage.setItem(KEY, $("api-key").value);
  sessionStorage.setItem(USER, $("user-id").value.trim() || "console");
  $("api-key").value = "";
  // what the editor holds, for the browser test (the same text Run sends)
window.kilnConsole = { code: () => (editor ? editor.getValue() : null) };

boot().catch(fail);
});

$("logout").addEventListener("click", () => {
  sessionStorage.removeItem(KEY);
  sessionStorage.removeItem(USER);
  showLogin("Logged out.");
});

function route() {
  if (!status) return;
  const page = location.hash === "#operations" ? "operations" : "playground";
  for (const s of ["playground", "operations"]) {
    $(s).hidden = s !== page;
    const link = $(`nav-${s}`);
    if (s === page) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
  if (page === "operations") refreshOps().catch(fail);
}
window.addEventListener("hashchange", route);

function fail(e) {
  if (e instanceof Unauthorized) return;
  console.error(e);
  $("run-state").textContent = String(e.message || e);
}

// ---------- playground ----------

const SAMPLES = {
  py: 'print("Hello from Kiln")\n',
  js: 'console.log("Hello from Kiln");\n',
  ts: 'const who: string = "Kiln";\nconsole.log(`Hello from ${who}`);\n',
  c: '#include <stdio.h>\n\nint main(void) {\n    puts("Hello from Kiln");\n    return 0;\n}\n',
  cpp: '#include <iostream>\n\nint main() {\n    std::cout << "Hello from Kiln" << std::endl;\n}\n',
  java: 'public class Main {\n    public static void main(String[] args) {\n        System.out.println("Hello from Kiln");\n    }\n}\n',
  php: '<?php\necho "Hello from Kiln\\n";\n',
  rs: 'fn main() {\n    println!("Hello from Kiln");\n}\n',
  go: 'package main\n\nimport "fmt"\n\nfunc main() {\n\tfmt.Println("Hello from Kiln")\n}\n',
  d: 'import std.stdio;\n\nvoid main() {\n    writeln("Hello from Kiln");\n}\n',
  f90: 'program hello\n  print *, "Hello from Kiln"\nend program hello\n',
  r: 'cat("Hello from Kiln\\n")\n',
  bash: 'echo "Hello from Kiln"\n',
};

let editor = null;
let current = null; // { runId, controller }

function makeEditor(lang) {
  const host = $("editor");
  if (window.KilnEditor) {
    host.dataset.kind = "codemirror";
    // CodeMirror adds style elements: they carry the page's CSP nonce
    const meta = document.querySelector('meta[name="kiln-style-nonce"]');
    const nonce = meta ? meta.content : undefined;
    return window.KilnEditor.create(host, { doc: SAMPLES[lang] || "", lang, onRun: run, nonce });
  }
  const ta = el("textarea", { class: "editor", id: "code", spellcheck: "false", "aria-label": "Code" });
  ta.value = SAMPLES[lang] || "";
  ta.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) {
      e.preventDefault();
      run();
    }
  });
  host.replaceWith(ta);
  return {
    getValue: () => ta.value,
    setValue: (t) => { ta.value = t; },
    setLanguage: () => {},
    focus: () => ta.focus(),
    kind: "textarea",
  };
}

function setupPlayground(st) {
  const select = $("lang");
  const runsLang = $("runs-lang");
  if (select.options.length === 0) {
    for (const l of st.languages) {
      const label = l.available ? `${l.name} — ${l.version || ""}` : `${l.name} (unavailable: ${l.reason || ""})`;
      select.append(el("option", { value: l.name }, label));
      runsLang.append(el("option", { value: l.name }, l.name));
    }
    const first = st.languages.find((l) => l.available && l.name === "py") || st.languages.find((l) => l.available);
    if (first) select.value = first.name;
  }
  if (!editor) editor = makeEditor(select.value);
  select.onchange = () => {
    const previous = editor.getValue();
    const isSample = Object.values(SAMPLES).includes(previous) || previous.trim() === "";
    editor.setLanguage(select.value);
    if (isSample) editor.setValue(SAMPLES[select.value] || "");
  };
}

$("run").addEventListener("click", () => run());
$("cancel").addEventListener("click", () => cancel().catch(fail));

// The chosen input files are uploaded once, on the first run after they
// were chosen; later runs pass the same stored files again. Clear forgets them.
let inputs = null; // the references of the chosen files, once uploaded

async function uploadInputs() {
  const files = $("files").files;
  if (!files || files.length === 0) return [];
  if (inputs) return inputs;
  const form = new FormData();
  for (const f of files) form.append("file", f, f.name);
  const r = await json("/v1/upload", { method: "POST", body: form });
  const sid = r.storage_session_id || r.session_id;
  inputs = r.files.map((f) => ({ id: f.fileId, session_id: sid, name: f.filename }));
  showInputs();
  return inputs;
}

function showInputs() {
  const files = $("files").files;
  const n = files ? files.length : 0;
  $("files-clear").hidden = n === 0;
  $("files-state").textContent = n === 0 ? "" : inputs ? `${n} uploaded, passed to every run` : `${n} chosen, uploaded on the next run`;
}

$("files").addEventListener("change", () => {
  inputs = null;
  if (session) session.files = false;
  showInputs();
});
$("files-clear").addEventListener("click", () => {
  $("files").value = "";
  inputs = null;
  showInputs();
});

// Output arrives in many small events: they are gathered and added to the
// page once per animation frame (one text node per stream switch, one
// scroll), so a chatty program does not cost a layout per event.
const pending = [];
let frame = 0;

function appendOutput(kind, text) {
  const last = pending[pending.length - 1];
  if (last && last[0] === kind) last[1] += text;
  else pending.push([kind, text]);
  if (!frame) frame = requestAnimationFrame(flushOutput);
}

function flushOutput() {
  frame = 0;
  if (!pending.length) return;
  const out = $("output");
  for (const [kind, text] of pending.splice(0)) {
    const last = out.lastElementChild;
    if (last && last.className === kind) last.append(text);
    else out.append(el("span", { class: kind }, text));
  }
  out.scrollTop = out.scrollHeight;
}

function clearOutput() {
  pending.length = 0;
  if (frame) cancelAnimationFrame(frame);
  frame = 0;
  $("output").textContent = "";
}

// Reads a text/event-stream body and calls onEvent(name, data) per event.
async function readEvents(body, onEvent) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += value.replace(/\r\n?/g, "\n");
    let cut;
    while ((cut = buf.indexOf("\n\n")) >= 0) {
      const block = buf.slice(0, cut);
      buf = buf.slice(cut + 2);
      let name = "message";
      const data = [];
      for (const line of block.split("\n")) {
        if (line.startsWith(":")) continue; // keep-alive comment
        const i = line.indexOf(":");
        const field = i < 0 ? line : line.slice(0, i);
        let v = i < 0 ? "" : line.slice(i + 1);
        if (v.startsWith(" ")) v = v.slice(1);
        if (field === "event") name = v;
        else if (field === "data") data.push(v);
      }
      if (data.length) onEvent(name, data.join("\n"));
    }
  }
}

// ---------- session mode: cells in a live kernel (/v1/sessions) ----------

const SESSION_LANGS = ["py", "js"];
let session = null; // { id, lang, cells }

function sessionMode() {
  return $("mode").value === "session";
}

function showSession() {
  $("session-close").hidden = !session;
  $("session-state").textContent = session
    ? `session ${session.id} (${session.lang}), ${session.cells} cell${session.cells === 1 ? "" : "s"}`
    : sessionMode() ? "a session starts with the first run" : "";
}

async function closeSession() {
  const s = session;
  session = null;
  showSession();
  if (s) await api(`/v1/sessions/${encodeURIComponent(s.id)}`, { method: "DELETE" });
}

$("mode").addEventListener("change", () => {
  if (sessionMode() && !SESSION_LANGS.includes($("lang").value)) {
    $("run-state").textContent = "sessions are for py and js: switched to py";
    $("lang").value = "py";
    $("lang").onchange();
  }
  if (!sessionMode()) closeSession().catch(fail);
  clearOutput();
  showSession();
});
$("session-close").addEventListener("click", () => closeSession().catch(fail));

async function runCell() {
  const lang = $("lang").value;
  if (!SESSION_LANGS.includes(lang)) {
    $("run-state").textContent = "sessions are for py and js only";
    return;
  }
  if (session && session.lang !== lang) await closeSession();
  $("run").disabled = true;
  const controller = new AbortController();
  current = { runId: null, controller, session: true };
  try {
    if (!session) {
      $("run-state").textContent = "starting a session…";
      const r = await api("/v1/sessions", {
        method: "POST",
        headers: { "Content-Type": "application/json" },
        body: JSON.stringify({ lang }),
      });
      if (!r.ok) {
        appendOutput("stderr", `HTTP ${r.status}: ${await r.text()}\n`);
        $("run-state").textContent = "refused";
        return;
      }
      const created = await r.json();
      session = { id: created.session_id, lang, cells: 0, files: false };
      showSession();
    }
    await putInputs();
    session.cells += 1;
    const n = session.cells;
    showSession();
    appendOutput("cell", `In [${n}]:\n`);
    $("usage").textContent = "";
    $("outputs").textContent = "";
    $("cancel").disabled = false;
    $("run-state").textContent = "running…";
    const r = await api(`/v1/sessions/${encodeURIComponent(session.id)}/exec`, {
      method: "POST",
      headers: { "Content-Type": "application/json", Accept: "text/event-stream" },
      body: JSON.stringify({ code: editor.getValue() }),
      signal: controller.signal,
    });
    if (!r.ok || !(r.headers.get("Content-Type") || "").startsWith("text/event-stream")) {
      appendOutput("stderr", `HTTP ${r.status}: ${await r.text()}\n`);
      $("run-state").textContent = "refused";
      if (r.status === 404 || r.status === 410) { session = null; showSession(); }
      return;
    }
    let result = null;
    await readEvents(r.body, (name, data) => {
      const d = JSON.parse(data);
      if (name === "stdout" || name === "stderr") appendOutput(name, d.text);
      else if (name === "result") result = d;
      else if (name === "error") {
        appendOutput("stderr", `${d.error}: ${d.message || ""}\n`);
        $("run-state").textContent = "failed";
        if (d.status === 404 || d.status === 410) { session = null; showSession(); }
      }
    });
    if (result) await showCell(result, n);
  } catch (e) {
    if (e.name === "AbortError") $("run-state").textContent = "stopped watching";
    else fail(e);
  } finally {
    flushOutput();
    current = null;
    $("run").disabled = false;
    $("cancel").disabled = true;
  }
}

// In a session the chosen input files are written into the kernel's
// /mnt/data once (again when others are chosen).
async function putInputs() {
  const files = $("files").files;
  if (session.files || !files || !files.length) return;
  for (const f of files) {
    const path = f.name.split("/").map(encodeURIComponent).join("/");
    const r = await api(`/v1/sessions/${encodeURIComponent(session.id)}/files/${path}`, { method: "PUT", body: f });
    if (!r.ok) throw new Error(`${f.name}: HTTP ${r.status} ${await r.text()}`);
  }
  session.files = true;
  $("files-state").textContent = `${files.length} written to the session's /mnt/data`;
}

async function showCell(res, n) {
  if (res.error) {
    const tb = (res.error.traceback || []).join("");
    appendOutput("stderr", tb || `${res.error.ename}: ${res.error.evalue}\n`);
  }
  if (res.result && res.result.text !== undefined && res.result.text !== null) {
    appendOutput("result", `Out[${n}]: ${res.result.text}\n`);
  }
  flushOutput();
  $("run-state").textContent = `done: ${res.status}`;
  const u = res.usage || {};
  defs($("usage"), [
    ["status", res.status],
    ["wall", ms(u.wall_time_ms)],
    ["CPU", ms(u.cpu_time_ms)],
    ["memory peak", bytes(u.memory_peak_bytes)],
  ]);
  const list = $("outputs");
  if (res.result && res.result.png) {
    const png = Uint8Array.from(atob(res.result.png), (c) => c.charCodeAt(0));
    const url = URL.createObjectURL(new Blob([png], { type: "image/png" }));
    list.append(el("img", { src: url, alt: `Out[${n}]`, class: "result-png" }));
  }
  if (res.files && res.files.length) list.append(el("h3", {}, "Files"));
  for (const f of res.files || []) {
    list.append(await downloadView(f.path, `/v1/sessions/${encodeURIComponent(session.id)}/files/${f.path.split("/").map(encodeURIComponent).join("/")}`));
  }
}

async function run() {
  if (current) return;
  if (sessionMode()) return runCell();
  const lang = $("lang").value;
  clearOutput();
  $("outputs").textContent = "";
  $("usage").textContent = "";
  $("run").disabled = true;
  $("run-state").textContent = "uploading…";
  const controller = new AbortController();
  current = { runId: null, controller };
  try {
    const files = await uploadInputs();
    $("run-state").textContent = "starting…";
    const body = { lang, code: editor.getValue() };
    if (files.length) body.files = files;
    const r = await api("/v1/exec", {
      method: "POST",
      headers: { "Content-Type": "application/json", Accept: "text/event-stream" },
      body: JSON.stringify(body),
      signal: controller.signal,
    });
    current.runId = r.headers.get("X-Kiln-Run-Id");
    $("cancel").disabled = !current.runId;
    if (!r.ok || !(r.headers.get("Content-Type") || "").startsWith("text/event-stream")) {
      appendOutput("stderr", `HTTP ${r.status}: ${await r.text()}`);
      $("run-state").textContent = "refused";
      return;
    }
    let result = null;
    await readEvents(r.body, (name, data) => {
      const d = JSON.parse(data);
      if (name === "queued") $("run-state").textContent = `queued (${d.position} ahead)`;
      else if (name === "started") $("run-state").textContent = `running (${d.step})…`;
      else if (name === "stdout" || name === "stderr") appendOutput(name, d.text);
      else if (name === "result") result = d;
      else if (name === "error") {
        appendOutput("stderr", `error ${d.status}: ${JSON.stringify(d.error)}`);
        $("run-state").textContent = "failed";
      }
    });
    flushOutput();
    if (result) await showResult(result);
  } catch (e) {
    if (e.name === "AbortError") $("run-state").textContent = "stopped watching";
    else fail(e);
  } finally {
    current = null;
    $("run").disabled = false;
    $("cancel").disabled = true;
  }
}

async function cancel() {
  if (current && current.session && session) {
    $("run-state").textContent = "interrupting…";
    await api(`/v1/sessions/${encodeURIComponent(session.id)}/interrupt`, { method: "POST" });
    return;
  }
  if (!current || !current.runId) return;
  $("run-state").textContent = "cancelling…";
  await api(`/v1/runs/${encodeURIComponent(current.runId)}/cancel`, { method: "POST" });
}

function ms(v) {
  return v === null || v === undefined ? "n/a" : `${v} ms`;
}

function bytes(v) {
  if (v === null || v === undefined) return "n/a";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (v >= 1024 && i < units.length - 1) { v /= 1024; i++; }
  return `${i ? v.toFixed(1) : v} ${units[i]}`;
}

function defs(target, pairs) {
  target.textContent = "";
  for (const [k, v] of pairs) {
    target.append(el("div", {}, el("dt", {}, k), el("dd", {}, v)));
  }
}

async function showResult(res) {
  const how = res.status ? `${res.status}${res.message ? " — " + res.message : ""}` : "ok";
  const code = res.code === null || res.code === undefined ? res.signal || "killed" : `exit ${res.code}`;
  const pairs = [["status", how], ["exit", code], ["wall", ms(res.wall_time)]];
  if (current && current.runId) {
    const view = await json(`/v1/runs/${encodeURIComponent(current.runId)}`);
    const u = view.usage && (view.usage.run || view.usage.compile);
    if (u) {
      pairs[2] = ["wall", ms(u.wall_time_ms)];
      pairs.push(["CPU", ms(u.cpu_time_ms)], ["memory peak", bytes(u.memory_peak_bytes)]);
    }
    if (view.usage && view.usage.compile && view.usage.run) {
      pairs.push(["compile wall", ms(view.usage.compile.wall_time_ms)]);
    }
  }
  defs($("usage"), pairs);
  // "done" once the usage is shown (the files follow)
  $("run-state").textContent = `done: ${code}, ${how}`;
  const list = $("outputs");
  const files = (res.files || []).filter((f) => !f.inherited);
  if (files.length) list.append(el("h3", {}, "Files"));
  for (const f of files) list.append(await fileView(f, res.session_id));
}

async function fileView(f, sessionId) {
  const sid = f.storage_session_id || sessionId;
  return downloadView(f.name, `/v1/download/${encodeURIComponent(sid)}/${encodeURIComponent(f.id)}`);
}

// A file fetched with the key into a blob: a download link, images inline,
// CSV as a table.
async function downloadView(name, path) {
  const box = el("div", { class: "file" });
  const r = await api(path);
  if (!r.ok) {
    box.append(el("span", {}, name), " ", el("span", { class: "error" }, `download failed: HTTP ${r.status}`));
    return box;
  }
  const blob = await r.blob();
  const url = URL.createObjectURL(blob);
  const a = el("a", { href: url, download: name.split("/").pop(), class: "download" }, name);
  box.append(a, " ", el("span", { class: "muted" }, bytes(blob.size)));
  const lower = name.toLowerCase();
  if (/\.(png|jpe?g|gif|webp|svg)$/.test(lower)) {
    box.append(el("img", { src: url, alt: name }));
  } else if (lower.endsWith(".csv")) {
    box.append(csvTable(await blob.text(), 50));
  }
  return box;
}

// A small CSV reader (RFC 4180 quotes) for a preview.
function parseCsv(text, maxRows) {
  const rows = [];
  let row = [], field = "", q = false;
  for (let i = 0; i < text.length && rows.length < maxRows; i++) {
    const c = text[i];
    if (q) {
      if (c === '"' && text[i + 1] === '"') { field += '"'; i++; }
      else if (c === '"') q = false;
      else field += c;
    } else if (c === '"') q = true;
    else if (c === ",") { row.push(field); field = ""; }
    else if (c === "\n" || c === "\r") {
      if (c === "\r" && text[i + 1] === "\n") i++;
      row.push(field); rows.push(row); row = []; field = "";
    } else field += c;
  }
  if ((field !== "" || row.length) && rows.length < maxRows) { row.push(field); rows.push(row); }
  return rows;
}

function csvTable(text, maxRows) {
  const rows = parseCsv(text, maxRows + 1);
  const table = el("table", { class: "csv" });
  if (!rows.length) return table;
  table.append(el("thead", {}, el("tr", {}, ...rows[0].map((h) => el("th", { scope: "col" }, h)))));
  const body = el("tbody");
  for (const r of rows.slice(1, maxRows + 1)) body.append(el("tr", {}, ...r.map((c) => el("td", {}, c))));
  table.append(body);
  return table;
}

// ---------- operations ----------

let opsTimer = null;

async function refreshOps() {
  clearTimeout(opsTimer);
  const st = await json("/v1/admin/status");
  status = st;
  defs($("health"), [
    ["version", st.version],
    ["auth", st.auth],
    ["runs active", String(st.runs_active)],
    ["queue", `${st.queue.running} running, ${st.queue.queued} waiting, ${st.queue.capacity} slots`],
    ["languages", `${st.languages.filter((l) => l.available).length} of ${st.languages.length} available`],
  ]);
  const sb = st.sandbox;
  if (sb) {
    const yes = (b) => el("span", { class: b ? "ok" : "bad" }, b ? "yes" : "NO");
    defs($("sandbox"), [
      ["enforceable", yes(sb.enforceable)],
      ["kernel", sb.kernel],
      ["namespaces", yes(sb.user_namespaces)],
      ["cgroup limits", el("span", {}, yes(sb.cgroup_limits), " ", sb.cgroup)],
      ["seccomp", yes(sb.seccomp)],
      ["landlock", sb.landlock_abi ? `ABI ${sb.landlock_abi}` : "not used"],
      ["workspace quota", sb.workspace_quota],
      ...sb.problems.map((p) => ["problem", el("span", { class: "bad" }, p)]),
      ...sb.warnings.map((w) => ["warning", w]),
      ...sb.degraded.map((d) => ["degraded", el("span", { class: "bad" }, d)]),
    ]);
  } else {
    $("sandbox").textContent = "not reported";
  }
  const pool = $("pool");
  pool.textContent = "";
  if (st.warm_pool.length) {
    pool.append(table(["profile", "ready", "target", "hits", "misses", "built", "failures"],
      st.warm_pool.map((p) => [p.profile, p.ready, p.target, p.hits, p.misses, p.built, p.build_failures])));
  } else pool.append(el("p", { class: "muted" }, "warm pool off"));
  if (st.fork_servers.length) {
    for (const fs of st.fork_servers) {
      pool.append(el("p", {},
        `fork-server ${fs.template}: ${fs.alive ? "alive" : "DOWN"}, pid ${fs.pid}, preload ${fs.preload_ms} ms, RSS ${bytes(fs.rss_bytes)}`));
    }
  } else pool.append(el("p", {}, "fork-server: not running"));
  const stored = $("stored");
  stored.textContent = "";
  if (!st.stored) stored.append(el("p", { class: "error" }, "the store could not say"));
  else if (!st.stored.length) stored.append(el("p", { class: "muted" }, "nothing stored"));
  else stored.append(table(["owner", "bytes", "files"], st.stored.map((s) => [s.owner, bytes(s.bytes), s.files])));
  drawCharts(st);
  $("languages").textContent = "";
  $("languages").append(table(["language", "version", "available"],
    st.languages.map((l) => [l.name, l.version || "", l.available ? "yes" : `no: ${l.reason || ""}`])));
  await refreshKernels();
  await refreshRuns();
  await refreshEgress();
  $("ops-updated").textContent = `updated ${new Date().toLocaleTimeString()}`;
  if (!$("operations").hidden) opsTimer = setTimeout(() => refreshOps().catch(fail), 5000);
}

// LibreChat's status codes, in words (the runs table's "stopped" column)
const STOPS = {
  RE: "runtime error",
  SG: "signal",
  TO: "timeout",
  OL: "stdout over its cap",
  EL: "stderr over its cap",
  XX: "internal",
};

function exitText(r) {
  if (r.exit_code !== null && r.exit_code !== undefined) return String(r.exit_code);
  if (r.signal !== null && r.signal !== undefined) return `signal ${r.signal}`;
  return "";
}

async function refreshRuns() {
  const q = new URLSearchParams();
  if ($("runs-lang").value) q.set("lang", $("runs-lang").value);
  if ($("runs-status").value) q.set("status", $("runs-status").value);
  if ($("runs-stop").value) q.set("run_status", $("runs-stop").value);
  const runs = await json(`/v1/admin/runs?${q}`);
  const box = $("runs");
  box.textContent = "";
  if (!runs.length) {
    box.append(el("p", { class: "muted" }, "no runs kept"));
    return;
  }
  const t = table(["started", "run", "status", "stopped", "language", "principal", "exit", "wall", "CPU", "memory"],
    runs.map((r) => [
      new Date(r.created_at_ms).toLocaleTimeString(),
      runLink(r.run_id),
      r.status,
      r.run_status ? el("abbr", { title: STOPS[r.run_status] || "", class: "stop" }, r.run_status) : "",
      r.lang,
      r.principal,
      exitText(r),
      r.usage ? ms(r.usage.wall_time_ms) : "",
      r.usage ? ms(r.usage.cpu_time_ms) : "",
      r.usage ? bytes(r.usage.memory_peak_bytes) : "",
    ]), "runs-table");
  box.append(t);
}

function runLink(id) {
  const b = el("button", { type: "button", class: "link run-open", "data-run": id }, id);
  b.addEventListener("click", () => openRun(id).catch(fail));
  return b;
}

// One run whole, any owner's: its code, output, files and usage.
async function openRun(id) {
  const r = await json(`/v1/admin/runs/${encodeURIComponent(id)}`);
  const box = $("run-detail");
  $("run-detail-title").textContent = `Run ${r.run_id}`;
  const u = r.usage && (r.usage.run || r.usage.compile);
  const pairs = [
    ["status", r.status],
    ["stopped", r.run_status ? `${r.run_status} (${STOPS[r.run_status] || ""})` : "no"],
    ["exit", exitText(r) || "none"],
    ["language", r.lang],
    ["principal", r.principal],
    ["started", new Date(r.created_at_ms).toLocaleString()],
  ];
  if (r.message) pairs.push(["message", r.message]);
  if (u) pairs.push(["wall", ms(u.wall_time_ms)], ["CPU", ms(u.cpu_time_ms)], ["memory peak", bytes(u.memory_peak_bytes)]);
  if (r.usage && r.usage.compile && r.usage.run) pairs.push(["compile wall", ms(r.usage.compile.wall_time_ms)]);
  if (r.error) pairs.push(["error", `HTTP ${r.error.status}: ${JSON.stringify(r.error.body)}`]);
  defs($("run-detail-facts"), pairs);
  $("run-detail-code").textContent = r.code_truncated
    ? `${r.code}\n… (the first ${bytes(r.code.length)} of ${bytes(r.code_bytes)})`
    : r.code;
  const out = $("run-detail-output");
  out.textContent = "";
  if (r.stdout) out.append(el("span", { class: "stdout" }, r.stdout));
  if (r.stderr) out.append(el("span", { class: "stderr" }, r.stderr));
  const files = $("run-detail-files");
  files.textContent = "";
  if (r.inputs.length) {
    files.append(el("h4", {}, "Input files"),
      table(["name", "bytes"], r.inputs.map((f) => [f.name, bytes(f.bytes)]), "run-detail-inputs"));
  }
  const made = r.files.filter((f) => !f.inherited);
  if (made.length) files.append(el("h4", {}, "Files"));
  for (const f of made) {
    const path = `/v1/admin/runs/${encodeURIComponent(r.run_id)}/files/${encodeURIComponent(f.id)}`;
    files.append(await downloadView(f.name, path));
  }
  box.hidden = false;
  box.scrollIntoView({ block: "start" });
}
$("run-detail-close").addEventListener("click", () => { $("run-detail").hidden = true; });

async function refreshKernels() {
  const box = $("kernels");
  const r = await api("/v1/admin/kernels");
  if (r.status === 503) {
    box.textContent = "";
    box.append(el("p", { class: "muted" }, "sessions are off"));
    return;
  }
  if (!r.ok) throw new Error(`/v1/admin/kernels: HTTP ${r.status} ${await r.text()}`);
  const kernels = await r.json();
  box.textContent = "";
  if (!kernels.length) {
    box.append(el("p", { class: "muted" }, "no live kernels"));
    return;
  }
  box.append(table(["session", "owner", "language", "age", "idle", "evaluations", "state", "memory", ""],
    kernels.map((k) => {
      const close = el("button", { type: "button", class: "kernel-close", "data-session": k.session_id }, "Close");
      close.addEventListener("click", async () => {
        close.disabled = true;
        const r = await api(`/v1/admin/kernels/${encodeURIComponent(k.session_id)}`, { method: "DELETE" });
        if (!r.ok && r.status !== 404) fail(new Error(`close ${k.session_id}: HTTP ${r.status}`));
        if (session && session.id === k.session_id) { session = null; showSession(); }
        await refreshKernels();
      });
      return [
        k.session_id,
        k.owner,
        k.lang,
        duration(k.age_secs),
        duration(Math.max(0, Math.round((Date.now() - k.last_used_at_ms) / 1000))),
        k.evaluations,
        k.lost ? el("span", { class: "bad" }, `lost: ${k.lost}`) : k.busy ? "busy" : "idle",
        bytes(k.memory_bytes),
        close,
      ];
    }), "kernels-table"));
}

function duration(secs) {
  if (secs < 60) return `${secs} s`;
  if (secs < 3600) return `${Math.floor(secs / 60)} min ${secs % 60} s`;
  return `${Math.floor(secs / 3600)} h ${Math.floor((secs % 3600) / 60)} min`;
}

async function refreshEgress() {
  const calls = await json("/v1/admin/egress?limit=50");
  const box = $("egress");
  box.textContent = "";
  if (!calls.length) {
    box.append(el("p", { class: "muted" }, "no calls through the services gateway"));
    return;
  }
  box.append(table(["started", "user", "held by", "service", "call", "status", "outcome", "up", "down", "took"],
    calls.map((c) => [
      new Date(c.started_at_ms).toLocaleTimeString(),
      c.user_id,
      c.owner,
      c.service,
      `${c.method} ${c.path}`,
      c.status,
      c.outcome,
      bytes(c.bytes_up),
      bytes(c.bytes_down),
      ms(c.duration_ms),
    ]), "egress-table"));
}
$("runs-lang").addEventListener("change", () => refreshRuns().catch(fail));
$("runs-status").addEventListener("change", () => refreshRuns().catch(fail));
$("runs-stop").addEventListener("change", () => refreshRuns().catch(fail));
$("refresh").addEventListener("click", () => refreshOps().catch(fail));

function table(head, rows, id) {
  const t = el("table", id ? { id } : {});
  t.append(el("thead", {}, el("tr", {}, ...head.map((h) => el("th", { scope: "col" }, h)))));
  const body = el("tbody");
  for (const r of rows) body.append(el("tr", {}, ...r.map((c) => el("td", {}, c))));
  t.append(body);
  return t;
}

const SVG = "http://www.w3.org/2000/svg";

function chart(title, points, fmt) {
  const w = 300, h = 60;
  const svg = document.createElementNS(SVG, "svg");
  svg.setAttribute("viewBox", `0 0 ${w} ${h}`);
  svg.setAttribute("preserveAspectRatio", "none");
  svg.setAttribute("role", "img");
  // one sample still draws: a flat line across
  if (points.length === 1) points = [[points[0][0] - 1, points[0][1]], points[0]];
  const max = Math.max(1, ...points.map((p) => p[1]));
  const t0 = points.length ? points[0][0] : 0;
  const span = Math.max(1, (points.length ? points[points.length - 1][0] : 1) - t0);
  const line = document.createElementNS(SVG, "polyline");
  line.setAttribute("points", points.map(([t, v]) =>
    `${((t - t0) / span * w).toFixed(1)},${(h - 2 - v / max * (h - 4)).toFixed(1)}`).join(" "));
  svg.append(line);
  const last = points.length ? points[points.length - 1][1] : 0;
  const peak = Math.max(0, ...points.map((p) => p[1]));
  const label = `${title}: now ${fmt(last)}, peak ${fmt(peak)}`;
  svg.setAttribute("aria-label", label);
  return el("figure", { class: "chart" }, svg, el("figcaption", {}, label));
}

function drawCharts(st) {
  const box = $("charts");
  box.textContent = "";
  const hist = st.history;
  const series = (k) => hist.map((s) => [s.at_ms, s[k]]);
  const n = (v) => String(v);
  box.append(
    chart("runs active", series("runs_active"), n),
    chart("runs queued", series("queued"), n),
    chart(`runs finished per ${st.sample_every_secs} s`, series("finished"), n),
    chart("warm jails ready", series("warm_ready"), n),
    chart("Kiln memory (RSS)", series("rss_bytes"), bytes),
  );
}

// what the editor holds, for the browser test (the same text Run sends)
window.kilnConsole = { code: () => (editor ? editor.getValue() : null) };

boot().catch(fail);
