// emu_harness.mjs — what the suites on emulated GPUs (emu_tp, emu_tp_robust, emu_memory,
// device/serve_device_loop) share:
// the unmask-emu binary (UNMASK_EMU_BIN, else next to UNMASK_BIN) and whether it exists, free
// ports for --dist-init-addr, and spawnEmu(): a child process with its output collected, tracked so
// killAll() (registered with after() by each suite) ends whatever is left, and sanitizer reports
// (-DUNMASK_SANITIZE=ON builds) in any child's stderr gathered in sanitizerReports.
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { BIN } from '../protocol/harness.mjs';

// UNMASK_EMU_BIN names the emulator binary (it must exist then); otherwise the one next to unmask.
// A build configured with -DUNMASK_CUDA_EMU=OFF has none: suites report their tests as skipped (NO_EMU says why).
export const EMU = process.env.UNMASK_EMU_BIN || path.join(path.dirname(BIN), 'unmask-emu');
if (process.env.UNMASK_EMU_BIN && !fs.existsSync(EMU)) throw new Error(`UNMASK_EMU_BIN=${EMU} does not exist`);
export const NO_EMU = fs.existsSync(EMU) ? false : `no unmask-emu next to ${BIN} (configured with -DUNMASK_CUDA_EMU=OFF)`;

const procs = new Set(); // every child still running
export const SANITIZER = /runtime error:|ERROR: AddressSanitizer|ERROR: LeakSanitizer/;
export const sanitizerReports = [];

export function killAll() {
  for (const p of procs) p.kill('SIGKILL');
}

export function freePort() {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.on('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

// spawn unmask-emu with extra environment; output collected, exit awaited
export function spawnEmu(args, env = {}) {
  const proc = spawn(EMU, args, { stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, ...env } });
  procs.add(proc);
  const o = { proc, stdout: '', stderr: '' };
  proc.stdout.setEncoding('utf8');
  proc.stderr.setEncoding('utf8');
  proc.stdout.on('data', (d) => (o.stdout += d));
  proc.stderr.on('data', (d) => (o.stderr += d));
  o.exited = new Promise((resolve) => proc.on('close', (code, signal) => {
    procs.delete(proc);
    if (SANITIZER.test(o.stderr)) sanitizerReports.push(`${args.join(' ')}: ${o.stderr}`);
    resolve({ code, signal });
  }));
  // the process's own exit, SIGKILL after ms (a bound, not a synchronisation); {code, signal}
  o.exitWithin = async (ms) => {
    const t = setTimeout(() => proc.kill('SIGKILL'), ms);
    const r = await o.exited;
    clearTimeout(t);
    return r;
  };
  // SIGTERM (SIGKILL after 20 s); resolves with {code, signal}
  o.stop = async (sig = 'SIGTERM') => {
    if (proc.exitCode === null && proc.signalCode === null) {
      proc.kill(sig);
      const t = setTimeout(() => proc.kill('SIGKILL'), 20000);
      const r = await o.exited;
      clearTimeout(t);
      return r;
    }
    return o.exited;
  };
  // resolves once `re` appears in stdout + stderr (rejects if the process exits first)
  o.waitFor = (re) => new Promise((resolve, reject) => {
    const check = () => {
      if (re.test(o.stdout + o.stderr)) resolve();
    };
    proc.stdout.on('data', check);
    proc.stderr.on('data', check);
    check();
    o.exited.then((r) => reject(new Error(`exited (${r.code ?? r.signal}) before ${re}: ${o.stderr}`)));
  });
  return o;
}
