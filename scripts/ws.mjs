// ws.mjs — the npm `ws` WebSocket client for the scripts here, loaded from tests/node_modules
// (`npm ci` in tests/, which scripts/install-deps.sh runs); exits 2 with that hint when missing.
import { createRequire } from 'node:module';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const require = createRequire(path.join(here, '..', 'tests', 'package.json'));
let WebSocket;
try {
  WebSocket = require('ws');
} catch {
  console.error('error: npm package "ws" not found; run `npm ci` in tests/ (scripts/install-deps.sh does)');
  process.exit(2);
}
export default WebSocket;
