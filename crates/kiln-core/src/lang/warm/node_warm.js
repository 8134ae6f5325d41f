// Kiln: pre-started node for warm `js` jails (kiln-sandbox park mode
// `prestart`). Node starts while the jail is parked; this file waits for the
// go on stdin — JSON {"argv": ["/usr/bin/node", "index.js", ARGS...],
// "env": [[k, v], ...]} — then runs the user's file as node's main module, so
// `require.main === module`, `process.argv` and `process.env` are as with a
// cold `node index.js ARGS` in /mnt/data. The one visible difference: stack
// traces end in this file's frame instead of node's internal main runner.
'use strict';
(() => {
  const fs = require('fs');
  const path = require('path');
  const Module = require('module');
  const go = JSON.parse(fs.readFileSync(0, 'utf8'));
  for (const k of Object.keys(process.env)) delete process.env[k];
  for (const [k, v] of go.env) process.env[k] = v;
  const script = path.resolve(process.cwd(), go.argv[1] || 'index.js');
  process.argv = [go.argv[0], script, ...go.argv.slice(2)];
  Module.runMain(script);
})();
