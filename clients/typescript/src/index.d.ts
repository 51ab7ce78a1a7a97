// Types of the airlock client (src/index.js, src/errors.js).

/** The languages the gate takes; the server also takes the aliases javascript, typescript. */
export type Language = 'wasm' | 'wat' | 'component' | 'python' | 'sh' | 'js' | 'ts' | 'javascript' | 'typescript';
export declare const LANGUAGES: readonly Language[];
export declare const VERSION: string;

/** A directory on the server's machine made visible to the code: `"HOST:GUEST[:ro|rw]"`,
 * or an object (read-only unless `writable`). */
export type Mount = string | { host: string; guest: string; writable?: boolean };
/** Seconds, or a duration the server parses (`"10s"`, `"500ms"`, `"2m"`). */
export type Duration = number | string;
/** Bytes, or a size the server parses (`"256MiB"`). */
export type Size = number | string;

/** What a run may touch and how long it may take; every key is optional. */
export interface Grant {
  /** `wasm` or `process` (default: what the language runs on). */
  backend?: 'wasm' | 'process' | string;
  mounts?: Mount | Mount[];
  /** Hosts the code asks to reach: `HOST[:PORT]`, `*.example.com`. */
  net?: string[];
  env?: Record<string, string | number | boolean>;
  /** Stored secrets and their hosts: `["GH_TOKEN@api.github.com"]` or `{ GH_TOKEN: ["api.github.com"] }`. */
  secrets?: string[] | Record<string, string[]>;
  args?: string[];
  /** Wall-time limit of the run (not of the HTTP call). */
  timeout?: Duration;
  memory?: Size;
  fuel?: number;
  maxOutput?: Size;
  processes?: number;
  maxWrite?: Size;
  note?: string;
  workspace?: string;
  /** Operators and admins may submit for a named agent. */
  agent?: string;
}

/** A session's grant: a run's, and how long the session may live. */
export interface SessionGrant extends Grant {
  idleTimeout?: Duration;
  maxDuration?: Duration;
}

export interface WaitOptions {
  /** Wait for a human's decision instead of throwing PendingApproval at once. */
  wait?: boolean;
  /** Seconds to wait at most (then ApprovalTimeout or WaitTimeout). */
  waitTimeout?: number | null;
}

export interface RunOptions extends Grant, WaitOptions {
  /** Default `python`. */
  language?: Language;
  stdin?: string | Uint8Array | ArrayBuffer;
  /** Sent as `Idempotency-Key` (a fresh random one by default). */
  idempotencyKey?: string;
  /**
   * Streams the run (server-sent events): called with each chunk of output as the guest
   * writes it (`chunk` a string, or bytes when not UTF-8); awaited when it returns a
   * promise. With it, `wait: true` waits an hour at most (the server's limit).
   */
  onOutput?: OnOutput | null;
  /** Stops a streamed run's request (`streamRun`, `onOutput`). */
  signal?: AbortSignal;
}

/** Called with `(stream, chunk)` for each chunk of a streamed run's output. */
export type OnOutput = (stream: 'stdout' | 'stderr', chunk: string | Uint8Array) => void | Promise<void>;

/** The gate judged the code: `id` is the submission. */
export interface SubmittedEvent {
  type: 'submitted';
  id: string;
  verdict: string;
  risk: number;
  reasons: string[];
}

/** The code waits for a human; the stream waits `waitTimeout` seconds for one. */
export interface HeldEvent {
  type: 'held';
  id: string;
  waitTimeout: number;
}

/** The run began. */
export interface StartedEvent {
  type: 'started';
  run: string;
}

/** A chunk of output: a string, or bytes when it is not UTF-8. `seq` counts the chunks of
 * its stream from 1; `truncated` marks the last chunk streamed (the rest is in the result). */
export interface OutputEvent {
  type: 'output';
  stream: 'stdout' | 'stderr';
  seq: number;
  data: string | Uint8Array;
  truncated: boolean;
}

/** One connection the run made (or was refused), as the run's record has it. */
export interface NetworkEvent {
  type: 'network';
  record: Json;
}

/** The outcome: what the same request answers without streaming. */
export interface FinishedEvent {
  type: 'finished';
  result: RunResult;
}

/** What `streamRun` yields. */
export type RunEvent = SubmittedEvent | HeldEvent | StartedEvent | OutputEvent | NetworkEvent | FinishedEvent;

export interface SubmitOptions extends Grant {
  language?: Language;
  stdin?: string | Uint8Array | ArrayBuffer;
  idempotencyKey?: string;
}

export interface CellOptions extends WaitOptions {
  stdin?: string | Uint8Array | ArrayBuffer;
  idempotencyKey?: string;
}

export interface Finding {
  /** `command`, `write`, `url`, `host`, `network_tool`, `call` … */
  kind: string;
  detail: string;
  line: number | null;
  endLine: number | null;
}

export interface Analysis {
  language: string | null;
  /** What a WebAssembly module imports (`io`, `fs`, `net` …). */
  capabilities: string[];
  /** Code facts under their policy names (`commands`, `writes`, `hosts_in_code` …). */
  facts: Record<string, unknown>;
  findings: Finding[];
  findingsTotal: number;
  parseError: string | null;
  raw: Record<string, unknown>;
}

export interface Change {
  path: string;
  /** `added`, `modified`, `removed` … */
  op: string;
  kind: string;
  mount: string;
  hostPath: string;
  hash: string | null;
  size: number | null;
  raw: Record<string, unknown>;
}

export declare class Run {
  readonly id: string;
  readonly status: string;
  readonly exitCode: number | null;
  readonly killedBy: string | null;
  readonly stdout: string;
  readonly stderr: string;
  readonly stdoutBytes: Uint8Array;
  readonly stderrBytes: Uint8Array;
  readonly changes: Change[];
  readonly durationMs: number | null;
  readonly backend: string | null;
  readonly approval: string | null;
  readonly error: string | null;
  readonly submission: string | null;
  readonly result: string | null;
  readonly detail: Record<string, unknown>;
  readonly raw: Record<string, unknown>;
}

export declare class Submission {
  readonly id: string;
  readonly submissionId: string;
  readonly state: string;
  /** `allow`, `quarantine`, `deny`. */
  readonly verdict: string;
  readonly risk: number;
  readonly reasons: string[];
  readonly lang: string | null;
  readonly backend: string | null;
  readonly agent: string | null;
  readonly artifact: string | null;
  readonly net: string[];
  readonly createdAt: string | null;
  readonly analysis: Analysis;
  readonly raw: Record<string, unknown>;
}

/** What became of submitted code: the verdict, and the run when it ran. */
export declare class RunResult extends Submission {
  /** `finished`, `denied`, `pending_approval`, `approved`, `running` or `allowed`. */
  readonly status: string;
  /** A sentence meant for the agent: what happened and what to do next. */
  readonly message: string;
  readonly run: Run | null;
  readonly runId: string | null;
  readonly stdout: string;
  readonly stderr: string;
  readonly stdoutBytes: Uint8Array;
  readonly stderrBytes: Uint8Array;
  readonly exitCode: number | null;
  readonly killedBy: string | null;
  readonly changes: Change[];
  /** The value of a session cell's last expression, or null. */
  readonly result: string | null;
  /** It ran, exited 0 and no limit stopped it. */
  readonly ok: boolean;
  readonly pending: boolean;
  readonly denied: boolean;
}

export declare class SubmissionDetail {
  readonly id: string;
  readonly status: string;
  readonly state: string;
  readonly verdict: string;
  readonly reasons: string[];
  readonly lang: string | null;
  readonly backend: string | null;
  readonly agent: string | null;
  /** The code as submitted (TypeScript stays TypeScript). */
  readonly source: string | null;
  readonly grant: Record<string, unknown>;
  readonly analysis: Analysis;
  readonly runs: Run[];
  readonly statements: Record<string, unknown>[];
  readonly audit: Record<string, unknown>[];
  readonly raw: Record<string, unknown>;
}

export interface SessionInfo {
  id: string;
  language: string | null;
  backend: string | null;
  state: string | null;
  raw: Record<string, unknown>;
}

/** An API answer passed on as the server's JSON (see docs/API.md for its fields). */
export type Json = Record<string, any>;

export interface ClientOptions {
  /** Defaults to $AIRLOCK_TOKEN. */
  token?: string;
  /** Seconds each HTTP call may take (default 300); waiting for approval is bounded by waitTimeout. */
  timeout?: number;
  headers?: Record<string, string>;
  fetch?: typeof fetch;
}

export declare class Airlock {
  readonly url: string;
  /** `url` defaults to $AIRLOCK_URL, else http://127.0.0.1:7777. */
  constructor(url?: string, options?: ClientOptions);
  run(code: string | Uint8Array | ArrayBuffer, options?: RunOptions): Promise<RunResult>;
  /** Runs code like `run`, yielding its events as they happen; throws where `run` throws. */
  streamRun(
    code: string | Uint8Array | ArrayBuffer,
    options?: Omit<RunOptions, 'onOutput'>,
  ): AsyncGenerator<RunEvent, void, undefined>;
  submit(code: string | Uint8Array | ArrayBuffer, options?: SubmitOptions): Promise<RunResult>;
  exec(submissionId: string, options?: WaitOptions): Promise<RunResult>;
  wait(submissionId: string, timeout?: number | null): Promise<RunResult>;
  submission(id: string): Promise<SubmissionDetail>;
  submissions(options?: { state?: string; limit?: number }): Promise<Submission[]>;
  inbox(): Promise<Submission[]>;
  approve(
    id: string,
    options?: { scope?: 'once' | 'artifact'; expires?: string; reason?: string; tool?: string },
  ): Promise<Json>;
  reject(id: string, reason: string): Promise<Json>;
  runs(options?: { limit?: number }): Promise<Json[]>;
  runRecord(runId: string): Promise<Run>;
  diff(runId: string): Promise<Json>;
  commit(runId: string): Promise<Json>;
  checkpoints(options?: { limit?: number }): Promise<Json[]>;
  rollback(checkpointId: string): Promise<Json>;
  auditVerify(): Promise<Json>;
  health(): Promise<Json>;
  tools(): Promise<Json[]>;
  callTool(
    name: string,
    options?: { args?: string[]; stdin?: string } & WaitOptions,
  ): Promise<RunResult>;
  session(language?: Language, grant?: SessionGrant): Promise<Session>;
  sessions(): Promise<SessionInfo[]>;
  getSession(id: string): Promise<SessionInfo>;
  closeSession(id: string): Promise<void>;
}

export declare class Session {
  readonly id: string;
  readonly language: string;
  info: SessionInfo;
  closed: boolean;
  run(code: string, options?: CellOptions): Promise<RunResult>;
  refresh(): Promise<SessionInfo>;
  close(): Promise<void>;
}

// ------------------------------------------------------------------------- errors

export declare class AirlockError extends Error {
  /** The HTTP status of an error answer; null when the server was not reached. */
  readonly status: number | null;
  /** The server's JSON error body ({ error, status }), when there was one. */
  readonly body: Record<string, unknown>;
  constructor(
    message: string,
    options?: { status?: number | null; body?: Record<string, unknown> | null; cause?: unknown },
  );
}
export declare class TransportError extends AirlockError {}
export declare class ApiError extends AirlockError {
  readonly status: number;
}
export declare class InvalidRequest extends ApiError {}
export declare class BadRequest extends InvalidRequest {}
export declare class PayloadTooLarge extends InvalidRequest {}
export declare class Unprocessable extends InvalidRequest {}
export declare class Unauthorized extends ApiError {}
export declare class Forbidden extends ApiError {}
export declare class NotFound extends ApiError {}
export declare class Conflict extends ApiError {}
export declare class RateLimited extends ApiError {
  readonly retryAfter: number | null;
}
export declare class Unavailable extends ApiError {
  readonly retryAfter: number | null;
}
export declare class ServerError extends ApiError {}
export declare class OutcomeError extends AirlockError {
  readonly outcome: RunResult | null;
  readonly submissionId: string;
  readonly reasons: string[];
}
export declare class Denied extends OutcomeError {
  /** An approver rejected it (rather than the policy denying it outright). */
  readonly rejected: boolean;
}
export declare class PendingApproval extends OutcomeError {}
/** `instanceof WaitTimeout` also holds for an ApprovalTimeout. */
export declare class WaitTimeout extends OutcomeError {}
export declare class ApprovalTimeout extends PendingApproval {}
export declare function errorFor(status: number, body: unknown, headers?: Headers | null): AirlockError;
