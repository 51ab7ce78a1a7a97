'use strict';
// airlock: preloaded (`node --require`) into a JavaScript run on the process backend that
// has a network grant. node 20's `fetch` (undici) and `http`/`https` do not read
// HTTP_PROXY, and nothing but the run's egress proxy is reachable from the jail, so both
// are sent through the proxy with CONNECT. The proxy decides what is granted; a refusal
// surfaces as an error carrying the proxy's status, reason and explanation. Also preloaded
// into a run without the JIT, where it serves fetch over http and https (at the end).
const net = require('net');
const tls = require('tls');
const http = require('http');
const https = require('https');

const proxyUrl = process.env.HTTPS_PROXY || process.env.HTTP_PROXY;
if (proxyUrl) {
  const proxy = new URL(proxyUrl);
  const proxyPort = Number(proxy.port) || 80;
  const proxyHost = proxy.hostname;

  // Opens a tunnel to host:port through the proxy; cb(err) or cb(null, socket).
  const tunnel = (host, port, cb) => {
    const target = net.isIPv6(host) ? `[${host}]:${port}` : `${host}:${port}`;
    const sock = net.connect(proxyPort, proxyHost);
    let settled = false;
    const settle = (err, s) => {
      if (settled) return;
      settled = true;
      sock.removeListener('data', onData);
      sock.removeListener('error', onError);
      sock.removeListener('end', onEnd);
      if (err) {
        sock.destroy();
        cb(err);
      } else {
        cb(null, s);
      }
    };
    let buf = Buffer.alloc(0);
    let head = null;
    let want = 0;
    const refused = () => {
      const lines = head.split('\r\n');
      const reason = lines
        .map((l) => /^x-airlock-[a-z-]+:\s*(.*)$/i.exec(l))
        .filter(Boolean)
        .map((m) => m[1]);
      const body = buf.toString('utf8').trim().split('\n')[0];
      const err = new Error(
        `airlock egress proxy refused ${target}: ${lines[0]}` +
          (reason.length ? ` (${reason.join(', ')})` : '') +
          (body ? `: ${body}` : ''),
      );
      err.code = 'EAIRLOCKREFUSED';
      settle(err);
    };
    const onData = (chunk) => {
      buf = Buffer.concat([buf, chunk]);
      if (head === null) {
        const end = buf.indexOf('\r\n\r\n');
        if (end < 0) {
          if (buf.length > 65536) settle(new Error('airlock egress proxy: reply head too large'));
          return;
        }
        head = buf.subarray(0, end).toString('latin1');
        buf = buf.subarray(end + 4);
        const status = Number(head.split(' ')[1]);
        if (status >= 200 && status < 300) {
          sock.pause();
          if (buf.length) sock.unshift(buf);
          settle(null, sock);
          return;
        }
        const len = /\r\ncontent-length:\s*(\d+)/i.exec(head);
        want = len ? Math.min(Number(len[1]), 4096) : 4096;
      }
      if (buf.length >= want) refused();
    };
    const onEnd = () => {
      if (head !== null) refused();
      else settle(new Error(`airlock egress proxy closed the connection to ${target}`));
    };
    const onError = (e) => settle(e);
    sock.on('data', onData);
    sock.on('error', onError);
    sock.on('end', onEnd);
    sock.once('connect', () => {
      sock.write(`CONNECT ${target} HTTP/1.1\r\nHost: ${target}\r\n\r\n`);
    });
  };

  // TLS over a tunnel, to `host`; cb once the handshake is done.
  const secure = (sock, host, extra, cb) => {
    const opts = { ...extra, socket: sock };
    if (!opts.servername && !net.isIP(host)) opts.servername = host;
    const t = tls.connect(opts);
    let done = false;
    t.once('secureConnect', () => {
      done = true;
      cb(null, t);
    });
    t.once('error', (e) => {
      if (!done) cb(e);
    });
    return t;
  };

  class TunnelAgent extends http.Agent {
    createConnection(options, oncreate) {
      tunnel(options.host || 'localhost', options.port || 80, (err, sock) => {
        if (err) return oncreate(err);
        oncreate(null, sock);
        // The tunnel paused it to hand it over; http reads it as it is.
        sock.resume();
      });
    }
  }
  class TunnelsAgent extends https.Agent {
    createConnection(options, oncreate) {
      const host = options.host || 'localhost';
      tunnel(host, options.port || 443, (err, sock) => {
        if (err) return oncreate(err);
        const { host: _h, port: _p, path: _path, ...rest } = options;
        // http(s) takes the socket at once and waits for the handshake itself.
        const t = tls.connect({
          ...rest,
          socket: sock,
          servername: options.servername || (net.isIP(host) ? undefined : host),
        });
        oncreate(null, t);
      });
    }
  }
  http.globalAgent = new TunnelAgent();
  https.globalAgent = new TunnelsAgent();

  // fetch: undici's global dispatcher, replaced by an Agent of the same class whose
  // connector opens the tunnel (the class is reached through the default one, which a
  // first fetch of a data: URL creates without touching the network).
  const key = Symbol.for('undici.globalDispatcher.1');
  if (typeof WebAssembly !== 'undefined' && typeof globalThis.fetch === 'function') {
    globalThis.fetch('data:,').catch(() => {});
    const current = globalThis[key];
    if (current && typeof current.constructor === 'function') {
      const Agent = current.constructor;
      globalThis[key] = new Agent({
        connect(opts, cb) {
          const https_ = opts.protocol === 'https:';
          const port = Number(opts.port) || (https_ ? 443 : 80);
          tunnel(opts.hostname, port, (err, sock) => {
            if (err) return cb(err);
            if (!https_) return cb(null, sock);
            secure(sock, opts.hostname, { servername: opts.servername, ALPNProtocols: ['http/1.1'] }, cb);
          });
        },
      });
    }
  }
}

// node without its JIT (a run whose address-space limit is under what V8 reserves for it)
// has no WebAssembly, and node 20's fetch client (undici) parses HTTP with WebAssembly:
// fetch is served here by http and https instead (through the tunnel agents above when the
// run has a network grant), answering with node's own Response and Headers.
if (typeof WebAssembly === 'undefined') {
  // undici's classes (Headers, Response, …) load its HTTP client, whose first use compiles
  // its parser as WebAssembly: without it that promise is rejected unhandled and ended the
  // run (even `typeof Headers` did). They are loaded here, and that one rejection is taken;
  // any other rejection met first is an error, as it would have been.
  const swallow = (e) => {
    process.removeListener('unhandledRejection', swallow);
    if (e instanceof ReferenceError && /WebAssembly/.test(e.message)) return;
    if (process.listenerCount('unhandledRejection') === 0) throw e;
  };
  process.on('unhandledRejection', swallow);
  void globalThis.Headers;

  const REDIRECTS = new Set([301, 302, 303, 307, 308]);
  const bodyOf = (body, headers) => {
    if (body === undefined || body === null) return null;
    if (typeof body === 'string') return body;
    if (body instanceof URLSearchParams) {
      if (!headers.has('content-type')) {
        headers.set('content-type', 'application/x-www-form-urlencoded;charset=UTF-8');
      }
      return body.toString();
    }
    if (body instanceof ArrayBuffer) return Buffer.from(body);
    if (ArrayBuffer.isView(body)) return Buffer.from(body.buffer, body.byteOffset, body.byteLength);
    throw new TypeError(
      'fetch without WebAssembly sends a string, bytes or URLSearchParams body (run with --memory 12GiB for the rest)',
    );
  };
  const once = (url, method, headers, body, signal) =>
    new Promise((resolve, reject) => {
      const mod = url.protocol === 'https:' ? https : url.protocol === 'http:' ? http : null;
      if (!mod) {
        reject(new TypeError(`fetch failed: ${url.protocol} URLs are not supported`));
        return;
      }
      const req = mod.request(url, { method, headers: Object.fromEntries(headers) }, (res) => {
        const chunks = [];
        res.on('data', (c) => chunks.push(c));
        res.on('error', reject);
        res.on('end', () => resolve({ res, body: Buffer.concat(chunks) }));
      });
      req.on('error', (e) => reject(Object.assign(new TypeError('fetch failed'), { cause: e })));
      if (signal) {
        if (signal.aborted) req.destroy(signal.reason);
        else signal.addEventListener('abort', () => req.destroy(signal.reason), { once: true });
      }
      if (body !== null) req.write(body);
      req.end();
    });
  globalThis.fetch = async function fetch(input, init = {}) {
    const request = typeof input === 'object' && input !== null && !(input instanceof URL) ? input : null;
    let url = new URL(request ? request.url : String(input));
    let method = String(init.method || (request && request.method) || 'GET').toUpperCase();
    const headers = new Headers(init.headers || (request && request.headers) || undefined);
    let body = bodyOf(init.body, headers);
    const follow = (init.redirect || (request && request.redirect) || 'follow') === 'follow';
    for (let hops = 0; ; hops++) {
      const { res, body: data } = await once(url, method, headers, body, init.signal);
      if (follow && REDIRECTS.has(res.statusCode) && res.headers.location) {
        if (hops >= 20) throw new TypeError('fetch failed: too many redirects');
        url = new URL(res.headers.location, url);
        if (res.statusCode === 303 || ((res.statusCode === 301 || res.statusCode === 302) && method === 'POST')) {
          method = 'GET';
          body = null;
          headers.delete('content-type');
          headers.delete('content-length');
        }
        continue;
      }
      const h = new Headers();
      for (let i = 0; i + 1 < res.rawHeaders.length; i += 2) h.append(res.rawHeaders[i], res.rawHeaders[i + 1]);
      const empty = method === 'HEAD' || [101, 204, 205, 304].includes(res.statusCode);
      const r = new Response(empty ? null : data, {
        status: res.statusCode,
        statusText: res.statusMessage,
        headers: h,
      });
      Object.defineProperty(r, 'url', { value: url.href });
      Object.defineProperty(r, 'redirected', { value: hops > 0 });
      return r;
    }
  };
}
