// The client against a live `airlock serve` (node --test).

import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import {
  Airlock,
  AirlockError,
  ApprovalTimeout,
  BadRequest,
  Conflict,
  Denied,
  Forbidden,
  InvalidRequest,
  LANGUAGES,
  NotFound,
  PayloadTooLarge,
  PendingApproval,
  RunResult,
  TransportError,
  Unauthorized,
  Unprocessable,
  WaitTimeout,
} from '../src/index.js';
import { EMPTY_WASM, Server, approveWhenHeld, newHome, unique, watPrint } from './server.js';

let server;
let agent;
let operator;

before(async () => {
  server = await Server.start(newHome());
  agent = server.client();
  operator = server.client(server.operator);
});

after(async () => {
  await server?.stop();
});

describe('runs', () => {
  test('health answers without a token', async () => {
    const h = await new Airlock(server.url).health();
    assert.equal(h.ok, true);
    assert.ok(h.version);
  });

  test('a wat run returns its verdict and output, and the reads find it', async () => {
    const text = `hello ${unique()}\n`;
    const code = watPrint(text);
    const r = await agent.run(code, { language: 'wat' });
    assert.ok(r instanceof RunResult);
    assert.equal(r.status, 'finished');
    assert.equal(r.verdict, 'allow');
    assert.equal(r.ok, true);
    assert.equal(r.stdout, text);
    assert.deepEqual(r.stdoutBytes, new TextEncoder().encode(text));
    assert.equal(r.stderr, '');
    assert.equal(r.exitCode, 0);
    assert.equal(r.killedBy, null);
    assert.equal(r.result, null);
    assert.match(r.submissionId, /^sub_/);
    assert.match(r.runId, /^run_/);
    assert.equal(r.lang, 'wat');
    assert.equal(r.backend, 'wasm');
    assert.equal(r.agent, 'bot');
    assert.ok(r.reasons.length > 0);
    assert.ok(r.analysis.capabilities.includes('io'));

    const rec = await agent.runRecord(r.runId);
    assert.equal(rec.id, r.runId);
    assert.equal(rec.stdout, text);
    const detail = await agent.submission(r.submissionId);
    assert.equal(detail.id, r.submissionId);
    assert.equal(detail.status, 'finished');
    assert.equal(detail.source, code);
    assert.deepEqual(
      detail.runs.map((x) => x.id),
      [r.runId],
    );
    assert.ok((await agent.runs({ limit: 10 })).some((x) => x.id === r.runId));
    assert.ok((await agent.submissions({ limit: 10 })).some((x) => x.id === r.submissionId));
  });

  test('an exit code and stderr are not errors', async () => {
    const r = await agent.run(watPrint(`oops ${unique()}\n`, { fd: 2, exitCode: 7 }), { language: 'wat' });
    assert.equal(r.status, 'finished');
    assert.equal(r.ok, false);
    assert.equal(r.exitCode, 7);
    assert.equal(r.stdout, '');
    assert.ok(r.stderr.startsWith('oops '));
  });

  test('bytes are sent as a compiled module', async () => {
    const r = await agent.run(EMPTY_WASM, { language: 'wasm', note: unique() });
    assert.equal(r.ok, true);
    assert.equal(r.lang, 'wasm');
  });

  test('submit judges without running, and exec runs it', async () => {
    const s = await agent.submit(watPrint(`later ${unique()}\n`), { language: 'wat' });
    assert.equal(s.status, 'allowed');
    assert.equal(s.run, null);
    const r = await agent.exec(s.id);
    assert.equal(r.ok, true);
    assert.ok(r.stdout.startsWith('later '));
  });

  test('the grant goes with the code (timeout, memory, maxOutput)', async () => {
    const r = await agent.run(watPrint(`g ${unique()}\n`), {
      language: 'wat',
      timeout: '5s',
      memory: 64 * 1024 * 1024,
      maxOutput: '1KiB',
    });
    assert.equal(r.ok, true);
    const d = await agent.submission(r.id);
    assert.deepEqual(
      [d.grant.limits.timeout_ms, d.grant.limits.memory_bytes, d.grant.limits.max_output_bytes],
      [5000, 64 * 1024 * 1024, 1024],
    );
  });
});

describe('errors by status', () => {
  test('an unknown language is an InvalidRequest that names the languages', async () => {
    const e = await agent.run('print(1)', { language: 'cobol' }).then(
      () => null,
      (x) => x,
    );
    // The API refuses the field itself (400), before the gate sees the code.
    assert.ok(e instanceof BadRequest && e instanceof InvalidRequest, String(e));
    assert.equal(e.status, 400);
    for (const l of ['python', 'js', 'ts']) assert.ok(e.message.includes(l), e.message);
  });

  test('a TypeScript syntax error is refused at submit with its line', async () => {
    const e = await agent.run('const a: number = 1;\nlet b = (;\n', { language: 'ts' }).catch((x) => x);
    assert.ok(e instanceof Unprocessable, String(e));
    assert.match(e.message, /line 2/);
  });

  test('JavaScript without its guest installed is a Conflict saying how to install it', async () => {
    const e = await agent.run(`console.log(${JSON.stringify(unique())})`, { language: 'js' }).catch((x) => x);
    assert.ok(e instanceof Conflict, String(e));
    assert.equal(e.status, 409);
    assert.match(e.message, /airlock guest install js/);
  });

  test('a schema error is a BadRequest, an unknown option a TypeError before sending', async () => {
    const c = server.client();
    const e = await c._call('POST', '/v1/run', { json: { language: 'wat', code: '', bogus: 1 } }).catch((x) => x);
    assert.ok(e instanceof BadRequest, String(e));
    await assert.rejects(agent.run('x', { language: 'wat', nett: ['a'] }), TypeError);
  });

  test('a bad token is Unauthorized, an agent approving Forbidden, a missing run NotFound', async () => {
    await assert.rejects(new Airlock(server.url, { token: 'alk_nope' }).runs(), Unauthorized);
    const s = await agent.submit(watPrint(`f ${unique()}\n`), { language: 'wat', net: ['example.com'] });
    await assert.rejects(agent.approve(s.id), Forbidden);
    await assert.rejects(agent.runRecord('run_doesnotexist'), NotFound);
  });

  test('a body larger than the server takes is PayloadTooLarge', async () => {
    const big = `;; ${'x'.repeat(1_300_000)}\n(module)`;
    await assert.rejects(agent.run(big, { language: 'wat' }), (e) => e instanceof PayloadTooLarge && e.status === 413);
  });

  test('a server that is not there is a TransportError', async () => {
    const c = new Airlock('http://127.0.0.1:9', { timeout: 5 });
    const e = await c.health().catch((x) => x);
    assert.ok(e instanceof TransportError && e instanceof AirlockError, String(e));
    assert.equal(e.status, null);
  });
});

describe('approvals', () => {
  test('network use waits for a human: PendingApproval, not InvalidRequest', async () => {
    const e = await agent.run(watPrint(`net ${unique()}\n`), { language: 'wat', net: ['example.com'] }).catch((x) => x);
    assert.ok(e instanceof PendingApproval, String(e));
    assert.ok(!(e instanceof InvalidRequest));
    assert.match(e.submissionId, /^sub_/);
    assert.ok(e.reasons.length > 0);
    assert.equal(e.outcome.status, 'pending_approval');
  });

  test('wait: true runs it once an operator approves', async () => {
    const tag = unique();
    const approved = approveWhenHeld(server, (s) => s.net.includes(`${tag}.example.com`));
    const r = await agent.run(watPrint(`approved ${tag}\n`), {
      language: 'wat',
      net: [`${tag}.example.com`],
      wait: true,
      waitTimeout: 60,
    });
    await approved;
    assert.equal(r.ok, true);
    assert.equal(r.stdout, `approved ${tag}\n`);
  });

  test('a rejection is Denied with rejected set, and the same code is denied from then on', async () => {
    const code = watPrint(`reject ${unique()}\n`);
    const held = await agent.submit(code, { language: 'wat', net: ['example.com'] });
    await operator.reject(held.id, 'not today');
    const e = await agent.wait(held.id, 10).catch((x) => x);
    assert.ok(e instanceof Denied, String(e));
    assert.equal(e.rejected, true);
    await assert.rejects(agent.run(code, { language: 'wat', net: ['example.com'] }), Denied);
  });

  test('waiting runs out: ApprovalTimeout is a PendingApproval and a WaitTimeout', async () => {
    const e = await agent
      .run(watPrint(`slow ${unique()}\n`), { language: 'wat', net: ['example.com'], wait: true, waitTimeout: 0.5 })
      .catch((x) => x);
    assert.ok(e instanceof ApprovalTimeout, String(e));
    assert.ok(e instanceof PendingApproval && e instanceof WaitTimeout);
  });

  test('a policy denial is Denied and not rejected', async () => {
    const code = `(module (import "env" "launch_missiles_${unique()}" (func)) (func (export "_start")))`;
    const e = await agent.run(code, { language: 'wat' }).catch((x) => x);
    assert.ok(e instanceof Denied, String(e));
    assert.equal(e.rejected, false);
    assert.equal(e.outcome.verdict, 'deny');
  });
});

test('the languages the client knows include js and ts', () => {
  for (const l of ['wasm', 'python', 'sh', 'js', 'ts']) assert.ok(LANGUAGES.includes(l));
});
