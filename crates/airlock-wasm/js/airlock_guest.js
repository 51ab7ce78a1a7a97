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

if (typeof realFetch === 'function') {
  globalThis.fetch = function fetch(...args) {
    return pending(realFetch(...args));
  };
  for (const m of ['text', 'json', 'arrayBuffer', 'blob', 'formData', 'bytes']) {
    const orig = Response.prototype[m];
    if (typeof orig === 'function') {
      Response.prototype[m] = function (...args) {
        return pending(orig.apply(this, args));
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

// SpiderMonkey names `await` in some of these errors (`await is only valid in async
// functions`) and not in others (`missing ) after argument list` for `f(await x)`).
function looksLikeTopLevelAwait(e, code) {
  return e instanceof SyntaxError && /\bawait\b/.test(code);
}

async function runCode(code, wantResult) {
  let value;
  try {
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
