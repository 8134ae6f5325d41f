// Kiln: pre-started node for warm `js` jails.
//
// Node starts while the jail is parked (cwd /mnt/data, the jail's `js`
// environment). This file blocks on stdin until the go arrives — ONE JSON
// object {"argv": ["/usr/bin/node", "index.js", ARGS...], "env": [[k, v], ...]}
// then EOF — and makes the process a cold `node index.js ARGS`:
// process.argv = [execPath, "/mnt/data/index.js", ARGS...], process.env = the
// go env exactly, the global module paths recomputed from the new HOME and
// NODE_PATH, then index.js runs as node's main module (require.main === module).
//
// Two ways to start it:
// - `node --require /etc/kiln/node_warm.js index.js` (preferred): this file is
//   a preload, node itself then runs index.js from its own main runner, so
//   stack traces and everything else match a cold run; process.execArgv is
//   reset to [] (child_process.fork() must not preload this file again).
// - `node /etc/kiln/node_warm.js`: this file is the main module and hands over
//   to Module.runMain() from a process.nextTick. Unavoidable difference: the
//   bottom two stack frames are `executeUserEntryPoint (…)` and
//   `process.processTicksAndRejections (node:internal/process/task_queues:…)`
//   instead of `Function.executeUserEntryPoint [as runMain] (…)` and
//   `node:internal/main/run_main_module:…`, visible in shallow stack traces
//   (an uncaught throw at the top level of index.js, a SyntaxError).
// Once the go is read, fd 0 is reopened on /dev/null (a cold jail's stdin).
// Differences in both modes: variables node reads only at startup
// (NODE_OPTIONS, NODE_EXTRA_CA_CERTS, ...) come from the parked environment,
// so park with the jail's `js` environment; /proc/self/cmdline shows the
// parked command line.
//
// Nothing of this file stays reachable: it removes itself from require.cache
// and defines no globals. A bad go ends the process with status 70.
'use strict';
{
  const fs = require('fs');
  const path = require('path');
  const Module = require('module');
  const asPreload = require.main !== module;
  let go;
  try {
    go = JSON.parse(fs.readFileSync(0, 'utf8'));
    if (!Array.isArray(go.argv) || go.argv.length < 2 || !Array.isArray(go.env)) {
      throw new Error('go needs argv [node, script, ...] and env [[k, v], ...]');
    }
  } catch (e) {
    fs.writeSync(2, `kiln node_warm: bad go: ${e.message}\n`);
    process.exit(70);
  }
  // stdin becomes /dev/null, as in a cold jail: the lowest free descriptor is
  // reused, and no other thread opens files at this point
  fs.closeSync(0);
  const devNull = fs.openSync('/dev/null', 'r+');
  if (devNull !== 0) fs.closeSync(devNull);
  for (const k of Object.keys(process.env)) delete process.env[k];
  for (const [k, v] of go.env) process.env[String(k)] = String(v);
  Module._initPaths(); // global module paths come from HOME and NODE_PATH
  const script = path.resolve(String(go.argv[1]));
  if (asPreload && process.argv[1] !== script) {
    fs.writeSync(2, `kiln node_warm: parked for ${process.argv[1]}, go runs ${script}\n`);
    process.exit(70);
  }
  process.argv = [process.argv[0], script, ...go.argv.slice(2).map(String)];
  delete require.cache[__filename];
  if (asPreload) {
    process.execArgv = [];
  } else {
    // runMain takes process.argv[1]; process.mainModule becomes the user's
    process.nextTick(Module.runMain);
  }
}
