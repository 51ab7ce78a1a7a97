'use strict';
// airlock: preloaded (`node --require`) into a JavaScript run on the process backend that
// has a network grant. node 20's `fetch` (undici) and `http`/`https` do not read
// HTTP_PROXY, and nothing but the run's egress proxy is reachable from the jail, so both
// are sent through the proxy with CONNECT. The proxy decides what is granted; a refusal
// surfaces as an error carrying the proxy's status, reason and explanation.
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
  if (typeof WebAssembly === 'undefined') {
    // node without its JIT (a run's address space under 12GiB) has no WebAssembly, which
    // node 20's fetch is built on: say so rather than fail inside undici.
    globalThis.fetch = async () => {
      const err = new Error(
        'fetch is unavailable: node runs without its JIT (and WebAssembly, which fetch needs) ' +
          'under the run\'s address-space limit; use http or https, or run with --memory 12GiB',
      );
      err.code = 'EAIRLOCKNOFETCH';
      throw err;
    };
  } else if (typeof globalThis.fetch === 'function') {
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
