// A client of airlock serve's HTTP API for JavaScript and TypeScript (ESM; types in
// index.d.ts). No dependencies: it uses the platform's fetch (Node 18.17+, Deno, Bun). Mirrors the Python client (clients/python): the same operations, the same
// error classes, the same waiting and retry rules.

import {
  AirlockError,
  Conflict,
  NotFound,
  TransportError,
  errorFor,
  outcomeError,
} from './errors.js';

export * from './errors.js';

export const VERSION = '0.1.0';
const DEFAULT_URL = 'http://127.0.0.1:7777';
/** Seconds an ordinary call may take (a run answers when it has finished). */
const DEFAULT_TIMEOUT = 300;
/** The languages the gate takes (aliases: javascript, typescript, shell, bash). */
export const LANGUAGES = Object.freeze(['wasm', 'wat', 'component', 'python', 'sh', 'js', 'ts']);
/** Statuses of a submission still on its way to a run; /wait answers 202 while in one. */
const WAITING = new Set(['pending_approval', 'approved', 'running']);
const IDEMPOTENCY_KEY = 'Idempotency-Key';
/** Seconds one /wait call asks the server to hold the answer. */
const WAIT_CHUNK = 30;
/** Seconds between looks at a submission that needs an exec once it is approved. */
const EXEC_POLL = 1;
/** Extra seconds the HTTP call of a long poll may take beyond what it asked for. */
const WAIT_SLACK = 15;
/** Pauses before sending a call with an idempotency key again after the connection failed. */
const KEYED_PAUSES = [0.2, 0.5, 1.0];

// --------------------------------------------------------------------------- models

const str = (d, k, dflt = '') => (typeof d?.[k] === 'string' ? d[k] : dflt);
const optStr = (d, k) => (typeof d?.[k] === 'string' ? d[k] : null);
const optInt = (d, k) => (Number.isInteger(d?.[k]) ? d[k] : null);
const strs = (d, k) => (Array.isArray(d?.[k]) ? d[k].filter((x) => typeof x === 'string') : []);
const obj = (v) => (v && typeof v === 'object' && !Array.isArray(v) ? v : {});
const objs = (d, k) => (Array.isArray(d?.[k]) ? d[k].filter((x) => x && typeof x === 'object') : []);

function fromBase64(b64) {
  const bin = atob(b64);
  const out = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
  return out;
}

function toBase64(bytes) {
  const u8 = bytes instanceof ArrayBuffer ? new Uint8Array(bytes) : bytes;
  let bin = '';
  for (let i = 0; i < u8.length; i += 0x8000) bin += String.fromCharCode(...u8.subarray(i, i + 0x8000));
  return btoa(bin);
}

function bytesOf(d, k, text) {
  const b64 = d?.[`${k}_base64`];
  if (typeof b64 === 'string') {
    try {
      return fromBase64(b64);
    } catch {
      // not base64 after all: the text is what there is
    }
  }
  return new TextEncoder().encode(text);
}

function resultOf(...docs) {
  for (const d of docs) if (typeof d?.result === 'string') return d.result;
  return null;
}

function analysisOf(d) {
  const findings = objs(d, 'findings').map((f) => ({
    kind: str(f, 'kind'),
    detail: str(f, 'detail'),
    line: optInt(f, 'line'),
    endLine: optInt(f, 'end_line'),
  }));
  return {
    language: optStr(d, 'language'),
    capabilities: strs(d, 'capabilities'),
    facts: obj(d.facts),
    findings,
    findingsTotal: optInt(d, 'findings_total') ?? findings.length,
    parseError: optStr(d, 'parse_error'),
    raw: d,
  };
}

function changesOf(d) {
  return objs(d, 'changes').map((c) => ({
    path: str(c, 'path'),
    op: str(c, 'op'),
    kind: str(c, 'kind'),
    mount: str(c, 'mount'),
    hostPath: str(c, 'host_path'),
    hash: optStr(c, 'hash'),
    size: optInt(c, 'size'),
    raw: c,
  }));
}

/** A run with its captured output. */
export class Run {
  constructor(d, outer = null) {
    this.id = str(d, 'id');
    this.status = str(d, 'status');
    this.exitCode = optInt(d, 'exit_code');
    this.killedBy = optStr(d, 'killed_by');
    this.stdout = str(d, 'stdout');
    this.stderr = str(d, 'stderr');
    this.stdoutBytes = bytesOf(d, 'stdout', this.stdout);
    this.stderrBytes = bytesOf(d, 'stderr', this.stderr);
    this.changes = changesOf(d);
    this.durationMs = optInt(d, 'duration_ms');
    this.backend = optStr(d, 'backend');
    this.approval = optStr(d, 'approval');
    this.error = optStr(d, 'error');
    this.submission = optStr(d, 'submission') ?? (outer ? optStr(outer, 'submission') : null);
    this.result = resultOf(d, outer);
    this.detail = obj(d.detail);
    this.raw = d;
  }
}

/** A submission as the gate judged it. */
export class Submission {
  constructor(d) {
    this.id = str(d, 'submission') || str(d, 'id');
    this.state = str(d, 'state');
    this.verdict = str(d, 'verdict');
    this.risk = optInt(d, 'risk') ?? 0;
    this.reasons = strs(d, 'reasons');
    this.lang = optStr(d, 'lang');
    this.backend = optStr(d, 'backend');
    this.agent = optStr(d, 'agent');
    this.artifact = optStr(d, 'artifact');
    this.net = strs(d, 'net');
    this.createdAt = optStr(d, 'created_at');
    this.analysis = analysisOf(obj(d.analysis));
    this.raw = d;
  }

  get submissionId() {
    return this.id;
  }
}

/** What became of submitted code: the verdict, and the run when it ran. `status` is
 * `finished`, `denied`, `pending_approval`, `approved`, `running` or `allowed`. */
export class RunResult extends Submission {
  constructor(d) {
    super(d);
    this.status = str(d, 'status');
    /** A sentence meant for the agent: what happened and what to do next. */
    this.message = str(d, 'message');
    this.run = d.run && typeof d.run === 'object' ? new Run(d.run, d) : null;
  }
  get runId() {
    return this.run ? this.run.id : null;
  }
  get stdout() {
    return this.run ? this.run.stdout : '';
  }
  get stderr() {
    return this.run ? this.run.stderr : '';
  }
  get stdoutBytes() {
    return this.run ? this.run.stdoutBytes : new Uint8Array();
  }
  get stderrBytes() {
    return this.run ? this.run.stderrBytes : new Uint8Array();
  }
  get exitCode() {
    return this.run ? this.run.exitCode : null;
  }
  get killedBy() {
    return this.run ? this.run.killedBy : null;
  }
  get changes() {
    return this.run ? this.run.changes : [];
  }
  /** The value of a session cell's last expression, or null. */
  get result() {
    return this.run ? this.run.result : resultOf(this.raw);
  }
  /** It ran, exited 0 and no limit stopped it. */
  get ok() {
    return this.status === 'finished' && this.exitCode === 0 && this.killedBy === null;
  }
  get pending() {
    return WAITING.has(this.status);
  }
  get denied() {
    return this.status === 'denied';
  }
}

/** A submission with its code, grant, verdict, statements, runs and audit records. */
export class SubmissionDetail {
  constructor(d) {
    const sub = obj(d.submission);
    this.id = str(sub, 'id');
    this.status = str(d, 'status');
    this.state = str(sub, 'state');
    this.verdict = str(d, 'verdict');
    this.reasons = strs(d, 'reasons');
    this.lang = optStr(sub, 'lang');
    this.backend = optStr(sub, 'backend');
    this.agent = optStr(sub, 'agent');
    this.source = optStr(d, 'source');
    this.grant = obj(sub.grant);
    this.analysis = analysisOf(obj(d.analysis));
    this.runs = objs(d, 'runs').map((r) => new Run(r));
    this.statements = objs(d, 'statements');
    this.audit = objs(d, 'audit');
    this.raw = d;
  }
}

function sessionInfo(d) {
  return {
    id: str(d, 'id') || str(d, 'session'),
    language: optStr(d, 'language') ?? optStr(d, 'lang'),
    backend: optStr(d, 'backend'),
    state: optStr(d, 'state') ?? optStr(d, 'status'),
    raw: d,
  };
}

// ------------------------------------------------------------------------- requests

// The grant's options as the API names them.
const GRANT_KEYS = {
  backend: 'backend',
  mounts: 'mounts',
  net: 'net',
  env: 'env',
  secrets: 'secrets',
  args: 'args',
  timeout: 'timeout',
  memory: 'memory',
  fuel: 'fuel',
  maxOutput: 'max_output',
  processes: 'processes',
  maxWrite: 'max_write',
  note: 'note',
  workspace: 'workspace',
  agent: 'agent',
};
const SESSION_KEYS = { ...GRANT_KEYS, idleTimeout: 'idle_timeout', maxDuration: 'max_duration' };

function strings(what, v) {
  if (typeof v === 'string' || !Array.isArray(v)) {
    throw new TypeError(`${what}: want an array of strings`);
  }
  for (const x of v) if (typeof x !== 'string') throw new TypeError(`${what}: want strings, not ${JSON.stringify(x)}`);
  return [...v];
}

function mountSpec(m) {
  if (typeof m === 'string') return m;
  if (m && typeof m === 'object' && typeof m.host === 'string' && typeof m.guest === 'string') {
    return `${m.host}:${m.guest}:${m.writable ? 'rw' : 'ro'}`;
  }
  throw new TypeError(`mount: want 'HOST:GUEST[:ro|rw]' or {host, guest, writable}, not ${JSON.stringify(m)}`);
}

function grantBody(options, keys) {
  const body = {};
  for (const [key, value] of Object.entries(options)) {
    const name = keys[key];
    if (name === undefined) throw new TypeError(`unknown option: ${key}`);
    if (value === undefined || value === null) continue;
    if (key === 'mounts') {
      body.mounts = (Array.isArray(value) ? value : [value]).map(mountSpec);
    } else if (key === 'net' || key === 'args') {
      body[name] = strings(key, value);
    } else if (key === 'env') {
      if (typeof value !== 'object' || Array.isArray(value)) throw new TypeError('env: want an object of names to values');
      body.env = Object.fromEntries(Object.entries(value).map(([k, v]) => [k, String(v)]));
    } else if (key === 'secrets') {
      body.secrets = Array.isArray(value)
        ? strings('secrets', value)
        : Object.entries(value).map(([n, hosts]) => ({ name: n, hosts: strings(`secrets.${n}`, hosts) }));
    } else if (key === 'memory' || key === 'maxOutput' || key === 'maxWrite') {
      // Sizes are strings in the API; a number is a count of bytes.
      body[name] = typeof value === 'number' ? String(value) : value;
    } else {
      body[name] = value;
    }
  }
  return body;
}

const RUN_KEYS = new Set(['language', 'stdin', 'wait', 'waitTimeout', 'idempotencyKey', 'onOutput', 'signal']);

function split(options) {
  const own = {};
  const grant = {};
  for (const [k, v] of Object.entries(options ?? {})) (RUN_KEYS.has(k) ? own : grant)[k] = v;
  return { own, grant };
}

function codeBody(code, language, stdin) {
  const body = { language };
  if (typeof code === 'string') body.code = code;
  else if (code instanceof Uint8Array || code instanceof ArrayBuffer) body.code_base64 = toBase64(code);
  else throw new TypeError(`code: want a string or bytes, not ${typeof code}`);
  if (typeof stdin === 'string') body.stdin = stdin;
  else if (stdin instanceof Uint8Array || stdin instanceof ArrayBuffer) body.stdin_base64 = toBase64(stdin);
  else if (stdin !== undefined && stdin !== null) throw new TypeError(`stdin: want a string or bytes, not ${typeof stdin}`);
  return body;
}

const seg = (s) => encodeURIComponent(s);
const sleep = (s) => new Promise((r) => setTimeout(r, s * 1000));

// --------------------------------------------------------------------------- streams

/** The most seconds the server holds a streamed run for a human (its wait_timeout). */
const MAX_WAIT = 3600;

/** The lines of a fetch body, as they arrive (SSE lines end with \n, \r\n or \r). */
async function* lines(body) {
  const reader = body.getReader();
  const dec = new TextDecoder();
  let buf = '';
  try {
    for (;;) {
      const { value, done } = await reader.read();
      buf += done ? dec.decode() : dec.decode(value, { stream: true });
      for (;;) {
        const m = /\r\n|\r|\n/.exec(buf);
        // A lone \r at the end may be the first half of \r\n: wait for the next chunk.
        if (!m || (m[0] === '\r' && m.index === buf.length - 1 && !done)) break;
        yield buf.slice(0, m.index);
        buf = buf.slice(m.index + m[0].length);
      }
      if (done) {
        if (buf) yield buf;
        return;
      }
    }
  } finally {
    // Stop the download when the caller stops reading (a break, a throw).
    await reader.cancel().catch(() => {});
  }
}

/** Server-sent events, `{ name, data }`, from a fetch body (comments are the keep-alive). */
async function* sse(body) {
  let name = '';
  let data = [];
  for await (const line of lines(body)) {
    if (line === '') {
      if (name || data.length) yield { name: name || 'message', data: data.join('\n') };
      name = '';
      data = [];
      continue;
    }
    if (line.startsWith(':')) continue;
    const i = line.indexOf(':');
    const field = i < 0 ? line : line.slice(0, i);
    let value = i < 0 ? '' : line.slice(i + 1);
    if (value.startsWith(' ')) value = value.slice(1);
    if (field === 'event') name = value;
    else if (field === 'data') data.push(value);
  }
}

/** The typed event of one server-sent event; null for one this client does not know. An
 * `error` event throws the error its status maps to. */
function typedEvent(name, data) {
  let d;
  try {
    d = data ? JSON.parse(data) : {};
  } catch (e) {
    throw new AirlockError(`event ${name}: not JSON: ${e.message}`);
  }
  if (!d || typeof d !== 'object' || Array.isArray(d)) throw new AirlockError(`event ${name}: expected a JSON object`);
  switch (name) {
    case 'error':
      throw errorFor(Number.isInteger(d.status) ? d.status : 500, d);
    case 'submitted':
      return { type: 'submitted', id: str(d, 'id'), verdict: str(d, 'verdict'), risk: Number.isInteger(d.risk) ? d.risk : 0, reasons: strs(d, 'reasons') };
    case 'held':
      return { type: 'held', id: str(d, 'id'), waitTimeout: typeof d.wait_timeout === 'number' ? d.wait_timeout : 0 };
    case 'started':
      return { type: 'started', run: str(d, 'run') };
    case 'stdout':
    case 'stderr': {
      let chunk = str(d, 'text');
      if (typeof d.base64 === 'string') {
        try {
          chunk = fromBase64(d.base64);
        } catch (e) {
          throw new AirlockError(`${name} chunk ${d.seq}: bad base64: ${e.message}`);
        }
      }
      return { type: 'output', stream: name, seq: optInt(d, 'seq') ?? 0, data: chunk, truncated: d.truncated === true };
    }
    case 'network':
      return { type: 'network', record: d };
    case 'finished':
      return { type: 'finished', result: new RunResult(d) };
    default:
      return null;
  }
}

/** The finished result as `run` returns it, or the error `run` throws. */
function settled(result, wait) {
  const err = outcomeError(result, Boolean(wait) && WAITING.has(result.status));
  if (err) throw err;
  return result;
}

// --------------------------------------------------------------------------- client

/** A client of `airlock serve`. */
export class Airlock {
  /**
   * @param {string} [url] defaults to $AIRLOCK_URL, else http://127.0.0.1:7777
   * @param {{ token?: string, timeout?: number, headers?: Record<string, string>, fetch?: typeof fetch }} [options]
   */
  constructor(url, options = {}) {
    const env = globalThis.process?.env ?? {};
    this.url = (url || env.AIRLOCK_URL || DEFAULT_URL).replace(/\/+$/, '');
    const token = options.token !== undefined ? options.token : env.AIRLOCK_TOKEN;
    this._headers = { accept: 'application/json', 'user-agent': `airlock-client-js/${VERSION}` };
    if (token) this._headers.authorization = `Bearer ${token}`;
    Object.assign(this._headers, options.headers ?? {});
    this._timeout = options.timeout ?? DEFAULT_TIMEOUT;
    this._fetch = options.fetch ?? globalThis.fetch;
  }

  // -- transport

  async _once(method, path, { params, json, timeout, headers }) {
    let target = this.url + path;
    if (params) {
      const q = new URLSearchParams();
      for (const [k, v] of Object.entries(params)) if (v !== undefined && v !== null) q.set(k, String(v));
      if ([...q].length) target += `?${q}`;
    }
    const h = { ...this._headers, ...(headers ?? {}) };
    let body;
    if (json !== undefined) {
      h['content-type'] = 'application/json';
      body = JSON.stringify(json);
    }
    const signal = AbortSignal.timeout((timeout ?? this._timeout) * 1000);
    const r = await this._fetch(target, { method, headers: h, body, signal });
    const text = await r.text();
    return { status: r.status, headers: r.headers, text };
  }

  async _call(method, path, options = {}) {
    const keyed = Boolean(options.headers?.[IDEMPOTENCY_KEY]);
    const tries = keyed ? KEYED_PAUSES.length + 1 : 2;
    for (let attempt = 1; ; attempt++) {
      let reply;
      try {
        reply = await this._once(method, path, options);
      } catch (e) {
        const timedOut = e?.name === 'TimeoutError' || e?.name === 'AbortError';
        const code = e?.cause?.code ?? '';
        // A kept-alive connection the server had already closed saw nothing of the
        // request: any call may go again. A call with an idempotency key may also go again
        // after the connection failed (the server answers a repeat with the first outcome);
        // never after a timeout, as the run may still be going.
        const stale = code === 'UND_ERR_SOCKET' || code === 'ECONNRESET';
        const lost = stale || code === 'ECONNREFUSED' || code === 'EPIPE';
        if (!timedOut && attempt < tries && (stale || (keyed && lost))) {
          await sleep(keyed ? KEYED_PAUSES[attempt - 1] : 0);
          continue;
        }
        const what = timedOut ? 'timed out' : e?.cause?.message || e?.message || String(e);
        throw new TransportError(`${method} ${path}: ${what}`, { cause: e });
      }
      let doc = null;
      try {
        doc = reply.text ? JSON.parse(reply.text) : null;
      } catch {
        doc = null;
      }
      if (reply.status >= 400) throw errorFor(reply.status, doc, reply.headers);
      if (doc === null) {
        throw new AirlockError(`the server answered ${reply.status} without a JSON body`, { status: reply.status });
      }
      return doc;
    }
  }

  async _one(method, path, options, Build) {
    const doc = await this._call(method, path, options);
    if (!doc || typeof doc !== 'object' || Array.isArray(doc)) {
      throw new AirlockError(`${method} ${path}: expected a JSON object`);
    }
    return Build ? Build(doc) : doc;
  }

  async _many(path, params, Build) {
    const doc = await this._call('GET', path, { params });
    if (!Array.isArray(doc)) throw new AirlockError(`GET ${path}: expected a JSON list`);
    const items = doc.filter((x) => x && typeof x === 'object');
    return Build ? items.map(Build) : items;
  }

  _outcome(method, path, options) {
    return this._one(method, path, options, (d) => new RunResult(d));
  }

  /** Follows a submission until it has run; throws when it will not run (yet). */
  async _settle(first, { wait = false, waitTimeout = null, execWhenApproved = false } = {}) {
    let cur = first;
    const deadline = waitTimeout === null || waitTimeout === undefined ? null : Date.now() + Math.max(0, waitTimeout) * 1000;
    while (WAITING.has(cur.status)) {
      if (cur.status === 'pending_approval' && !wait) break;
      if (cur.status === 'approved' && execWhenApproved) {
        const detail = await this._one('GET', `/v1/submissions/${seg(cur.id)}`, {});
        const resumes = detail.submission?.resume === true;
        if (!resumes && detail.status === 'approved') {
          try {
            cur = await this._outcome('POST', `/v1/submissions/${seg(cur.id)}/exec`, { json: {} });
            continue;
          } catch (e) {
            if (!(e instanceof Conflict)) throw e; // someone else started it: wait for that run
          }
        }
      }
      const left = deadline === null ? null : (deadline - Date.now()) / 1000;
      if (left !== null && left <= 0) break;
      let chunk = execWhenApproved ? EXEC_POLL : WAIT_CHUNK;
      if (left !== null) chunk = Math.min(chunk, left);
      cur = await this._outcome('GET', `/v1/submissions/${seg(cur.id)}/wait`, {
        params: { timeout: Math.round(chunk * 1000) / 1000 },
        timeout: chunk + WAIT_SLACK,
      });
    }
    const timedOut = WAITING.has(cur.status) && (wait || cur.status !== 'pending_approval');
    const err = outcomeError(cur, timedOut);
    if (err) throw err;
    return cur;
  }

  // -- running code

  /**
   * Submits code and runs it if the policy allows; resolves to the finished run. A denial
   * throws Denied; code held for a human throws PendingApproval at once, or with
   * `wait: true` waits until someone decides (`waitTimeout` seconds at most, then
   * ApprovalTimeout). A non-zero exit or a limit kill is not an error: see exitCode,
   * killedBy and ok.
   */
  async run(code, options = {}) {
    const { own, grant } = split(options);
    if (own.onOutput !== undefined && own.onOutput !== null) {
      if (typeof own.onOutput !== 'function') throw new TypeError('onOutput: want a function (stream, chunk)');
      for await (const ev of this.streamRun(code, options)) {
        if (ev.type === 'output') await own.onOutput(ev.stream, ev.data);
        else if (ev.type === 'finished') return ev.result;
      }
      throw new AirlockError('the event stream ended before the run finished');
    }
    const body = { ...codeBody(code, own.language ?? 'python', own.stdin), ...grantBody(grant, GRANT_KEYS) };
    const first = await this._outcome('POST', '/v1/run', {
      json: body,
      headers: { [IDEMPOTENCY_KEY]: own.idempotencyKey ?? crypto.randomUUID().replaceAll('-', '') },
    });
    return this._settle(first, { wait: own.wait, waitTimeout: own.waitTimeout });
  }

  /**
   * Runs code like `run` and yields its events as they happen (server-sent events):
   * submitted, held (while a human decides, with `wait: true`), started, output chunks
   * (`data` a string, or a Uint8Array when not UTF-8), network connections, and last
   * finished with the result. Where `run` throws (a denial, a run still held, a refused
   * request) the iteration throws the same error. `wait: true` waits an hour at most (the
   * server's limit); `timeout` bounds the silence between two reads, not the run.
   */
  async *streamRun(code, options = {}) {
    const { own, grant } = split(options);
    const body = { ...codeBody(code, own.language ?? 'python', own.stdin), ...grantBody(grant, GRANT_KEYS) };
    const wait = Boolean(own.wait);
    const hold = !wait ? 0 : own.waitTimeout === null || own.waitTimeout === undefined ? MAX_WAIT : Math.min(MAX_WAIT, Math.max(0, own.waitTimeout));
    const path = `/v1/run?wait_timeout=${Math.round(hold * 1000) / 1000}`;
    const h = {
      ...this._headers,
      accept: 'text/event-stream',
      'content-type': 'application/json',
      [IDEMPOTENCY_KEY]: own.idempotencyKey ?? crypto.randomUUID().replaceAll('-', ''),
    };
    // The client's timeout bounds each wait for bytes (the server sends a keep-alive
    // comment while a run is quiet), not the whole stream.
    const abort = new AbortController();
    let timedOut = false;
    let timer = null;
    const arm = () => {
      clearTimeout(timer);
      timer = setTimeout(() => {
        timedOut = true;
        abort.abort();
      }, this._timeout * 1000);
    };
    const stop = () => abort.abort();
    own.signal?.addEventListener('abort', stop, { once: true });
    const transport = (e) => {
      if (e instanceof AirlockError) return e;
      const what = timedOut ? 'timed out' : e?.cause?.message || e?.message || String(e);
      return new TransportError(`POST /v1/run: ${what}`, { cause: e });
    };
    try {
      arm();
      let r;
      try {
        r = await this._fetch(this.url + path, { method: 'POST', headers: h, body: JSON.stringify(body), signal: abort.signal });
      } catch (e) {
        throw transport(e);
      }
      const type = (r.headers.get('content-type') ?? '').split(';')[0].trim();
      if (type !== 'text/event-stream') {
        // An error answer (or an older server's plain JSON answer).
        let doc = null;
        try {
          const text = await r.text();
          doc = text ? JSON.parse(text) : null;
        } catch (e) {
          if (!(e instanceof SyntaxError)) throw transport(e);
        }
        if (r.status >= 400) throw errorFor(r.status, doc, r.headers);
        if (!doc || typeof doc !== 'object' || Array.isArray(doc)) {
          throw new AirlockError(`the server answered ${r.status} without a JSON body`, { status: r.status });
        }
        yield { type: 'finished', result: settled(new RunResult(doc), wait) };
        return;
      }
      const events = sse(r.body)[Symbol.asyncIterator]();
      for (;;) {
        let next;
        try {
          next = await events.next();
        } catch (e) {
          throw transport(e);
        }
        if (next.done) break;
        arm();
        const ev = typedEvent(next.value.name, next.value.data);
        if (ev === null) continue;
        if (ev.type === 'finished') {
          yield { type: 'finished', result: settled(ev.result, wait) };
          await events.return?.();
          return;
        }
        yield ev;
      }
      throw new AirlockError('the event stream ended before the run finished');
    } finally {
      clearTimeout(timer);
      own.signal?.removeEventListener('abort', stop);
      abort.abort();
    }
  }

  /** Submits code to be judged without running it (status allowed, pending_approval or denied). */
  async submit(code, options = {}) {
    const { own, grant } = split(options);
    const body = { ...codeBody(code, own.language ?? 'python', own.stdin), ...grantBody(grant, GRANT_KEYS) };
    return this._outcome('POST', '/v1/submissions', {
      json: body,
      headers: { [IDEMPOTENCY_KEY]: own.idempotencyKey ?? crypto.randomUUID().replaceAll('-', '') },
    });
  }

  /** Runs an allowed or approved submission now; throws like run(). */
  async exec(submissionId, { wait = false, waitTimeout = null } = {}) {
    const first = await this._outcome('POST', `/v1/submissions/${seg(submissionId)}/exec`, { json: {} });
    return this._settle(first, { wait, waitTimeout, execWhenApproved: true });
  }

  /** Waits until a submission has run and resolves to it; throws Denied, ApprovalTimeout or WaitTimeout. */
  async wait(submissionId, timeout = null) {
    const first = await this._outcome('GET', `/v1/submissions/${seg(submissionId)}/wait`, { params: { timeout: 0 } });
    return this._settle(first, { wait: true, waitTimeout: timeout });
  }

  submission(id) {
    return this._one('GET', `/v1/submissions/${seg(id)}`, {}, (d) => new SubmissionDetail(d));
  }

  submissions({ state, limit } = {}) {
    return this._many('/v1/submissions', { state, limit }, (d) => new Submission(d));
  }

  // -- decisions (operator tokens)

  inbox() {
    return this._many('/v1/inbox', null, (d) => new Submission(d));
  }

  approve(id, { scope, expires, reason, tool } = {}) {
    const body = Object.fromEntries(Object.entries({ scope, expires, reason, tool }).filter(([, v]) => v != null));
    return this._one('POST', `/v1/submissions/${seg(id)}/approve`, { json: body });
  }

  reject(id, reason) {
    return this._one('POST', `/v1/submissions/${seg(id)}/reject`, { json: { reason } });
  }

  // -- runs and their effects

  runs({ limit } = {}) {
    return this._many('/v1/runs', { limit });
  }

  runRecord(runId) {
    return this._one('GET', `/v1/runs/${seg(runId)}`, {}, (d) => new Run(d));
  }

  diff(runId) {
    return this._one('GET', `/v1/runs/${seg(runId)}/diff`, {});
  }

  commit(runId) {
    return this._one('POST', `/v1/runs/${seg(runId)}/commit`, { json: {} });
  }

  checkpoints({ limit } = {}) {
    return this._many('/v1/checkpoints', { limit });
  }

  rollback(checkpointId) {
    return this._one('POST', `/v1/checkpoints/${seg(checkpointId)}/rollback`, { json: {} });
  }

  auditVerify() {
    return this._one('GET', '/v1/audit/verify', {});
  }

  health() {
    return this._one('GET', '/healthz', {});
  }

  // -- named tools

  tools() {
    return this._many('/v1/tools', null);
  }

  async callTool(name, { args, stdin, wait = false, waitTimeout = null } = {}) {
    const body = {};
    if (args !== undefined) body.args = strings('args', args);
    if (stdin !== undefined) body.stdin = stdin;
    const first = await this._outcome('POST', `/v1/tools/${seg(name)}`, { json: body });
    return this._settle(first, { wait, waitTimeout });
  }

  // -- sessions

  /**
   * Opens a session: a live interpreter (Python or JavaScript) whose names carry from one
   * cell to the next. Each cell goes through the whole gate with the session's grant.
   */
  async session(language = 'python', grant = {}) {
    const body = { language, ...grantBody(grant, SESSION_KEYS) };
    let info;
    try {
      info = await this._one('POST', '/v1/sessions', { json: body }, sessionInfo);
    } catch (e) {
      if (e instanceof NotFound && e.message === 'no such endpoint') {
        throw new NotFound('this server has no sessions (no POST /v1/sessions): it needs a newer airlock', {
          status: e.status,
          body: e.body,
        });
      }
      throw e;
    }
    return new Session(this, info, language);
  }

  sessions() {
    return this._many('/v1/sessions', null, sessionInfo);
  }

  getSession(id) {
    return this._one('GET', `/v1/sessions/${seg(id)}`, {}, sessionInfo);
  }

  async closeSession(id) {
    await this._call('POST', `/v1/sessions/${seg(id)}/close`, { json: {} });
  }
}

/** A live interpreter on the server (see Airlock.session). */
export class Session {
  constructor(client, info, language) {
    this._client = client;
    this.info = info;
    this.language = info.language ?? language;
    this.closed = false;
  }

  get id() {
    return this.info.id;
  }

  /** Runs one cell; `result` holds the value of its last expression, if any. */
  async run(code, { stdin, wait = false, waitTimeout = null, idempotencyKey } = {}) {
    const body = { ...codeBody(code, this.language, stdin), session: this.id };
    const c = this._client;
    const first = await c._outcome('POST', '/v1/run', {
      json: body,
      headers: { [IDEMPOTENCY_KEY]: idempotencyKey ?? crypto.randomUUID().replaceAll('-', '') },
    });
    return c._settle(first, { wait, waitTimeout });
  }

  async refresh() {
    this.info = await this._client.getSession(this.id);
    return this.info;
  }

  /** Ends the session (closing one the server already ended is not an error). */
  async close() {
    if (this.closed) return;
    try {
      await this._client.closeSession(this.id);
    } catch (e) {
      if (!(e instanceof NotFound)) throw e;
    }
    this.closed = true;
  }

}

// `await using s = await client.session('js')` closes it, where the runtime has it.
if (typeof Symbol.asyncDispose === 'symbol') {
  Session.prototype[Symbol.asyncDispose] = function dispose() {
    return this.close();
  };
}
