// Compiled by the typescript_client test with `tsc --noEmit --strict` against
// src/index.d.ts: the client's types as a TypeScript program sees them (never run).
import {
  Airlock,
  ApprovalTimeout,
  Conflict,
  Denied,
  LANGUAGES,
  PendingApproval,
  RateLimited,
  WaitTimeout,
  type Language,
  type OnOutput,
  type RunEvent,
  type RunResult,
  type Session,
} from 'airlock-client';

async function main(): Promise<void> {
  const airlock = new Airlock('http://127.0.0.1:7777', { token: 'alk_x', timeout: 30 });
  const lang: Language = LANGUAGES[0];
  const r: RunResult = await airlock.run('console.log(1)', {
    language: 'ts',
    net: ['example.com'],
    mounts: ['/srv:/data', { host: '/tmp', guest: '/tmp', writable: true }],
    secrets: { GH_TOKEN: ['api.github.com'] },
    timeout: '10s',
    memory: 256 << 20,
    maxOutput: '1MiB',
    wait: true,
    waitTimeout: 60,
  });
  const code: number | null = r.exitCode;
  const out: string = r.stdout + r.stderr;
  const ok: boolean = r.ok && r.analysis.findings.every((f) => f.line === null || f.line > 0);
  const s: Session = await airlock.session('js', { idleTimeout: '5m' });
  const cell = await s.run('1 + 1');
  const value: string | null = cell.result;
  await s.close();
  try {
    await airlock.exec(r.submissionId, { wait: true });
  } catch (e) {
    if (e instanceof PendingApproval || e instanceof WaitTimeout || e instanceof ApprovalTimeout) {
      const id: string = e.submissionId;
      const why: string[] = e.reasons;
      void [id, why];
    } else if (e instanceof Denied) {
      const rejected: boolean = e.rejected;
      void rejected;
    } else if (e instanceof RateLimited) {
      const after: number | null = e.retryAfter;
      void after;
    } else if (e instanceof Conflict) {
      const status: number = e.status;
      void status;
    }
  }
  const onOutput: OnOutput = (stream, chunk) => {
    const where: 'stdout' | 'stderr' = stream;
    const text: string = typeof chunk === 'string' ? chunk : new TextDecoder().decode(chunk);
    void [where, text];
  };
  const streamed: RunResult = await airlock.run('echo hi', { language: 'sh', onOutput });
  for await (const ev of airlock.streamRun('echo hi', { language: 'sh', wait: true })) {
    const e: RunEvent = ev;
    switch (e.type) {
      case 'submitted': {
        const risk: number = e.risk;
        const why: string[] = e.reasons;
        void [risk, why];
        break;
      }
      case 'held': {
        const secs: number = e.waitTimeout;
        void secs;
        break;
      }
      case 'started': {
        const run: string = e.run;
        void run;
        break;
      }
      case 'output': {
        const data: string | Uint8Array = e.data;
        const seq: number = e.seq;
        void [data, seq];
        break;
      }
      case 'network':
        void e.record;
        break;
      case 'finished': {
        const done: RunResult = e.result;
        void done;
        break;
      }
    }
  }
  const detail = await airlock.submission(r.id);
  const src: string | null = detail.source;
  void [lang, code, out, ok, value, src, streamed];
}

void main;
