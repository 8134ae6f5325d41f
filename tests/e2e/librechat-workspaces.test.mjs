// End-to-end test: LibreChat's attached workspaces (@librechat/agents 3.9's `bash_tool` created
// with `workspaceId` / `workspaceInstanceId`, issue 26 §1) against a real Kiln server.
//
// The tool posts `/exec/programmatic` with `tools: []`, `workspace_instance_id` and the
// `X-LibreChat-Code-Workspace-ID` header, and requires `status: "completed"`; its description
// promises that commands start in the selected persistent project, that project files persist
// between calls while /tmp and shell variables do not, and that artifacts written to
// `${LIBRECHAT_CODE_DATA_DIR:-/mnt/data}` come back as files. Calls go through the package's
// ToolNode, as LibreChat's agent makes them. Same environment as librechat-agents.test.mjs
// (`KILN_URL`, optional `KILN_API_KEY`); crates/kiln/tests/e2e_librechat_agents.rs runs both.

import assert from 'node:assert/strict';
import { before, describe, it } from 'node:test';

import { AIMessage, ToolNode, createBashExecutionTool } from '@librechat/agents';

const KILN_URL = (process.env.KILN_URL || process.env.LIBRECHAT_CODE_BASEURL || '').replace(/\/+$/, '');
const API_KEY = process.env.KILN_API_KEY || process.env.LIBRECHAT_CODE_API_KEY || '';
const INSTANCE = 'c0ffee'.repeat(10) + 'c0de';
const STEP_TIMEOUT_MS = 120_000;

/** A ToolNode holding one `bash_tool` attached to `workspaceId` for `userId`. */
function workspaceBash(userId, workspaceId, workspaceInstanceId = INSTANCE) {
  process.env.LIBRECHAT_CODE_BASEURL = KILN_URL;
  const authHeaders = API_KEY ? { 'X-API-Key': API_KEY } : {};
  const node = new ToolNode({
    tools: [createBashExecutionTool({ user_id: userId, workspaceId, workspaceInstanceId, authHeaders })],
    sessions: new Map(),
  });
  let calls = 0;
  return async (command) => {
    calls += 1;
    const message = new AIMessage({
      content: '',
      tool_calls: [{ id: `call_ws_${calls}`, name: 'bash_tool', args: { command }, type: 'tool_call' }],
    });
    const out = await node.invoke({ messages: [message] });
    const messages = Array.isArray(out) ? out : out.messages;
    assert.equal(messages.length, 1, 'one ToolMessage per tool call');
    const msg = messages[0];
    assert.notEqual(msg.status, 'error', `tool call failed:\n${msg.content}`);
    return msg;
  };
}

describe('LibreChat attached workspaces against Kiln', () => {
  before(() => assert.ok(KILN_URL, 'KILN_URL is not set (see librechat-agents.test.mjs)'));

  it('w) bash_tool keeps project files between calls, not /tmp or variables; artifacts come back', { timeout: STEP_TIMEOUT_MS }, async () => {
    const bash = workspaceBash('e2e-ws-user', 'e2e-project');
    const first = await bash([
      'pwd',
      'mkdir -p notes && echo kept > notes/todo.txt',
      'echo scratch > /tmp/scratch.txt',
      'export SHELL_VAR=set',
      'echo artifact > "${LIBRECHAT_CODE_DATA_DIR:-/mnt/data}/report.txt"',
    ].join('\n'));
    assert.match(first.content, /^stdout:\n\/workspace\n/, 'commands start in the project');
    const files = first.artifact?.files ?? [];
    assert.deepEqual(files.map((f) => f.name), ['report.txt'], 'the artifact, and no project file, comes back');
    const url = `${KILN_URL}/download/${files[0].storage_session_id ?? first.artifact.session_id}/${files[0].id}`;
    const res = await fetch(url, { headers: API_KEY ? { 'X-API-Key': API_KEY } : {} });
    assert.equal(res.status, 200, `GET ${url}`);
    assert.equal(await res.text(), 'artifact\n');

    const second = await bash('cat notes/todo.txt; test -e /tmp/scratch.txt || echo no-tmp; echo "var=${SHELL_VAR:-unset}"');
    assert.match(second.content, /^stdout:\nkept\nno-tmp\nvar=unset\n/);
  });

  it('x) another workspace, instance or user sees nothing of the project', { timeout: STEP_TIMEOUT_MS }, async () => {
    const owner = workspaceBash('e2e-ws-user', 'e2e-project');
    await owner('echo mine > mine.txt');
    for (const other of [
      workspaceBash('e2e-ws-user', 'e2e-other-project'),
      workspaceBash('e2e-ws-user', 'e2e-project', 'f'.repeat(64)),
      workspaceBash('e2e-ws-intruder', 'e2e-project'),
    ]) {
      const msg = await other('ls -A; echo end');
      assert.match(msg.content, /^stdout:\nend\s*$/, `an empty project:\n${msg.content}`);
    }
    const mine = await owner('cat mine.txt');
    assert.match(mine.content, /^stdout:\nmine\s*$/);
  });
});
