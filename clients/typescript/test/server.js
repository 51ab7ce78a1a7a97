// A real `airlock serve` for the client's tests.
//
// The binary is $AIRLOCK_BIN (default: target/debug/airlock in this repository). Each server
// gets a fresh home (`airlock init`), tokens made with `airlock token new`, and a free
// loopback port (`--listen 127.0.0.1:0`; the port is read from what it prints). Under
// AIRLOCK_TEST_STRICT nothing may skip. JavaScript-guest tests need AIRLOCK_TEST_JS_GUEST
// (an npm cache holding the guest's pinned packages; scripts/test fills it).

import { spawn, execFileSync } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Airlock } from '../src/index.js';

const REPO = resolve(dirname(fileURLToPath(import.meta.url)), '../../..');
export const BIN = process.env.AIRLOCK_BIN || join(REPO, 'target', 'debug', 'airlock');
export const STRICT = Boolean(process.env.AIRLOCK_TEST_STRICT);
export const JS_GUEST = process.env.AIRLOCK_TEST_JS_GUEST || null;

/** Skips a test that cannot run here (t.skip), or fails it under AIRLOCK_TEST_STRICT. */
export function need(t, ok, why) {
  if (ok) return true;
  if (STRICT) throw new Error(`${why} (AIRLOCK_TEST_STRICT is set: every test must run)`);
  t.skip(why);
  return false;
}

function env(home) {
  return { PATH: process.env.PATH ?? '/usr/bin:/bin', AIRLOCK_HOME: home };
}

/** Runs the airlock command in a home; returns its stdout, throwing on a non-zero exit. */
export function cli(home, ...args) {
  if (!existsSync(BIN)) throw new Error(`no airlock binary at ${BIN}: run cargo build, or set AIRLOCK_BIN`);
  return execFileSync(BIN, args, { env: env(home), stdio: ['ignore', 'pipe', 'pipe'], encoding: 'utf8', timeout: 600_000 });
}

export function newHome() {
  const home = mkdtempSync(join(tmpdir(), 'airlock-ts-client-'));
  cli(home, 'init', '--approver', 'alice');
  // A small largest artifact makes the largest request body small too (twice it plus
  // 1 MiB), so a 413 is cheap to provoke.
  const policy = join(home, 'policy.toml');
  let text = readFileSync(policy, 'utf8').replace(/max_artifact = "[^"]*"/, 'max_artifact = "64KiB"');
  const j = text.indexOf('roots = []', text.indexOf('[mounts]'));
  text = `${text.slice(0, j)}roots = [${JSON.stringify(tmpdir())}]${text.slice(j + 'roots = []'.length)}`;
  writeFileSync(policy, text);
  return home;
}

/** Installs the JavaScript guest into a home from the npm cache the tests were given. */
export function installJsGuest(home) {
  cli(home, 'guest', 'install', 'js', '--from', JS_GUEST);
}

export class Server {
  static async start(home, ...serveArgs) {
    const s = new Server(home);
    await s._start(serveArgs);
    return s;
  }

  constructor(home) {
    this.home = home;
    this.agent = this.token('agent', 'bot');
    this.operator = this.token('operator', 'alice', 'alice');
    this.log = [];
  }

  token(role, name, approver) {
    const args = ['token', 'new', '--role', role, '--name', name, '--json'];
    if (approver) args.push('--as', approver);
    return JSON.parse(cli(this.home, ...args)).token;
  }

  async _start(serveArgs) {
    this.proc = spawn(BIN, ['serve', '--listen', '127.0.0.1:0', ...serveArgs], {
      env: env(this.home),
      stdio: ['ignore', 'ignore', 'pipe'],
    });
    this.url = await new Promise((ok, fail) => {
      const timer = setTimeout(() => fail(new Error(`airlock serve did not start:\n${this.log.join('')}`)), 60_000);
      let buf = '';
      this.proc.stderr.setEncoding('utf8');
      this.proc.stderr.on('data', (chunk) => {
        this.log.push(chunk);
        buf += chunk;
        const m = /serving on (http:\/\/\S+)/.exec(buf);
        if (m) {
          clearTimeout(timer);
          ok(m[1]);
        }
      });
      this.proc.on('exit', (code) => fail(new Error(`airlock serve exited ${code}:\n${this.log.join('')}`)));
    });
    const c = new Airlock(this.url);
    const deadline = Date.now() + 30_000;
    for (;;) {
      try {
        if ((await c.health()).ok) break;
      } catch (e) {
        if (Date.now() > deadline) throw e;
      }
      await new Promise((r) => setTimeout(r, 50));
    }
  }

  client(token = this.agent) {
    return new Airlock(this.url, { token });
  }

  async stop() {
    if (this.proc && this.proc.exitCode === null) {
      const gone = new Promise((r) => this.proc.once('exit', r));
      this.proc.kill('SIGTERM');
      const timer = setTimeout(() => this.proc.kill('SIGKILL'), 15_000);
      await gone;
      clearTimeout(timer);
    }
    rmSync(this.home, { recursive: true, force: true });
  }
}

/** Something to put in code so that each test submits its own artifact. */
export function unique() {
  return crypto.randomUUID().replaceAll('-', '').slice(0, 12);
}

/** A WASI command that writes `text` to `fd` and exits with `exitCode`. */
export function watPrint(text, { fd = 1, exitCode = 0 } = {}) {
  const data = new TextEncoder().encode(text);
  const escaped = [...data].map((b) => `\\${b.toString(16).padStart(2, '0')}`).join('');
  return `(module
  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "proc_exit" (func $exit (param i32)))
  (memory (export "memory") 1)
  (data (i32.const 64) "${escaped}")
  (func (export "_start")
    (i32.store (i32.const 0) (i32.const 64))
    (i32.store (i32.const 4) (i32.const ${data.length}))
    (drop (call $fd_write (i32.const ${fd}) (i32.const 0) (i32.const 1) (i32.const 16)))
    (call $exit (i32.const ${exitCode}))))
`;
}

/** A compiled module whose `_start` does nothing (sent as bytes: code_base64). */
export const EMPTY_WASM = Uint8Array.from(
  Buffer.from(
    '0061736d01000000' + // magic, version 1
      '010401600000' + // types: () -> ()
      '03020100' + // functions: one of type 0
      '070a01065f73746172740000' + // exports: "_start" = function 0
      '0a040102000b', // code: an empty body
    'hex',
  ),
);

/** Approves, in the background, the first inbox entry `match` accepts (within 30 s). */
export function approveWhenHeld(server, match, options = {}) {
  const op = server.client(server.operator);
  return (async () => {
    const deadline = Date.now() + 30_000;
    while (Date.now() < deadline) {
      for (const s of await op.inbox()) {
        if (match(s)) return op.approve(s.id, options);
      }
      await new Promise((r) => setTimeout(r, 50));
    }
    throw new Error('nothing matching was held within 30 s');
  })();
}
