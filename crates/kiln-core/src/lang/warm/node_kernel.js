// Kiln's JavaScript kernel: a long-lived node that evaluates framed requests.
//
// It is the pre-started program of a `js` jail, started as
//   sh -c 'exec node --expose-internals /etc/kiln/node_kernel.js 3>&1 1>&2'
// so the protocol channel is fd 3 (the jail's stdout) and anything that
// writes to fd 1 or 2 behind node's back (a child process given
// stdio: 'inherit', fs.writeSync(1, ...)) lands in the kernel's diagnostics
// instead of breaking the protocol. On stdin it first reads the go (one JSON
// line, as node_warm.js does: the run's environment), then frames:
//
//   stdin  (from the server): kind(1) + length(4, big-endian) + payload
//            b"x" {"code": "..."}   evaluate
//            b"i" (empty)           interrupt the evaluation running now
//   fd 3   (to the server):   frames of the same shape
//            b"o" bytes             the evaluation's stdout (process.stdout, console.log)
//            b"e" bytes             its stderr (process.stderr, console.error)
//            b"r" {...}             "ready" once, then one reply per evaluation
//
// Evaluation has the REPL's semantics: code runs as a script in the main
// context, so globals and top-level `let`/`const`/`class` persist between
// evaluations (V8 keeps a context's script-level declarations; declaring
// the same `let` again is a SyntaxError, as in two <script> tags). Code with
// a top-level `await` is rewritten by node's own REPL transform
// (`internal/repl/await`, hence --expose-internals): declarations are hoisted
// out of an async wrapper, so they persist too. The value is the completion
// value (as the REPL prints it; `undefined` is no value), shown with
// util.inspect.
//
// A worker thread reads stdin, so an interrupt arrives even while the main
// thread is busy: it raises SIGINT in the process, which stops a synchronous
// evaluation (vm's breakOnSigint) or abandons the await of an asynchronous
// one; the context and its state stay. Errors thrown asynchronously later
// (a timer, an unhandled rejection) are written to stderr; the kernel lives on.
'use strict';
{
  const fs = require('fs');
  const path = require('path');
  const util = require('util');
  const vm = require('vm');
  const Module = require('module');
  const { Worker } = require('worker_threads');

  const PROTO = 3;
  const KERNEL_FILE = __filename;
  const MAX_VALUE_CHARS = 64 * 1024;
  const MAX_FILES = 1000;
  const MAX_TRACEBACK_LINES = 400;
  const MAX_CHUNK = 1024 * 1024;
  const WORKSPACE = '/mnt/data';

  let topLevelAwait = null;
  try {
    ({ processTopLevelAwait: topLevelAwait } = require('internal/repl/await'));
  } catch {
    // without --expose-internals a top-level await stays a SyntaxError
  }

  const pause = new Int32Array(new SharedArrayBuffer(4));
  function writeAll(fd, buf) {
    let off = 0;
    while (off < buf.length) {
      try {
        off += fs.writeSync(fd, buf, off, buf.length - off);
      } catch (e) {
        if (e.code !== 'EAGAIN') throw e;
        Atomics.wait(pause, 0, 0, 5);
      }
    }
  }

  function send(kind, payload) {
    const header = Buffer.alloc(5);
    header.write(kind, 0, 'latin1');
    header.writeUInt32BE(payload.length, 1);
    writeAll(PROTO, Buffer.concat([header, payload]));
  }

  // ---- the go: one JSON line on stdin (nothing else is sent before `ready`)
  let pending = Buffer.alloc(0);
  let go;
  try {
    const chunk = Buffer.alloc(64 * 1024);
    let nl = -1;
    while (nl < 0) {
      const n = fs.readSync(0, chunk, 0, chunk.length, null);
      if (n === 0) throw new Error('stdin closed before the go');
      pending = Buffer.concat([pending, chunk.subarray(0, n)]);
      nl = pending.indexOf(10);
    }
    go = JSON.parse(pending.subarray(0, nl).toString('utf8'));
    pending = pending.subarray(nl + 1);
    if (!Array.isArray(go.env)) throw new Error('go needs env [[k, v], ...]');
  } catch (e) {
    fs.writeSync(2, `kiln node_kernel: bad go: ${e.message}\n`);
    process.exit(70);
  }
  for (const k of Object.keys(process.env)) delete process.env[k];
  for (const [k, v] of go.env) process.env[String(k)] = String(v);
  Module._initPaths(); // global module paths come from HOME and NODE_PATH
  process.argv = [process.argv[0]];
  process.execArgv = [];
  process.chdir(WORKSPACE);

  // ---- output: node's streams become frames, written as they come
  function capture(stream, kind) {
    stream.write = function write(chunk, encoding, cb) {
      if (typeof encoding === 'function') {
        cb = encoding;
        encoding = undefined;
      }
      let buf;
      if (typeof chunk === 'string') buf = Buffer.from(chunk, encoding || 'utf8');
      else if (ArrayBuffer.isView(chunk)) buf = Buffer.from(chunk.buffer, chunk.byteOffset, chunk.byteLength);
      else buf = Buffer.from(String(chunk));
      for (let off = 0; off < buf.length; off += MAX_CHUNK) {
        send(kind, buf.subarray(off, off + MAX_CHUNK));
      }
      if (typeof cb === 'function') process.nextTick(cb);
      return true;
    };
  }
  capture(process.stdout, 'o');
  capture(process.stderr, 'e');

  // ---- requests: a worker reads stdin so an interrupt gets through a busy loop
  const running = new Int32Array(new SharedArrayBuffer(4));
  const reader = new Worker(
    `
    const fs = require('fs');
    const { parentPort, workerData } = require('worker_threads');
    const running = workerData.running;
    const pause = new Int32Array(new SharedArrayBuffer(4));
    let buf = Buffer.from(workerData.pending);
    const chunk = Buffer.alloc(64 * 1024);
    function fill(n) {
      while (buf.length < n) {
        let k;
        try {
          k = fs.readSync(0, chunk, 0, chunk.length, null);
        } catch (e) {
          if (e.code === 'EAGAIN') { Atomics.wait(pause, 0, 0, 5); continue; }
          k = 0;
        }
        // the server closed our stdin: the session is over
        if (k === 0) process.kill(process.pid, 'SIGKILL');
        buf = Buffer.concat([buf, chunk.subarray(0, k)]);
      }
    }
    for (;;) {
      fill(5);
      const kind = String.fromCharCode(buf[0]);
      const len = buf.readUInt32BE(1);
      fill(5 + len);
      const payload = Buffer.from(buf.subarray(5, 5 + len));
      buf = buf.subarray(5 + len);
      if (kind === 'i') {
        if (Atomics.load(running, 0) === 1) process.kill(process.pid, 'SIGINT');
      } else {
        parentPort.postMessage(payload.toString('utf8'));
      }
    }
    `,
    { eval: true, workerData: { running, pending }, stdin: false, stdout: false, stderr: false },
  );

  let interrupted = false;
  let onInterrupt = null;
  process.on('SIGINT', () => {
    if (Atomics.load(running, 0) !== 1) return;
    interrupted = true;
    if (onInterrupt) onInterrupt();
  });
  process.on('uncaughtException', (e) => {
    process.stderr.write(`Uncaught ${describe(e).traceback.join('\n')}\n`);
  });
  process.on('unhandledRejection', (e) => {
    process.stderr.write(`Uncaught (in promise) ${describe(e).traceback.join('\n')}\n`);
  });

  // ---- what user code sees, besides node's globals
  const cellRequire = Module.createRequire(path.join(WORKSPACE, '<kernel>'));
  const userModule = new Module(path.join(WORKSPACE, '<kernel>'));
  userModule.paths = Module._nodeModulePaths(WORKSPACE);
  Object.assign(globalThis, {
    require: cellRequire,
    module: userModule,
    exports: userModule.exports,
    __filename: path.join(WORKSPACE, '<kernel>'),
    __dirname: WORKSPACE,
  });

  class Interrupted extends Error {}
  Object.defineProperty(Interrupted.prototype, 'name', { value: 'Interrupted' });

  function isKernelFrame(line) {
    return line.includes(KERNEL_FILE) || line.includes('(node:vm:') || line.includes('at node:vm:')
      || /^\s*at new Script \(/.test(line) || line.includes('[worker eval]');
  }

  function describe(exc) {
    if (!(exc instanceof Error) && !(exc && typeof exc.stack === 'string')) {
      const text = inspect(exc);
      return { ename: 'Uncaught', evalue: text, traceback: [`Uncaught ${text}`] };
    }
    let lines = String(exc.stack || `${exc.name}: ${exc.message}`).split('\n');
    const cut = lines.findIndex((l) => /^\s+at /.test(l) && isKernelFrame(l));
    if (cut >= 0) lines = lines.slice(0, cut);
    if (lines.length > MAX_TRACEBACK_LINES) {
      const n = lines.length - MAX_TRACEBACK_LINES;
      lines = [...lines.slice(0, 50), `... ${n} lines cut ...`, ...lines.slice(-(MAX_TRACEBACK_LINES - 50))];
    }
    let evalue;
    try {
      evalue = String(exc.message);
    } catch {
      evalue = '<message unreadable>';
    }
    let ename;
    try {
      ename = String(exc.name || (exc.constructor && exc.constructor.name) || 'Error');
    } catch {
      ename = 'Error';
    }
    return {
      ename,
      evalue: evalue.slice(0, MAX_VALUE_CHARS),
      traceback: lines.map((l) => l.slice(0, 4096)),
    };
  }

  function inspect(value) {
    try {
      return util.inspect(value, { depth: 4, maxArrayLength: 200, maxStringLength: MAX_VALUE_CHARS, breakLength: 100 })
        .slice(0, MAX_VALUE_CHARS);
    } catch (e) {
      return `<inspect failed: ${e && e.message}>`;
    }
  }

  function snapshot() {
    const seen = new Map();
    const stack = [''];
    while (stack.length && seen.size < MAX_FILES * 10) {
      const rel = stack.pop();
      let entries;
      try {
        entries = fs.readdirSync(path.join(WORKSPACE, rel), { withFileTypes: true });
      } catch {
        continue;
      }
      for (const entry of entries) {
        const p = rel ? `${rel}/${entry.name}` : entry.name;
        if (entry.isDirectory()) stack.push(p);
        else if (entry.isFile()) {
          try {
            const st = fs.lstatSync(path.join(WORKSPACE, p), { bigint: true });
            seen.set(p, `${st.mtimeNs}:${st.size}`);
          } catch {
            // gone meanwhile
          }
        }
      }
    }
    return seen;
  }

  // import() in a cell loads modules as the main module would; the option is
  // marked experimental in node 20, and says so once: not in the user's stderr
  const mainLoader = vm.constants && vm.constants.USE_MAIN_CONTEXT_DEFAULT_LOADER;
  const emitWarning = process.emitWarning;
  process.emitWarning = function filtered(warning, ...rest) {
    if (String((warning && warning.message) || warning).includes('USE_MAIN_CONTEXT_DEFAULT_LOADER')) return;
    return emitWarning.call(this, warning, ...rest);
  };

  // a leading `{` is an object literal, as in the REPL
  function compile(code, filename) {
    const options = { filename };
    if (mainLoader && code.includes('import')) options.importModuleDynamically = mainLoader;
    if (/^\s*\{/.test(code) && /\}\s*$/.test(code) && !/;\s*$/.test(code)) {
      try {
        return { script: new vm.Script(`(${code}\n)`, options), awaited: false };
      } catch {
        // a block after all
      }
    }
    try {
      return { script: new vm.Script(code, options), awaited: false };
    } catch (e) {
      if (!(e instanceof SyntaxError) || !topLevelAwait || !code.includes('await')) throw e;
      let wrapped = null;
      try {
        wrapped = topLevelAwait(code);
      } catch {
        // not rewritable: report the original error
      }
      if (wrapped === null) throw e;
      return { script: new vm.Script(wrapped, options), awaited: true };
    }
  }

  let cells = 0;
  async function evaluate(code) {
    cells += 1;
    const filename = `<cell ${cells}>`;
    let value;
    let error = null;
    interrupted = false;
    Atomics.store(running, 0, 1);
    try {
      const { script, awaited } = compile(code, filename);
      if (interrupted) throw new Interrupted('the evaluation was interrupted');
      let result;
      try {
        result = script.runInThisContext({ breakOnSigint: true, displayErrors: false });
      } catch (e) {
        if (e && e.code === 'ERR_SCRIPT_EXECUTION_INTERRUPTED') {
          throw new Interrupted('the evaluation was interrupted');
        }
        throw e;
      }
      if (interrupted) throw new Interrupted('the evaluation was interrupted');
      if (awaited) {
        const stop = new Promise((_, reject) => {
          onInterrupt = () => reject(new Interrupted('the evaluation was interrupted'));
        });
        const done = await Promise.race([result, stop]);
        value = done ? done.value : undefined;
      } else {
        value = result;
      }
    } catch (e) {
      error = describe(e);
    } finally {
      onInterrupt = null;
      Atomics.store(running, 0, 0);
    }
    return { value, error };
  }

  function replyFor(value, error, before) {
    const reply = { error, value: null };
    if (value !== undefined && error === null) {
      try {
        globalThis._ = value;
      } catch {
        // the user's own `_`
      }
      reply.value = inspect(value);
    }
    const after = snapshot();
    const files = [];
    for (const p of [...after.keys()].sort()) {
      const meta = after.get(p);
      if (before.get(p) !== meta) files.push({ path: p, size: Number(meta.split(':')[1]) });
    }
    reply.files = files.slice(0, MAX_FILES);
    return reply;
  }

  const queue = [];
  let busy = false;
  async function serve() {
    if (busy) return;
    busy = true;
    while (queue.length) {
      const payload = queue.shift();
      let code;
      try {
        code = JSON.parse(payload).code;
        if (typeof code !== 'string') throw new TypeError('the request has no code');
      } catch (e) {
        send('r', Buffer.from(JSON.stringify({ error: describe(e), value: null, files: [] })));
        continue;
      }
      const before = snapshot();
      let { value, error } = await evaluate(code);
      const reply = replyFor(value, error, before);
      value = undefined;
      send('r', Buffer.from(JSON.stringify(reply)));
    }
    busy = false;
  }
  reader.on('message', (payload) => {
    queue.push(payload);
    serve();
  });
  reader.on('error', (e) => {
    fs.writeSync(2, `kiln node_kernel: reader failed: ${e && e.stack}\n`);
    process.exit(70);
  });
  delete require.cache[__filename];
  send('r', Buffer.from(JSON.stringify({ ready: true, pid: process.pid })));
}
