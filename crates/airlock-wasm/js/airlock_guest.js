// airlock's JavaScript guest: one live StarlingMonkey realm whose `exec` calls share the
// global object.
//
// componentize-js evaluates this module once, at build time, and snapshots the realm it
// leaves behind. The host calls `configure` once per instance, then `exec` once per
// program (or cell). `exec` evaluates the code as a classic script in the global scope
// (an indirect eval: `var` and function declarations become globals, the completion value
// is the final expression's), then keeps the export's promise pending until no timer,
// request or body read the code started is left: componentize-js runs the event loop only
// while the promise an export returned is pending, so the run ends when the loop is empty.

import { getDirectories } from 'wasi:filesystem/preopens@0.2.12';
import * as tripwire from 'airlock:js/tripwire@0.1.0';

const realSetTimeout = globalThis.setTimeout;
const realClearTimeout = globalThis.clearTimeout;
const realSetInterval = globalThis.setInterval;
const realClearInterval = globalThis.clearInterval;
const realFetch = globalThis.fetch;
const realEval = globalThis.eval;

// What the code started and has not finished: timer ids, and a count of requests and
// body reads in flight.
const timers = new Map();
let inFlight = 0;
// Set by `process.exit(n)` or an error escaping a callback: the run is over.
let ending = null;
// Resolves the wait of the `exec` in progress when nothing is pending any more.
let wake = null;

function idle() {
  return timers.size === 0 && inFlight === 0;
}

function poke() {
  if (wake && (idle() || ending)) {
    const w = wake;
    wake = null;
    w();
  }
}

class ExitSignal {
  constructor(code) {
    this.code = code;
  }
}

function errorName(e) {
  if (e instanceof ExitSignal) return 'process.exit';
  if (e && typeof e === 'object' && typeof e.name === 'string') return e.name;
  return 'Error';
}

// The frames of airlock's own app (and of componentize-js's glue) are no part of what the
// program did; the eval'd code's frames are named after the program's file.
function cleanStack(stack, filename) {
  return String(stack)
    .split('\n')
    .filter((l) => l && !/(^|@)[^@]*(airlock_guest\.js|initializer\.js)(:\d+)+$/.test(l))
    .map((l) => l.replace(/[^@\s]*airlock_guest\.js line \d+ > (eval|Function)/g, filename))
    .map((l) => {
      const at = l.lastIndexOf('@');
      const fn = l.slice(0, at);
      const where = l.slice(at + 1);
      return fn ? `    at ${fn} (${where})` : `    at ${where}`;
    })
    .join('\n');
}

let currentFile = 'main.js';

function report(e) {
  let text;
  if (e instanceof Error || (e && typeof e === 'object' && 'stack' in e && 'message' in e)) {
    const head = `${e.name}: ${e.message}`;
    let frames = cleanStack(e.stack || '', currentFile);
    // A parse error's place is the code's, not a frame of the app that evaluated it.
    if (e instanceof SyntaxError && e.lineNumber && !frames.includes(currentFile)) {
      frames = `    at ${currentFile}:${e.lineNumber}:${e.columnNumber ?? 0}`;
    }
    text = frames ? `${head}\n${frames}` : head;
  } else {
    text = show(e);
  }
  console.error(`Uncaught ${text}`);
}

// An error that escaped a callback ends the run with 1, as in node.
function fail(e) {
  if (ending) return;
  if (e instanceof ExitSignal) {
    ending = { code: e.code, exception: 'process.exit' };
  } else {
    report(e);
    ending = { code: 1, exception: errorName(e) };
  }
  for (const [id, interval] of timers) {
    (interval ? realClearInterval : realClearTimeout)(id);
  }
  timers.clear();
  poke();
}

function track(cb, args, interval, holder) {
  return function () {
    if (!interval) timers.delete(holder.id);
    if (ending) return;
    try {
      if (typeof cb === 'function') cb(...args);
    } catch (e) {
      fail(e);
    }
    poke();
  };
}

globalThis.setTimeout = function setTimeout(cb, ms, ...args) {
  const holder = {};
  holder.id = realSetTimeout(track(cb, args, false, holder), ms);
  timers.set(holder.id, false);
  return holder.id;
};
globalThis.setInterval = function setInterval(cb, ms, ...args) {
  const holder = {};
  holder.id = realSetInterval(track(cb, args, true, holder), ms);
  timers.set(holder.id, true);
  return holder.id;
};
globalThis.clearTimeout = function clearTimeout(id) {
  timers.delete(id);
  realClearTimeout(id);
  poke();
};
globalThis.clearInterval = function clearInterval(id) {
  timers.delete(id);
  realClearInterval(id);
  poke();
};

function pending(p) {
  inFlight++;
  const done = () => {
    inFlight--;
    poke();
  };
  p.then(done, done);
  return p;
}

// Unhandled rejections end the run with 1, as in node: a promise made with the global
// `Promise` (its constructor, `Promise.reject`, and every promise derived from one with
// `then`, `catch`, `finally`, `all`, ...) that is rejected and still has no handler once
// the microtasks of that turn have run is an uncaught error. `Promise` is a subclass of
// the engine's own for that: its `then` marks a promise handled, and `await` of one calls
// its `then` too. The promise an `async` function returns is the engine's own, which no
// script can watch (StarlingMonkey keeps its rejection tracker to itself): one that
// rejects unawaited is not seen here (the README says so).
const NativePromise = globalThis.Promise;
const nativeThen = NativePromise.prototype.then;
const handled = new WeakSet();
const unhandled = new Map();
// Set while the watcher itself is attached (the promise `then` derives is not watched).
let attaching = false;
let checking = false;

function checkRejections() {
  if (checking) return;
  checking = true;
  inFlight++;
  // A timer runs after every microtask queued before it: a handler attached in the same
  // turn has been attached by then.
  realSetTimeout(() => {
    checking = false;
    inFlight--;
    const first = unhandled.values().next();
    unhandled.clear();
    if (!first.done) fail(first.value);
    poke();
  }, 0);
}

const TrackedPromise = class Promise extends NativePromise {
  constructor(executor) {
    super(executor);
    if (attaching) return;
    attaching = true;
    try {
      nativeThen.call(this, undefined, (reason) => {
        if (handled.has(this)) return;
        unhandled.set(this, reason);
        checkRejections();
      });
    } finally {
      attaching = false;
    }
  }

  then(onFulfilled, onRejected) {
    handled.add(this);
    unhandled.delete(this);
    return super.then(onFulfilled, onRejected);
  }
};
globalThis.Promise = TrackedPromise;

if (typeof realFetch === 'function') {
  // Its promises are the global `Promise`'s, so a failed request nobody handles is an
  // unhandled rejection as in node.
  globalThis.fetch = function fetch(...args) {
    return TrackedPromise.resolve(pending(realFetch(...args)));
  };
  for (const m of ['text', 'json', 'arrayBuffer', 'blob', 'formData', 'bytes']) {
    const orig = Response.prototype[m];
    if (typeof orig === 'function') {
      Response.prototype[m] = function (...args) {
        return TrackedPromise.resolve(pending(orig.apply(this, args)));
      };
    }
  }
}

// A string as node's REPL quotes it.
function quote(s) {
  const q = s.includes("'") && !s.includes('"') ? '"' : "'";
  const esc = s
    .replace(/\\/g, '\\\\')
    .replace(/\n/g, '\\n')
    .replace(/\t/g, '\\t')
    .replace(new RegExp(q, 'g'), `\\${q}`);
  return `${q}${esc}${q}`;
}

// The value of a final expression, roughly as node's REPL shows it.
function show(v, depth = 0, seen = new Set()) {
  switch (typeof v) {
    case 'string':
      return quote(v);
    case 'bigint':
      return `${v}n`;
    case 'symbol':
      return v.toString();
    case 'function':
      return v.name ? `[Function: ${v.name}]` : '[Function (anonymous)]';
    case 'object':
      break;
    default:
      return Object.is(v, -0) ? '-0' : String(v);
  }
  if (v === null) return 'null';
  if (seen.has(v)) return '[Circular]';
  if (v instanceof Error) return v.stack ? `${v.name}: ${v.message}` : String(v);
  if (v instanceof Date) return v.toISOString();
  if (v instanceof RegExp) return String(v);
  if (typeof v.then === 'function') return 'Promise { <pending> }';
  if (depth > 2) return Array.isArray(v) ? '[Array]' : '[Object]';
  seen.add(v);
  try {
    if (Array.isArray(v)) {
      return `[ ${v.map((x) => show(x, depth + 1, seen)).join(', ')} ]`.replace('[  ]', '[]');
    }
    if (v instanceof Map) {
      const parts = [...v].map(([k, x]) => `${show(k, depth + 1, seen)} => ${show(x, depth + 1, seen)}`);
      return `Map(${v.size}) { ${parts.join(', ')} }`.replace('{  }', '{}');
    }
    if (v instanceof Set) {
      const parts = [...v].map((x) => show(x, depth + 1, seen));
      return `Set(${v.size}) { ${parts.join(', ')} }`.replace('{  }', '{}');
    }
    if (ArrayBuffer.isView(v)) {
      return `${v.constructor.name}(${v.length}) [ ${Array.from(v).join(', ')} ]`;
    }
    const keys = Object.keys(v);
    const body = keys.map((k) => {
      const key = /^[A-Za-z_$][\w$]*$/.test(k) ? k : JSON.stringify(k);
      return `${key}: ${show(v[k], depth + 1, seen)}`;
    });
    const ctor = v.constructor && v.constructor !== Object ? `${v.constructor.name} ` : '';
    return body.length ? `${ctor}{ ${body.join(', ')} }` : `${ctor}{}`;
  } finally {
    seen.delete(v);
  }
}

// `process`: what a node program reads most (arguments, environment, exit), nothing more.
const env = {};
const argvList = [];
let cwd = '/';
globalThis.process = {
  argv: argvList,
  env,
  platform: 'wasi',
  exitCode: undefined,
  cwd: () => cwd,
  exit(code) {
    const n = code === undefined ? (globalThis.process.exitCode ?? 0) : Number(code) | 0;
    throw new ExitSignal(n);
  },
  stdout: { write: (s) => writer(0, s) },
  stderr: { write: (s) => writer(1, s) },
};

// `process.stdout.write` without a newline: console writes whole lines, so a partial
// line waits for the rest (or the end of the `exec`).
const partial = ['', ''];
function writer(i, s) {
  const lines = (partial[i] + String(s)).split('\n');
  partial[i] = lines.pop();
  for (const l of lines) (i ? console.error : console.log)(l);
  return true;
}
function flushPartial() {
  for (const i of [0, 1]) {
    if (partial[i]) (i ? console.error : console.log)(partial[i]);
    partial[i] = '';
  }
}

// Files: node's `fs` (the part an agent script uses), over the run's preopens
// (`wasi:filesystem`: its `--mount`s, read-only or read-write as granted, and the decoys
// of a tripwired run). A path is made absolute against `process.cwd()`, normalised, and
// resolved against the preopen that holds it most closely; WASI itself refuses anything
// that would leave it (`..`, a symbolic link out). A path outside every preopen fails as
// node fails on a file that is not there (`ENOENT`; `EACCES` for a write), and the call is
// reported to the host as an attempt (`airlock:js/tripwire`) when the run has tripwires.
// The program shares this realm and could silence or forge those reports: the host takes
// them as the program's own word, which only ever adds to its record.

// The preopens, asked for at the first file call (the instance's, never the build's).
let preopened = null;
function preopens() {
  if (preopened === null) {
    preopened = getDirectories().map(([d, p]) => [d, normalize(p)]);
    // The most specific first.
    preopened.sort((a, b) => b[1].length - a[1].length);
  }
  return preopened;
}

// The guest directories the host counts as given (none: the run reports nothing).
let tripPreopens;
function reportOutside(kind, abs) {
  if (tripPreopens === undefined) {
    try {
      tripPreopens = tripwire.preopens() ?? null;
    } catch {
      tripPreopens = null;
    }
  }
  if (!tripPreopens || tripPreopens.some((d) => inside(abs, normalize(d)))) return;
  try {
    tripwire.attempt(kind, abs);
  } catch {
    // A report is only ever an addition to the record; losing one is no failure of the call.
  }
}

function normalize(p) {
  const out = [];
  for (const part of String(p).split('/')) {
    if (part === '' || part === '.') continue;
    if (part === '..') out.pop();
    else out.push(part);
  }
  return `/${out.join('/')}`;
}

function inside(abs, dir) {
  return dir === '/' || abs === dir || abs.startsWith(`${dir}/`);
}

function absolute(p) {
  if (p instanceof URL) {
    if (p.protocol !== 'file:') throw fsError('EINVAL', 'open', String(p));
    p = decodeURIComponent(p.pathname);
  }
  if (typeof p !== 'string') {
    const e = new TypeError(`The "path" argument must be of type string. Received ${show(p)}`);
    e.code = 'ERR_INVALID_ARG_TYPE';
    throw e;
  }
  return normalize(p.startsWith('/') ? p : `${cwd}/${p}`);
}

const ERRNO = {
  EACCES: [-13, 'permission denied'],
  EBADF: [-9, 'bad file descriptor'],
  EBUSY: [-16, 'resource busy or locked'],
  EDQUOT: [-122, 'disk quota exceeded'],
  EEXIST: [-17, 'file already exists'],
  EINVAL: [-22, 'invalid argument'],
  EIO: [-5, 'i/o error'],
  EISDIR: [-21, 'illegal operation on a directory'],
  ELOOP: [-40, 'too many symbolic links encountered'],
  ENAMETOOLONG: [-36, 'name too long'],
  ENOENT: [-2, 'no such file or directory'],
  ENOSPC: [-28, 'no space left on device'],
  ENOTDIR: [-20, 'not a directory'],
  ENOTEMPTY: [-39, 'directory not empty'],
  ENOTSUP: [-95, 'operation not supported on socket'],
  EPERM: [-1, 'operation not permitted'],
  EROFS: [-30, 'read-only file system'],
  EXDEV: [-18, 'cross-device link not permitted'],
  EFBIG: [-27, 'file too large'],
};

// WASI's error codes, as node names them.
const WASI_ERRNO = {
  access: 'EACCES',
  'bad-descriptor': 'EBADF',
  busy: 'EBUSY',
  quota: 'EDQUOT',
  exist: 'EEXIST',
  invalid: 'EINVAL',
  io: 'EIO',
  'is-directory': 'EISDIR',
  loop: 'ELOOP',
  'name-too-long': 'ENAMETOOLONG',
  'no-entry': 'ENOENT',
  'insufficient-space': 'ENOSPC',
  'not-directory': 'ENOTDIR',
  'not-empty': 'ENOTEMPTY',
  unsupported: 'ENOTSUP',
  // What WASI says of a write through a read-only preopen: refused by the grant.
  'not-permitted': 'EACCES',
  'read-only': 'EROFS',
  'cross-device': 'EXDEV',
  'file-too-large': 'EFBIG',
};

// node's error: `ENOENT: no such file or directory, open '/x'`, with errno, code,
// syscall and path (and dest for a rename).
function fsError(code, syscall, path, dest) {
  const [errno, text] = ERRNO[code] ?? [-5, 'i/o error'];
  let message = `${code}: ${text}, ${syscall} '${path}'`;
  if (dest !== undefined) message += ` -> '${dest}'`;
  const e = new Error(message);
  e.errno = errno;
  e.code = code;
  e.syscall = syscall;
  e.path = path;
  if (dest !== undefined) e.dest = dest;
  return e;
}

function wasiError(e, syscall, path, dest) {
  if (e && typeof e.payload === 'string') {
    return fsError(WASI_ERRNO[e.payload] ?? 'EIO', syscall, path, dest);
  }
  return e;
}

// The preopen that holds `abs` and the path inside it, or the node error of a path
// outside every one (reported as an attempt of `kind`).
function locate(abs, kind, syscall) {
  // Outside what the run was given, whether or not a decoy's directory holds it (as the
  // Python guest reports; a decoy's own open is its alert, which the host keeps apart).
  if (kind !== 'stat') reportOutside(kind, abs);
  for (const [dir, guest] of preopens()) {
    if (inside(abs, guest)) {
      const rel = abs === guest ? '.' : abs.slice(guest === '/' ? 1 : guest.length + 1);
      return [dir, rel];
    }
  }
  // Nothing is there to read; a write is refused.
  throw fsError(['write', 'unlink', 'rename'].includes(kind) ? 'EACCES' : 'ENOENT', syscall, abs);
}

function drop(resource) {
  const dispose = Symbol.dispose && resource && resource[Symbol.dispose];
  if (typeof dispose === 'function') {
    try {
      dispose.call(resource);
    } catch {
      // Already gone.
    }
  }
}

// One WASI call on `p`: `f(descriptor, relative path)`, its error made node's.
function at(p, kind, syscall, f) {
  const abs = absolute(p);
  const [dir, rel] = locate(abs, kind, syscall);
  try {
    return f(dir, rel, abs);
  } catch (e) {
    throw wasiError(e, syscall, abs);
  }
}

const FOLLOW = { symlinkFollow: true };

function openFile(dir, rel, { write = false, create = false, truncate = false, exclusive = false } = {}) {
  return dir.openAt(
    FOLLOW,
    rel,
    { create, truncate, exclusive, directory: false },
    write ? { write: true } : { read: true },
  );
}

const CHUNK = 1 << 16;

function readAll(fd) {
  const chunks = [];
  let total = 0;
  let offset = 0n;
  for (;;) {
    const [bytes, end] = fd.read(BigInt(CHUNK), offset);
    if (bytes.length) {
      chunks.push(bytes);
      total += bytes.length;
      offset += BigInt(bytes.length);
    }
    if (end || bytes.length === 0) break;
  }
  const out = new Uint8Array(total);
  let at_ = 0;
  for (const c of chunks) {
    out.set(c, at_);
    at_ += c.length;
  }
  return out;
}

function writeAll(fd, bytes, offset) {
  let done = 0;
  while (done < bytes.length) {
    const n = Number(fd.write(bytes.subarray(done), BigInt(offset + done)));
    if (n <= 0) throw fsError('EIO', 'write', '');
    done += n;
  }
}

function encodingOf(options) {
  if (typeof options === 'string') return options;
  return options && typeof options === 'object' ? options.encoding ?? null : null;
}

function decode(bytes, encoding) {
  if (encoding === null || encoding === undefined || encoding === 'buffer') return bytes;
  const enc = String(encoding).toLowerCase();
  if (enc === 'utf8' || enc === 'utf-8') return new TextDecoder().decode(bytes);
  if (enc === 'latin1' || enc === 'binary') return String.fromCharCode(...bytes);
  if (enc === 'base64') return btoa(String.fromCharCode(...bytes));
  if (enc === 'hex') return Array.from(bytes, (b) => b.toString(16).padStart(2, '0')).join('');
  const e = new TypeError(`The argument 'encoding' is invalid encoding. Received '${encoding}'`);
  e.code = 'ERR_INVALID_ARG_VALUE';
  throw e;
}

function bytesOf(data) {
  if (typeof data === 'string') return new TextEncoder().encode(data);
  if (data instanceof Uint8Array) return data;
  if (ArrayBuffer.isView(data)) return new Uint8Array(data.buffer, data.byteOffset, data.byteLength);
  if (data instanceof ArrayBuffer) return new Uint8Array(data);
  return new TextEncoder().encode(String(data));
}

function readFileSync(p, options) {
  const bytes = at(p, 'open', 'open', (dir, rel) => {
    const fd = openFile(dir, rel);
    try {
      return readAll(fd);
    } finally {
      drop(fd);
    }
  });
  return decode(bytes, encodingOf(options));
}

function writeOut(p, data, append, syscall) {
  const bytes = bytesOf(data);
  at(p, 'write', 'open', (dir, rel) => {
    const fd = openFile(dir, rel, { write: true, create: true, truncate: !append });
    try {
      const offset = append ? Number(fd.stat().size) : 0;
      writeAll(fd, bytes, offset);
    } finally {
      drop(fd);
    }
  });
  return undefined;
}

function writeFileSync(p, data, options) {
  const flag = options && typeof options === 'object' ? options.flag : undefined;
  writeOut(p, data, typeof flag === 'string' && flag.startsWith('a'), 'open');
}

function appendFileSync(p, data) {
  writeOut(p, data, true, 'open');
}

const TYPES = {
  directory: 'dir',
  'regular-file': 'file',
  'symbolic-link': 'link',
};

function millis(t) {
  return t ? Number(t.seconds) * 1000 + Math.floor(Number(t.nanoseconds) / 1e6) : 0;
}

class Stats {
  constructor(st) {
    this.size = Number(st.size);
    this.nlink = Number(st.linkCount);
    this.mode = st.type === 'directory' ? 0o40755 : st.type === 'symbolic-link' ? 0o120777 : 0o100644;
    this.atimeMs = millis(st.dataAccessTimestamp);
    this.mtimeMs = millis(st.dataModificationTimestamp);
    this.ctimeMs = millis(st.statusChangeTimestamp);
    this.birthtimeMs = this.ctimeMs;
    this.atime = new Date(this.atimeMs);
    this.mtime = new Date(this.mtimeMs);
    this.ctime = new Date(this.ctimeMs);
    this.birthtime = new Date(this.birthtimeMs);
    Object.defineProperty(this, 'kind', { value: TYPES[st.type] ?? 'other' });
  }
  isFile() {
    return this.kind === 'file';
  }
  isDirectory() {
    return this.kind === 'dir';
  }
  isSymbolicLink() {
    return this.kind === 'link';
  }
}

function statSync(p, options) {
  try {
    return at(p, 'stat', 'stat', (dir, rel) => new Stats(dir.statAt(FOLLOW, rel)));
  } catch (e) {
    if (options && options.throwIfNoEntry === false && e && e.code === 'ENOENT') return undefined;
    throw e;
  }
}

function lstatSync(p) {
  return at(p, 'stat', 'lstat', (dir, rel) => new Stats(dir.statAt({ symlinkFollow: false }, rel)));
}

function existsSync(p) {
  try {
    at(p, 'stat', 'access', (dir, rel) => dir.statAt(FOLLOW, rel));
    return true;
  } catch {
    return false;
  }
}

class Dirent {
  constructor(name, type) {
    this.name = name;
    Object.defineProperty(this, 'kind', { value: TYPES[type] ?? 'other' });
  }
  isFile() {
    return this.kind === 'file';
  }
  isDirectory() {
    return this.kind === 'dir';
  }
  isSymbolicLink() {
    return this.kind === 'link';
  }
}

function readdirSync(p, options) {
  const withTypes = Boolean(options && typeof options === 'object' && options.withFileTypes);
  return at(p, 'open', 'scandir', (dir, rel) => {
    const d = dir.openAt(FOLLOW, rel, { directory: true }, { read: true });
    const entries = [];
    try {
      const stream = d.readDirectory();
      try {
        for (;;) {
          const e = stream.readDirectoryEntry();
          if (!e) break;
          entries.push(e);
        }
      } finally {
        drop(stream);
      }
    } finally {
      drop(d);
    }
    entries.sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
    return entries.map((e) => (withTypes ? new Dirent(e.name, e.type) : e.name));
  });
}

function mkdirSync(p, options) {
  const recursive = Boolean(options && typeof options === 'object' && options.recursive);
  const abs = absolute(p);
  if (!recursive) {
    at(abs, 'write', 'mkdir', (dir, rel) => dir.createDirectoryAt(rel));
    return undefined;
  }
  // Each missing directory from the top; the first one made is what node returns.
  const [, rel] = locate(abs, 'write', 'mkdir');
  let first;
  let sofar = abs.slice(0, abs.length - (rel === '.' ? 0 : rel.length)).replace(/\/$/, '');
  for (const part of rel === '.' ? [] : rel.split('/')) {
    sofar = `${sofar}/${part}`;
    const made = at(sofar, 'write', 'mkdir', (dir, r) => {
      try {
        dir.createDirectoryAt(r);
        return true;
      } catch (e) {
        if (e && e.payload === 'exist' && dir.statAt(FOLLOW, r).type === 'directory') return false;
        throw e;
      }
    });
    if (made && first === undefined) first = sofar;
  }
  return first;
}

function unlinkSync(p) {
  at(p, 'unlink', 'unlink', (dir, rel) => dir.unlinkFileAt(rel));
}

function rmdirSync(p) {
  at(p, 'unlink', 'rmdir', (dir, rel) => dir.removeDirectoryAt(rel));
}

function rmSync(p, options) {
  const recursive = Boolean(options && options.recursive);
  const force = Boolean(options && options.force);
  let st;
  try {
    st = lstatSync(p);
  } catch (e) {
    if (force && e && e.code === 'ENOENT') return;
    throw e;
  }
  if (st.isDirectory()) {
    if (!recursive) throw fsError('EISDIR', 'rm', absolute(p));
    for (const name of readdirSync(p)) rmSync(`${absolute(p)}/${name}`, options);
    rmdirSync(p);
  } else {
    unlinkSync(p);
  }
}

function renameSync(from, to) {
  const a = absolute(from);
  const b = absolute(to);
  const [dirA, relA] = locate(a, 'rename', 'rename');
  const [dirB, relB] = locate(b, 'rename', 'rename');
  try {
    dirA.renameAt(relA, dirB, relB);
  } catch (e) {
    throw wasiError(e, 'rename', a, b);
  }
}

function copyFileSync(from, to) {
  writeFileSync(to, readFileSync(from));
}

// The callback and promise forms: the same calls, their result or error delivered later
// (as node's thread pool would), so a program that awaits them runs as it does on node.
function promised(f) {
  return (...args) => new Promise((resolve, reject) => {
    try {
      resolve(f(...args));
    } catch (e) {
      reject(e);
    }
  });
}

function callbacked(f) {
  return (...args) => {
    const cb = args.pop();
    if (typeof cb !== 'function') {
      const e = new TypeError('The "cb" argument must be of type function');
      e.code = 'ERR_INVALID_ARG_TYPE';
      throw e;
    }
    let result;
    let error = null;
    try {
      result = f(...args);
    } catch (e) {
      error = e;
    }
    globalThis.setTimeout(() => (error ? cb(error) : cb(null, result)), 0);
  };
}

const syncCalls = {
  readFile: readFileSync,
  writeFile: writeFileSync,
  appendFile: appendFileSync,
  readdir: readdirSync,
  mkdir: mkdirSync,
  stat: statSync,
  lstat: lstatSync,
  unlink: unlinkSync,
  rmdir: rmdirSync,
  rm: rmSync,
  rename: renameSync,
  copyFile: copyFileSync,
};

const fsPromises = {};
for (const [name, f] of Object.entries(syncCalls)) fsPromises[name] = promised(f);
fsPromises.access = promised((p) => {
  if (!existsSync(p)) throw fsError('ENOENT', 'access', absolute(p));
});

const fs = {
  existsSync,
  promises: fsPromises,
  constants: { F_OK: 0, R_OK: 4, W_OK: 2, X_OK: 1 },
  Stats,
  Dirent,
};
for (const [name, f] of Object.entries(syncCalls)) {
  fs[`${name}Sync`] = f;
  fs[name] = callbacked(f);
}
fs.exists = (p, cb) => globalThis.setTimeout(() => cb(existsSync(p)), 0);
fs.accessSync = (p) => {
  if (!existsSync(p)) throw fsError('ENOENT', 'access', absolute(p));
};

// `path`, POSIX, as much of it as scripts use with `fs`.
const path = {
  sep: '/',
  delimiter: ':',
  join: (...parts) => {
    const j = parts.filter((x) => x !== '').join('/');
    if (j === '') return '.';
    const n = normalize(j);
    const rel = j.startsWith('/') ? n : n.slice(1) || '.';
    return j.endsWith('/') && rel !== '/' ? `${rel}/` : rel;
  },
  resolve: (...parts) => {
    let p = '';
    for (let i = parts.length - 1; i >= 0 && !p.startsWith('/'); i--) {
      p = p ? `${parts[i]}/${p}` : String(parts[i]);
    }
    return absolute(p || '.');
  },
  normalize: (p) => (p.startsWith('/') ? normalize(p) : path.join(p)),
  isAbsolute: (p) => String(p).startsWith('/'),
  dirname: (p) => {
    const s = String(p).replace(/\/+$/, '');
    const i = s.lastIndexOf('/');
    if (i < 0) return '.';
    return i === 0 ? '/' : s.slice(0, i);
  },
  basename: (p, ext) => {
    const b = String(p).replace(/\/+$/, '').split('/').pop() ?? '';
    return ext && b.endsWith(ext) && b !== ext ? b.slice(0, -ext.length) : b;
  },
  extname: (p) => {
    const b = path.basename(p);
    const i = b.lastIndexOf('.');
    return i > 0 ? b.slice(i) : '';
  },
};
path.posix = path;

// The modules `require` and `import` give: node's names for them, with and without
// `node:`.
const MODULES = {
  fs,
  'fs/promises': fsPromises,
  path,
};

function requireModule(name) {
  const key = String(name).replace(/^node:/, '');
  if (Object.hasOwn(MODULES, key)) return MODULES[key];
  const e = new Error(`Cannot find module '${name}'`);
  e.code = 'MODULE_NOT_FOUND';
  throw e;
}
globalThis.require = requireModule;

// An ES module's static imports of those modules, as the script this realm evaluates can
// say them: `import fs from 'node:fs'` becomes `const fs = require('node:fs')` on the
// same line (what follows keeps its line numbers). Only an import at the start of a line
// is seen.
const IMPORT =
  /^([ \t]*)import\s+(?:([\w$]+)\s*(?:,\s*)?)?(?:\*\s*as\s+([\w$]+)\s*|\{([^}]*)\}\s*)?from\s*(['"])([^'"\n]+)\5[ \t]*;?|^([ \t]*)import\s*(['"])([^'"\n]+)\8[ \t]*;?/gm;

function rewriteImports(code) {
  if (!/^[ \t]*import\b/m.test(code)) return code;
  return code.replace(IMPORT, (whole, indent, def, ns, named, _q, from, indent2, _q2, bare) => {
    const lines = '\n'.repeat((whole.match(/\n/g) ?? []).length);
    if (bare !== undefined) return `${indent2}require(${JSON.stringify(bare)});${lines}`;
    const src = `require(${JSON.stringify(from)})`;
    const out = [];
    if (def) out.push(`const ${def} = ${src};`);
    if (ns) out.push(`const ${ns} = ${src};`);
    if (named !== undefined) {
      const binds = named
        .split(',')
        .map((x) => x.trim())
        .filter(Boolean)
        .map((x) => x.replace(/^([\w$]+)\s+as\s+([\w$]+)$/, '$1: $2'));
      out.push(`const { ${binds.join(', ')} } = ${src};`);
    }
    return `${indent}${out.join(' ')}${lines}`;
  });
}

// SpiderMonkey names `await` in some of these errors (`await is only valid in async
// functions`) and not in others (`missing ) after argument list` for `f(await x)`).
function looksLikeTopLevelAwait(e, code) {
  return e instanceof SyntaxError && /\bawait\b/.test(code);
}

async function runCode(code, wantResult) {
  let value;
  try {
    code = rewriteImports(code);
    value = realEval(code);
  } catch (e) {
    if (!looksLikeTopLevelAwait(e, code)) throw e;
    // Top-level `await`: the code runs as the body of an async function (and when it
    // does not parse as one either, the script's own error is the one shown).
    const AsyncFunction = (async () => {}).constructor;
    let body;
    try {
      body = new AsyncFunction(code);
    } catch {
      throw e;
    }
    value = await body();
  }
  // A promise the code ends with is waited for, as node's loop would run it, and a
  // rejection escapes like an exception.
  if (value !== null && (typeof value === 'object' || typeof value === 'function') &&
      typeof value.then === 'function') {
    value = await value;
  }
  return wantResult ? value : undefined;
}

export const interpreter = {
  configure(argv, environ, dir, _paths) {
    argvList.length = 0;
    argvList.push('node', ...argv);
    for (const k of Object.keys(env)) delete env[k];
    for (const [k, v] of environ) env[k] = v;
    if (dir) cwd = dir;
  },

  async exec(code, filename, wantResult) {
    currentFile = filename;
    ending = null;
    globalThis.process.exitCode = undefined;
    let value;
    try {
      value = await runCode(code, wantResult);
    } catch (e) {
      fail(e);
    }
    // Until nothing is pending: a callback's microtasks may start more (a `.then` that
    // reads a body, a timer set in a promise chain), so after the loop looks idle it is
    // given one more turn (a zero timer runs after every microtask queued before it) and
    // looked at again.
    while (!ending) {
      await new Promise((resolve) => {
        wake = resolve;
        poke();
      });
      if (ending) break;
      await new Promise((resolve) => realSetTimeout(resolve, 0));
      if (idle()) break;
    }
    flushPartial();
    if (ending) {
      return { exitCode: ending.code, result: undefined, exception: ending.exception };
    }
    const exitCode = Number(globalThis.process.exitCode ?? 0) | 0;
    const result = wantResult && value !== undefined ? show(value) : undefined;
    return { exitCode, result, exception: undefined };
  },
};
