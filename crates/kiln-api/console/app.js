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

async function uploadInputs() {
  const files = $("files").files;
  if (!files || files.length === 0) return [];
  const form = new FormData();
  for (const f of files) form.append("file", f, f.name);
  const r = await json("/v1/upload", { method: "POST", body: form });
  const sid = r.storage_session_id || r.session_id;
  return r.files.map((f) => ({ id: f.fileId, session_id: sid, name: f.filename }));
}

function appendOutput(kind, text) {
  const out = $("output");
  const span = el("span", { class: kind }, text);
  out.append(span);
  out.scrollTop = out.scrollHeight;
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

async function run() {
  if (current) return;
  const lang = $("lang").value;
  $("output").textContent = "";
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
  $("run-state").textContent = `done: ${code}, ${how}`;
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
  const list = $("outputs");
  const files = (res.files || []).filter((f) => !f.inherited);
  if (files.length) list.append(el("h3", {}, "Files"));
  for (const f of files) list.append(await fileView(f, res.session_id));
}

async function fileView(f, sessionId) {
  const sid = f.storage_session_id || sessionId;
  const box = el("div", { class: "file" });
  const r = await api(`/v1/download/${encodeURIComponent(sid)}/${encodeURIComponent(f.id)}`);
  if (!r.ok) {
    box.append(el("span", {}, f.name), " ", el("span", { class: "error" }, `download failed: HTTP ${r.status}`));
    return box;
  }
  const blob = await r.blob();
  const url = URL.createObjectURL(blob);
  const a = el("a", { href: url, download: f.name.split("/").pop(), class: "download" }, f.name);
  box.append(a, " ", el("span", { class: "muted" }, bytes(blob.size)));
  const lower = f.name.toLowerCase();
  if (/\.(png|jpe?g|gif|webp|svg)$/.test(lower)) {
    box.append(el("img", { src: url, alt: f.name }));
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
  await refreshRuns();
  await refreshEgress();
  $("ops-updated").textContent = `updated ${new Date().toLocaleTimeString()}`;
  if (!$("operations").hidden) opsTimer = setTimeout(() => refreshOps().catch(fail), 5000);
}

async function refreshRuns() {
  const q = new URLSearchParams();
  if ($("runs-lang").value) q.set("lang", $("runs-lang").value);
  if ($("runs-status").value) q.set("status", $("runs-status").value);
  const runs = await json(`/v1/admin/runs?${q}`);
  const box = $("runs");
  box.textContent = "";
  if (!runs.length) {
    box.append(el("p", { class: "muted" }, "no runs kept"));
    return;
  }
  box.append(table(["started", "run", "status", "language", "principal", "exit", "wall", "CPU", "memory"],
    runs.map((r) => [
      new Date(r.created_at_ms).toLocaleTimeString(),
      r.run_id,
      r.status,
      r.lang,
      r.principal,
      r.exit_code === null || r.exit_code === undefined ? "" : r.exit_code,
      r.usage ? ms(r.usage.wall_time_ms) : "",
      r.usage ? ms(r.usage.cpu_time_ms) : "",
      r.usage ? bytes(r.usage.memory_peak_bytes) : "",
    ]), "runs-table"));
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
