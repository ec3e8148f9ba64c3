// damaged_store.test.mjs — a job store file that is damaged or not ours stops `unmask serve` at
// start with a clear error (exit status 2) naming the file, what is wrong (for a row: the job and
// the field) and what to do, and never a crash: a truncated file, garbage, a zeroed header, rows
// with impossible values (a document that is not JSON, a status out of range, negative or absurd
// event ids, seqs and counts, an event id of 2^62 or INT64_MAX, a seq collision, columns of the
// wrong type), another program's SQLite database (left byte for byte as it was), our tables
// changed. Tolerated and documented: events of a job that is not stored (a delete cut short) and an
// empty file (a new store). Every case runs on the release build and on the ASan + UBSan build
// (sanitizers.mjs), which must exit the same way and report nothing. Rows are written with
// Debian's python3 sqlite3 module.
import { test, before } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { spawnSync } from 'node:child_process';
import { BIN, TMP, startServer, makeModel, post, until } from './server.mjs';
import { asanBin, sanitizerEnv, sanitizerReports } from './sanitizers.mjs';

const DIR = path.join(TMP, 'damaged-store');
const BASE = path.join(DIR, 'base.db');
const PYTHON = fs.existsSync('/usr/bin/python3') ? '/usr/bin/python3' : 'python3';
const ASAN = asanBin();
let model;
let A, B; // the base store's jobs: A (64 steps, 69 events, seq 1), B (8 steps, seq 2)

const SQL = (file, script) => {
  const r = spawnSync(PYTHON, ['-c', 'import sqlite3, sys\nc = sqlite3.connect(sys.argv[1])\nc.executescript(sys.argv[2])\nc.commit()\nc.close()', file, script],
    { encoding: 'utf8' });
  assert.equal(r.status, 0, `python3 sqlite3: ${r.stderr}`);
};

before(async () => {
  fs.rmSync(DIR, { recursive: true, force: true });
  fs.mkdirSync(DIR, { recursive: true });
  model = makeModel('http-tiny');
  const s = await startServer(['--store', `sqlite:${BASE}`], { model });
  try {
    A = (await post(`${s.url}/v1/jobs`, { prompt: 'a', max_tokens: 64, block_length: 64, steps: 64 })).json().id;
    B = (await post(`${s.url}/v1/jobs`, { prompt: 'b', max_tokens: 8, block_length: 8, steps: 8 })).json().id;
    await until('both jobs done', async () => (await (await fetch(`${s.url}/v1/jobs?status=succeeded`)).json()).data.length === 2, 60000);
  } finally {
    await s.stop('SIGTERM');
  }
  assert.ok(!fs.existsSync(`${BASE}-wal`) || fs.statSync(`${BASE}-wal`).size === 0, 'the base store is checkpointed');
});

// A copy of the base store, damaged by fn(file).
let n = 0;
function damaged(fn) {
  const file = path.join(DIR, `case-${++n}.db`);
  fs.copyFileSync(BASE, file);
  fn(file);
  return file;
}

// `unmask serve` on file with each build: exit status 2, the message on stderr matching re, the
// file left as it was, no sanitizer report. Returns the release build's stderr.
function refused(file, re) {
  const bytes = fs.readFileSync(file);
  let first;
  for (const [name, bin] of [['release', BIN], ['asan', ASAN]]) {
    const reports = path.join(DIR, `reports-${path.basename(file)}-${name}`);
    const env = name === 'asan' ? { ...process.env, ...sanitizerEnv(reports) } : process.env;
    const r = spawnSync(bin, ['serve', '--model', model, '--host', '127.0.0.1', '--port', '0', '--store', `sqlite:${file}`],
      { encoding: 'utf8', timeout: 60000, env });
    assert.equal(r.signal, null, `${name}: killed by ${r.signal}\n${r.stderr}`);
    assert.equal(r.status, 2, `${name}: exit status\n${r.stderr}`);
    assert.match(r.stderr, /^error: job store /m, `${name}: one error line`);
    assert.match(r.stderr, re, name);
    assert.ok(r.stderr.includes(file), `${name}: the message names the file`);
    assert.deepEqual(sanitizerReports(reports, r.stderr), [], `${name}: sanitizer reports`);
    assert.ok(fs.readFileSync(file).equals(bytes), `${name}: the file is left as it was`);
    first ??= r.stderr;
  }
  return first;
}

const ROW = (row, why) => new RegExp(`${row}: ${why}\\. The file is damaged or was changed by another program; nothing is ` +
  `changed automatically: move the file away to start with an empty store, or delete that job \\(DELETE FROM jobs WHERE ` +
  `id (= '[^']+'|IS NULL); DELETE FROM events WHERE job (= '[^']+'|IS NULL)\\) and start again`);
const WHOLE = /is not a valid SQLite database \(damaged, or another file\): .*; move it away to start with an empty store \(nothing is reset automatically\)/;

test('the whole file: truncated, garbage, a zeroed header', () => {
  const size = fs.statSync(BASE).size;
  for (const cut of [100, 4096, Math.floor(size / 2), size - 4096]) refused(damaged((f) => fs.truncateSync(f, cut)), WHOLE);
  refused(damaged((f) => {
    const g = Buffer.alloc(size);
    for (let i = 0; i < size; i++) g[i] = (i * 2654435761) >>> 24; // garbage, the same every run
    fs.writeFileSync(f, g);
  }), WHOLE);
  refused(damaged((f) => {
    const b = fs.readFileSync(f);
    b.fill(0, 0, 100);
    fs.writeFileSync(f, b);
  }), WHOLE);
});

test('a job row with impossible values: the job and the field named', () => {
  const job = (set, id = A) => damaged((f) => SQL(f, `UPDATE jobs SET doc = ${set} WHERE id = '${id}'`));
  const jobA = `job store .*: job '${A}'`;
  refused(job(`'{"owner": "", "request": {'`), ROW(jobA, 'its document is not a JSON object \\(.*\\)'));
  refused(job(`'[1, 2]'`), ROW(jobA, 'its document is not a JSON object \\(another JSON value\\)'));
  refused(job(`json_set(doc, '$.status', 9)`), ROW(jobA, '"status" must be an integer in \\[0, 4\\]'));
  refused(job(`json_set(doc, '$.status', -1)`), ROW(jobA, '"status" must be an integer in \\[0, 4\\]'));
  refused(job(`json_set(doc, '$.status', 'running')`), ROW(jobA, '"status" must be an integer'));
  refused(job(`json_set(doc, '$.request', 'x')`), ROW(jobA, '"request" must be an object'));
  refused(job(`json_set(doc, '$.result', 7)`), ROW(jobA, '"result" must be an object or null'));
  refused(job(`json_set(doc, '$.attempts', -1)`), ROW(jobA, '"attempts" must be an integer in \\[0, 1000000\\]'));
  refused(job(`json_set(doc, '$.attempts', 2147483647)`), ROW(jobA, '"attempts" must be an integer in \\[0, 1000000\\]'));
  refused(job(`json_set(doc, '$.next_event_id', -5)`), ROW(jobA, '"next_event_id" must be an integer in \\[1, 9007199254740992\\]'));
  refused(job(`json_set(doc, '$.next_event_id', 4611686018427387904)`), ROW(jobA, '"next_event_id" must be an integer in \\[1, 9007199254740992\\]'));
  refused(job(`json_set(doc, '$.next_event_id', 9223372036854775807)`), ROW(jobA, '"next_event_id" must be an integer in \\[1, 9007199254740992\\]'));
  refused(job(`json_set(doc, '$.first_kept_id', 0)`), ROW(jobA, '"first_kept_id" must be an integer in \\[1, 9007199254740992\\]'));
  refused(job(`json_set(doc, '$.first_kept_id', 500)`), ROW(jobA, '"next_event_id" must be an integer in \\[500, 9007199254740992\\]'));
  refused(job(`json_set(doc, '$.steps', -3)`), ROW(jobA, '"steps" must be an integer in \\[0, 9007199254740992\\]'));
  refused(job(`json_set(doc, '$.created_at', -1.5)`), ROW(jobA, '"created_at" must be a number >= 0'));
  refused(job(`json_set(doc, '$.webhook_status', 'bogus')`), ROW(jobA, `"webhook_status" 'bogus' is not one of pending, delivered, failed`));
  refused(job(`json_set(doc, '$.owner', 5)`), ROW(jobA, '"owner" must be a string'));
  refused(job(`json_set(doc, '$.cancel_requested', 2)`), ROW(jobA, '"cancel_requested" must be an integer in \\[0, 1\\]'));
});

test('impossible seqs, ids and column types', () => {
  const seqCollision = refused(damaged((f) => SQL(f, `UPDATE jobs SET seq = 1 WHERE id = '${B}'`)),
    ROW(`job store .*: job '(${A}|${B})'`, `its seq 1 is also that of job (${A}|${B}) \\(seqs are unique\\)`));
  assert.ok(seqCollision.includes(A) && seqCollision.includes(B), 'both jobs named');
  refused(damaged((f) => SQL(f, `UPDATE jobs SET seq = 9223372036854775807 WHERE id = '${B}'`)),
    ROW(`job store .*: job '${B}'`, 'its seq 9223372036854775807 is out of range \\[1, 2\\^53\\]'));
  refused(damaged((f) => SQL(f, `UPDATE jobs SET seq = -4 WHERE id = '${B}'`)),
    ROW(`job store .*: job '${B}'`, 'its seq -4 is out of range \\[1, 2\\^53\\]'));
  refused(damaged((f) => SQL(f, `UPDATE jobs SET seq = 'abc' WHERE id = '${B}'`)),
    ROW(`job store .*: job '${B}'`, 'its row has a column of the wrong type'));
  refused(damaged((f) => SQL(f, `INSERT INTO jobs(id, seq, doc) SELECT NULL, 3, doc FROM jobs WHERE id = '${A}'`)),
    ROW(`job store .*: job '\\(null\\)'`, 'its row has a column of the wrong type'));
  refused(damaged((f) => SQL(f, `INSERT INTO jobs(id, seq, doc) SELECT '${'x'.repeat(60)}', 3, doc FROM jobs WHERE id = '${A}'`)),
    ROW(`job store .*: job 'x{40}'`, 'its id is 60 bytes \\(1 to 39 expected\\)'));
});

test('an event row with impossible values: the event and its job named', () => {
  const ev = (eid, doc = `'{"type":"step"}'`) => damaged((f) => SQL(f, `INSERT OR REPLACE INTO events(job, eid, doc) VALUES ('${A}', ${eid}, ${doc})`));
  for (const eid of ['4611686018427387904', '9223372036854775807', '9007199254740992', '0', '-3'])
    refused(ev(eid), ROW(`job store .*: event ${eid} of job '${A}'`, 'the event id is out of range \\[1, 2\\^53\\)'));
  refused(ev(5, `'garbage'`), ROW(`job store .*: event 5 of job '${A}'`, 'the event is not a JSON object'));
  refused(ev(5, `x'7b7d'`), ROW(`job store .*: event 5 of job '${A}'`, 'its row has a column of the wrong type'));
});

test("another program's SQLite database, or our tables changed: refused, left as they were", () => {
  const foreign = path.join(DIR, 'foreign.db');
  fs.rmSync(foreign, { force: true });
  SQL(foreign, 'CREATE TABLE users(id INTEGER PRIMARY KEY, name TEXT); CREATE TABLE orders(id INTEGER, total REAL); ' +
    "INSERT INTO users(name) VALUES ('ada'), ('alan');");
  refused(foreign, /job store .*foreign\.db is an SQLite database of another program \(tables: orders, users\), not an unmask job store; it was left as it is: give --store a file of its own/);
  const sameNames = path.join(DIR, 'same-names.db');
  fs.rmSync(sameNames, { force: true });
  SQL(sameNames, 'CREATE TABLE jobs(x TEXT); CREATE TABLE events(y TEXT);');
  refused(sameNames, /is an SQLite database of another program \(tables: events, jobs\)/);
  refused(damaged((f) => SQL(f, 'DROP TABLE jobs; CREATE TABLE jobs(id TEXT PRIMARY KEY, other TEXT);')),
    /does not have the tables of a job store \(.*\); it was changed by another program: move it away to start with an empty store \(nothing is reset automatically\)/);
  refused(damaged((f) => SQL(f, "UPDATE meta SET value = '2' WHERE key = 'unmask_job_store'")),
    /has another schema version than 1/);
});

test('tolerated: events of a job that is not stored, an empty file; the jobs read back intact', async () => {
  const orphan = damaged((f) => SQL(f, `INSERT INTO events(job, eid, doc) VALUES ('job_gone', 1, '{"type":"step"}'), ('job_gone', 2, '{"type":"step"}')`));
  const empty = path.join(DIR, 'empty.db');
  fs.writeFileSync(empty, '');
  for (const [name, bin] of [['release', BIN], ['asan', ASAN]]) {
    const reports = path.join(DIR, `reports-tolerated-${name}`);
    const env = name === 'asan' ? sanitizerEnv(reports) : {};
    for (const file of [orphan, empty]) {
      const s = await startServer(['--store', `sqlite:${file}`], { model, bin, env });
      try {
        const list = (await (await fetch(`${s.url}/v1/jobs?limit=100`)).json()).data;
        assert.deepEqual(list.map((j) => j.id), file === empty ? [] : [B, A], `${name}: the stored jobs`);
        if (file === orphan) {
          const a = await (await fetch(`${s.url}/v1/jobs/${A}`)).json();
          assert.equal(a.status, 'succeeded');
          assert.equal(a.progress.events, 69, `${name}: job A's 69 events`);
          assert.equal((await fetch(`${s.url}/v1/jobs/job_gone`)).status, 404);
        }
      } finally {
        await s.stop('SIGTERM');
      }
      assert.equal(s.exited().code, 0, `${name}: clean exit\n${s.logs().slice(-2000)}`);
      assert.deepEqual(sanitizerReports(reports, s.logs()), [], `${name}: sanitizer reports`);
    }
  }
});

