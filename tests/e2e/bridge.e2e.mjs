// End-to-end test: @librechat/agents' `cloudflare-sandbox` engine (the sandbox bridge runtime and
// its coding tools) against a real Kiln server's `/v1/sandbox` face.
//
// Owns: `createCloudflareBridgeRuntime` + `createCloudflareCodingTools` exactly as LibreChat builds
// them for the `cloudflare-sandbox` engine — editing, searching (ripgrep) and running a small
// project, `execute_code` in py and js, output streamed before the exit, timeouts (the client's and
// Kiln's), isolation between two sandboxes and between two principals, a wrong key refused.
// Nothing about Kiln is mocked.
//
// Not named `*.test.mjs`: `node --test` in this directory (the LibreChat Code API suite) does not
// pick it up. Run by crates/kiln/tests/e2e_bridge.rs, which starts a server (auth `api-key,jwt`) and
// passes: KILN_BASE (the server's root URL; the runtime adds `/v1`), KILN_API_KEY (the shared key,
// sent as the runtime's bearer; the principal is then the `User-Id` header, which a host adds
// through the runtime's `fetch` option) and KILN_TOKEN (a CodeAPI JWT of user `carol`, valid for a
// few minutes: the suite uses it first).

import assert from 'node:assert/strict';
import { describe, it } from 'node:test';

import { createCloudflareBridgeRuntime, createCloudflareCodingTools } from '@librechat/agents';

const BASE = (process.env.KILN_BASE || '').replace(/\/+$/, '');
const API_KEY = process.env.KILN_API_KEY || '';
const TOKEN = process.env.KILN_TOKEN || '';
const STEP_TIMEOUT_MS = 120_000;

assert.ok(BASE && API_KEY && TOKEN, 'KILN_BASE, KILN_API_KEY and KILN_TOKEN are required');

/** `fetch` sending `User-Id: user` beside the runtime's own headers. */
function as(user) {
  return (url, init = {}) => {
    const headers = new Headers(init.headers);
    headers.set('User-Id', user);
    return fetch(url, { ...init, headers });
  };
}

/** A bridge runtime of `user` (the shared key) and the coding tools on it, by name. */
function agent(user, extra = {}) {
  const runtime = createCloudflareBridgeRuntime({ baseURL: BASE, apiKey: API_KEY, fetch: as(user), ...extra });
  const tools = createCloudflareCodingTools({ sandbox: runtime, timeoutMs: 60_000, ...extra.tools });
  const byName = Object.fromEntries(tools.map((t) => [t.name, t]));
  let calls = 0;
  /** One tool call as the agent graph makes it: the ToolMessage (content and artifact). */
  async function call(name, args) {
    assert.ok(byName[name], `the package gives a ${name} tool`);
    calls += 1;
    return byName[name].invoke({ id: `call_${calls}`, name, args, type: 'tool_call' });
  }
  return { runtime, call, names: Object.keys(byName) };
}

const text = (msg) => (typeof msg.content === 'string' ? msg.content : JSON.stringify(msg.content));

describe('the cloudflare-sandbox engine against Kiln', { timeout: 600_000 }, () => {
  it('accepts a CodeAPI token as the bearer (JWT auth)', { timeout: STEP_TIMEOUT_MS }, async () => {
    const carol = createCloudflareBridgeRuntime({ baseURL: BASE, apiKey: TOKEN });
    const r = await carol.exec('echo carol > mine.txt && cat mine.txt');
    assert.equal(r.stdout, 'carol\n');
    // another principal cannot use carol's sandbox by its id
    const alice = createCloudflareBridgeRuntime({ baseURL: BASE, apiKey: API_KEY, fetch: as('alice'), sandboxId: await carol.getSandboxId() });
    await assert.rejects(alice.readFile('mine.txt'), /\(404\)/);
  });

  const a = agent('alice');

  it('gives the coding tools', () => {
    for (const name of ['read_file', 'write_file', 'edit_file', 'grep_search', 'glob_search', 'list_directory', 'bash_tool', 'execute_code']) {
      assert.ok(a.names.includes(name), `${name} in ${a.names}`);
    }
  });

  it('edits, searches and runs a small project', { timeout: STEP_TIMEOUT_MS }, async () => {
    let m = await a.call('write_file', { path: 'app/util.py', content: 'def greet(name):\n    return "hello " + name\n' });
    assert.doesNotMatch(text(m), /error|failed/i, text(m));
    m = await a.call('write_file', { path: '/workspace/app/main.py', content: 'from util import greet\nprint(greet("kiln"))\n' });
    assert.doesNotMatch(text(m), /error|failed/i, text(m));

    m = await a.call('edit_file', { path: 'app/util.py', old_text: '"hello "', new_text: '"HELLO, "' });
    assert.doesNotMatch(text(m), /error|failed|not found/i, text(m));
    m = await a.call('read_file', { path: 'app/util.py' });
    assert.match(text(m), /HELLO, /, text(m));

    m = await a.call('grep_search', { pattern: 'def greet', path: '.' });
    assert.equal(m.artifact?.engine, 'ripgrep', `grep_search used ${JSON.stringify(m.artifact)}: ${text(m)}`);
    assert.match(text(m), /app\/util\.py:1:/, text(m));

    m = await a.call('glob_search', { pattern: '**/*.py' });
    assert.match(text(m), /main\.py/, text(m));
    assert.match(text(m), /util\.py/, text(m));

    m = await a.call('list_directory', { path: 'app' });
    assert.match(text(m), /main\.py/, text(m));

    m = await a.call('bash_tool', { command: 'cd app && python3 main.py' });
    assert.match(text(m), /HELLO, kiln/, text(m));
    assert.match(text(m), /working_directory: \/workspace/, text(m));
  });

  it('runs execute_code in py and js, with the workspace as the working directory', { timeout: STEP_TIMEOUT_MS }, async () => {
    let m = await a.call('execute_code', { lang: 'py', code: 'import os\nprint(os.getcwd(), 6 * 7)\nopen("from_py.txt", "w").write("py was here")' });
    assert.match(text(m), /\/workspace 42/, text(m));
    m = await a.call('execute_code', { lang: 'js', code: 'const fs = require("fs"); console.log(fs.readFileSync("from_py.txt", "utf8"), [1, 2, 3].map((x) => x * 2).join(","));' });
    assert.match(text(m), /py was here 2,4,6/, text(m));
    // a failing program is an exit code, not a transport error
    m = await a.call('execute_code', { lang: 'py', code: 'import sys\nprint("to stderr", file=sys.stderr)\nsys.exit(3)' });
    assert.match(text(m), /exit_code: 3/, text(m));
    assert.match(text(m), /to stderr/, text(m));
  });

  it('streams output before the exit', { timeout: STEP_TIMEOUT_MS }, async () => {
    const seen = [];
    const started = Date.now();
    const result = await a.runtime.exec('echo first; sleep 3; echo second >&2', {
      onOutput: (stream, data) => seen.push({ stream, data, at: Date.now() - started }),
    });
    const done = Date.now() - started;
    assert.equal(result.exitCode, 0);
    assert.equal(result.stdout, 'first\n');
    assert.equal(result.stderr, 'second\n');
    const first = seen.find((s) => s.data.includes('first'));
    assert.ok(first, JSON.stringify(seen));
    assert.equal(first.stream, 'stdout');
    assert.ok(done - first.at >= 2000, `"first" arrived at ${first.at} ms, the exit at ${done} ms`);
  });

  it('runs argv as given, without a shell', { timeout: STEP_TIMEOUT_MS }, async () => {
    const id = await a.runtime.getSandboxId();
    const resp = await fetch(`${BASE}/v1/sandbox/${id}/exec`, {
      method: 'POST',
      headers: { Authorization: `Bearer ${API_KEY}`, 'User-Id': 'alice', 'Content-Type': 'application/json' },
      body: JSON.stringify({ argv: ['printf', '%s|', '$HOME', '; echo no', '*'], cwd: '/workspace/app' }),
    });
    assert.equal(resp.status, 200);
    const body = await resp.text();
    const out = [...body.matchAll(/event: stdout\ndata: (.*)\n/g)].map((m) => Buffer.from(m[1], 'base64').toString()).join('');
    assert.equal(out, '$HOME|; echo no|*|');
    assert.match(body, /event: exit\ndata: {"exit_code":0}/);
  });

  it('times out: the client\'s own timeout and Kiln\'s', { timeout: STEP_TIMEOUT_MS }, async () => {
    const quick = agent('alice', { sandboxId: await a.runtime.getSandboxId(), tools: { timeoutMs: 2_000 } });
    const started = Date.now();
    const m = await quick.call('bash_tool', { command: 'echo before; sleep 30; echo after' });
    assert.ok(Date.now() - started < 20_000, 'the client timeout ended the command');
    assert.match(text(m), /before/, text(m));
    assert.doesNotMatch(text(m), /after/, text(m));
    assert.match(text(m), /timed_out: true/, text(m));
    // Kiln's limit (timeout_ms lowers it): the protocol's error event
    await assert.rejects(a.runtime.exec('sleep 30', { timeout: 1_500 }), /timed out/);
  });

  it('keeps two sandboxes of one principal apart', { timeout: STEP_TIMEOUT_MS }, async () => {
    const other = agent('alice');
    const m = await other.call('bash_tool', { command: 'ls -A /workspace | wc -l; test -e /workspace/app && echo LEAK || echo clean' });
    assert.match(text(m), /^0$/m, text(m));
    assert.match(text(m), /clean/, text(m));
    assert.notEqual(await other.runtime.getSandboxId(), await a.runtime.getSandboxId());
    await assert.rejects(other.runtime.readFile('app/main.py'), /\(404\)/);
  });

  it('keeps principals apart: another user cannot use a sandbox by its id', { timeout: STEP_TIMEOUT_MS }, async () => {
    const id = await a.runtime.getSandboxId();
    const bob = createCloudflareBridgeRuntime({ baseURL: BASE, apiKey: API_KEY, fetch: as('bob'), sandboxId: id });
    await assert.rejects(bob.readFile('app/main.py'), /\(404\)/);
    await assert.rejects(bob.exec('cat /workspace/app/main.py'), /\(404\)/);
    await assert.rejects(bob.writeFile('app/main.py', 'print("bob")'), /\(404\)/);
    // alice's file is untouched
    const mine = await a.runtime.readFile('app/main.py');
    assert.match(mine.toString(), /greet\("kiln"\)/);
  });

  it('refuses a wrong key', async () => {
    const wrong = createCloudflareBridgeRuntime({ baseURL: BASE, apiKey: 'not-the-key' });
    await assert.rejects(wrong.getSandboxId(), /\(401\)/);
    const none = createCloudflareBridgeRuntime({ baseURL: BASE });
    await assert.rejects(none.getSandboxId(), /\(401\)/);
    // the shared key itself is accepted
    const keyed = createCloudflareBridgeRuntime({ baseURL: BASE, apiKey: API_KEY, fetch: as('dave') });
    assert.ok(await keyed.getSandboxId());
  });
});
