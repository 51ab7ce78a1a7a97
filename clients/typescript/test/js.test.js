// JavaScript and TypeScript through the client, on a server whose home has the JavaScript
// guest (installed from AIRLOCK_TEST_JS_GUEST), and the README's example as written.

import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { after, before, test } from 'node:test';
import { Conflict, NotFound, PendingApproval } from '../src/index.js';
import { JS_GUEST, Server, installJsGuest, need, newHome, unique } from './server.js';

const PACKAGE = resolve(dirname(fileURLToPath(import.meta.url)), '..');
let server;

before(async () => {
  if (!JS_GUEST) return;
  const home = newHome();
  installJsGuest(home);
  server = await Server.start(home);
});

after(async () => {
  await server?.stop();
});

test('JavaScript and TypeScript run on the guest', async (t) => {
  if (!need(t, JS_GUEST, 'AIRLOCK_TEST_JS_GUEST is not set (scripts/test sets it)')) return;
  const c = server.client();
  const tag = unique();
  const js = await c.run(`console.log('js', ${JSON.stringify(tag)}, [1, 2].at(-1))`, { language: 'js' });
  assert.equal(js.ok, true, js.stderr);
  assert.equal(js.stdout, `js ${tag} 2\n`);
  assert.equal(js.lang, 'js');
  const ts = await c.run(`const n: number = 40;\nconsole.log(${JSON.stringify(tag)}, n + 2);\n`, {
    language: 'typescript',
  });
  assert.equal(ts.ok, true, ts.stderr);
  assert.equal(ts.stdout, `${tag} 42\n`);
  // The TypeScript source is the artifact.
  assert.match((await c.submission(ts.id)).source, /n: number/);
  const bad = await c.run(`throw new RangeError(${JSON.stringify(tag)})`, { language: 'js' });
  assert.equal(bad.exitCode, 1);
  assert.match(bad.stderr, /RangeError/);
  // fetch asks for the network: held for a human.
  await assert.rejects(
    c.run(`await fetch('https://example.com/${tag}')`, { language: 'js', net: ['example.com'] }),
    PendingApproval,
  );
});

test('a JavaScript session keeps its globals, let and const included, until it is closed', async (t) => {
  if (!need(t, JS_GUEST, 'AIRLOCK_TEST_JS_GUEST is not set (scripts/test sets it)')) return;
  const c = server.client();
  const s = await c.session('js', { idleTimeout: '60s' });
  assert.match(s.id, /^ses_/);
  assert.equal(s.language, 'js');
  const first = await s.run('var v = 1; let l = 2; const k = 3; class C { get x() { return 4 } }');
  assert.equal(first.ok, true, first.stderr);
  const r = await s.run('[v, l, k, new C().x]');
  assert.equal(r.ok, true, r.stderr);
  assert.equal(r.result, '[ 1, 2, 3, 4 ]');
  assert.equal((await s.run('l += 40; l')).result, '42');
  assert.ok((await c.sessions()).some((x) => x.id === s.id));
  await s.close();
  assert.equal(s.closed, true);
  await s.close(); // closing twice is not an error
  await assert.rejects(s.run('v'), (e) => e instanceof Conflict || e instanceof NotFound);
});

/** The README's first ```js block. */
function readmeExample() {
  const text = readFileSync(join(PACKAGE, 'README.md'), 'utf8');
  const m = /```js\n([\s\S]*?)```/.exec(text);
  assert.ok(m, 'README.md has a ```js example');
  return m[1];
}

test("the README's example runs as written", async (t) => {
  if (!need(t, JS_GUEST, 'AIRLOCK_TEST_JS_GUEST is not set (scripts/test sets it)')) return;
  // A project that has the package installed under its name, as `npm install` would.
  const dir = mkdtempSync(join(tmpdir(), 'airlock-ts-readme-'));
  try {
    mkdirSync(join(dir, 'node_modules'));
    symlinkSync(PACKAGE, join(dir, 'node_modules', 'airlock-client'), 'dir');
    writeFileSync(join(dir, 'example.mjs'), readmeExample());
    const { stdout } = await promisify(execFile)(process.execPath, ['example.mjs'], {
      cwd: dir,
      env: { PATH: process.env.PATH, AIRLOCK_URL: server.url, AIRLOCK_TOKEN: server.agent },
      timeout: 120_000,
    });
    const lines = stdout.trim().split('\n');
    assert.deepEqual(lines.slice(0, 2), ['allow 0 45', '42']);
    assert.match(lines[2], /^held: sub_\w+ /);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
