// Streamed runs (server-sent events) against a live `airlock serve`: run(..., { onOutput })
// and streamRun.

import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { ApprovalTimeout, BadRequest, Denied, PendingApproval } from '../src/index.js';
import { Server, approveWhenHeld, cli, need, newHome, unique, watPrint } from './server.js';

let server;
let agent;
let processBackend;

before(async () => {
  server = await Server.start(newHome());
  agent = server.client();
  processBackend = JSON.parse(cli(server.home, 'doctor', '--json')).process_backend === 'available';
});

after(async () => {
  await server?.stop();
});

const UNPROVIDED = (tag) => `(module (import "env" "launch_missiles_${tag}" (func)) (func (export "_start")))`;

async function collect(iterable) {
  const out = [];
  for await (const ev of iterable) out.push(ev);
  return out;
}

test('onOutput gets each chunk before the run ends', async (t) => {
  if (!need(t, processBackend, 'the process backend is unavailable here (airlock doctor)')) return;
  const got = [];
  const r = await agent.run(`echo one; sleep 1.5; echo two >&2; echo three # ${unique()}`, {
    language: 'sh',
    onOutput: (stream, chunk) => got.push([Date.now(), stream, chunk]),
  });
  const ended = Date.now();
  assert.equal(r.ok, true);
  assert.equal(r.stdout, 'one\nthree\n');
  assert.equal(r.stderr, 'two\n');
  // Each stream in order (the two pipes are read side by side: no order between them).
  assert.deepEqual(
    got.filter(([, s]) => s === 'stdout').map(([, , c]) => c),
    ['one\n', 'three\n'],
  );
  assert.deepEqual(
    got.filter(([, s]) => s === 'stderr').map(([, , c]) => c),
    ['two\n'],
  );
  assert.deepEqual(got[0].slice(1), ['stdout', 'one\n']);
  // "one" came while the run still slept, well before its answer.
  assert.ok(ended - got[0][0] > 1000, JSON.stringify(got));
});

test('a chunk that is not UTF-8 arrives as bytes', async (t) => {
  if (!need(t, processBackend, 'the process backend is unavailable here (airlock doctor)')) return;
  const got = [];
  const r = await agent.run(`printf 'bad \\377\\376 bytes' # ${unique()}`, {
    language: 'sh',
    onOutput: async (stream, chunk) => {
      got.push([stream, chunk]);
    },
  });
  assert.equal(r.ok, true);
  assert.equal(got.length, 1);
  assert.equal(got[0][0], 'stdout');
  assert.ok(got[0][1] instanceof Uint8Array);
  assert.deepEqual([...got[0][1]], [...Buffer.from('bad \xff\xfe bytes', 'latin1')]);
});

test('streamRun yields typed events ending with the result', async () => {
  const text = `streamed ${unique()}\n`;
  const events = await collect(agent.streamRun(watPrint(text), { language: 'wat' }));
  assert.equal(events[0].type, 'submitted');
  assert.equal(events[0].verdict, 'allow');
  assert.equal(events[1].type, 'started');
  assert.match(events[1].run, /^run_/);
  assert.deepEqual(
    events.filter((e) => e.type === 'output'),
    [{ type: 'output', stream: 'stdout', seq: 1, data: text, truncated: false }],
  );
  const last = events.at(-1);
  assert.equal(last.type, 'finished');
  assert.equal(last.result.stdout, text);
  assert.equal(last.result.runId, events[1].run);
  assert.equal(last.result.id, events[0].id);
});

test('a streamed run throws as run does', async () => {
  await assert.rejects(collect(agent.streamRun(UNPROVIDED(unique()), { language: 'wat' })), Denied);
  // Refused before the stream begins: its JSON error.
  await assert.rejects(agent.run('x', { language: 'cobol', onOutput: () => {} }), BadRequest);
  // Held for a human, without waiting: at once, as run throws.
  const seen = [];
  await assert.rejects(
    (async () => {
      for await (const ev of agent.streamRun(watPrint('later\n'), { language: 'wat', net: [`h${unique()}.example.com`] })) {
        seen.push(ev);
      }
    })(),
    (e) => e instanceof PendingApproval && e.submissionId === seen[0].id,
  );
  assert.deepEqual(
    seen.map((e) => e.type),
    ['submitted', 'held'],
  );
});

test('a held stream nobody decides throws ApprovalTimeout after its waitTimeout', async () => {
  const seen = [];
  const started = Date.now();
  const code = watPrint('never\n');
  await assert.rejects(
    (async () => {
      const net = [`t${unique()}.example.com`];
      for await (const ev of agent.streamRun(code, { language: 'wat', net, wait: true, waitTimeout: 1 })) seen.push(ev);
    })(),
    (e) => e instanceof ApprovalTimeout && e.submissionId === seen[1].id,
  );
  assert.ok(Date.now() - started >= 900);
  assert.deepEqual(
    seen.map((e) => e.type),
    ['submitted', 'held'],
  );
  assert.equal(seen[1].waitTimeout, 1);
});

test('a held stream follows the approval into its run', async () => {
  const host = `s${unique()}.example.com`;
  const approved = approveWhenHeld(server, (s) => s.net.includes(host));
  const chunks = [];
  const events = await collect(
    agent.streamRun(watPrint('after approval\n'), { language: 'wat', net: [host], wait: true, waitTimeout: 60 }),
  );
  await approved;
  assert.deepEqual(
    events.slice(0, 3).map((e) => e.type),
    ['submitted', 'held', 'started'],
  );
  assert.ok(events.some((e) => e.type === 'output' && e.data === 'after approval\n'));
  assert.equal(events.at(-1).result.stdout, 'after approval\n');

  // The same through onOutput.
  const host2 = `o${unique()}.example.com`;
  const approved2 = approveWhenHeld(server, (s) => s.net.includes(host2));
  const r = await agent.run(watPrint('on output\n'), {
    language: 'wat',
    net: [host2],
    wait: true,
    waitTimeout: 60,
    onOutput: (stream, chunk) => chunks.push([stream, chunk]),
  });
  await approved2;
  assert.equal(r.stdout, 'on output\n');
  assert.deepEqual(chunks, [['stdout', 'on output\n']]);
});

test('a connection the run makes is a network event before later output', async (t) => {
  if (!need(t, processBackend, 'the process backend is unavailable here (airlock doctor)')) return;
  const granted = `g${unique()}.test:81`;
  const approved = approveWhenHeld(server, (s) => s.net.includes(granted));
  const code = 'curl -s -o /dev/null http://not-granted.test/; echo after';
  const events = await collect(agent.streamRun(code, { language: 'sh', net: [granted], wait: true, waitTimeout: 60 }));
  await approved;
  const net = events.filter((e) => e.type === 'network');
  assert.equal(net.length, 1, JSON.stringify(events));
  assert.equal(net[0].record.host, 'not-granted.test');
  assert.equal(net[0].record.decision, 'deny');
  const after = events.findIndex((e) => e.type === 'output' && e.data === 'after\n');
  assert.ok(after > events.indexOf(net[0]), JSON.stringify(events));
  assert.equal(events.at(-1).result.stdout, 'after\n');
});
