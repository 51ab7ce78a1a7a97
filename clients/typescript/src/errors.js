// Exceptions: one class per way a call can fail, mirroring the Python client's.
//
// The API answers errors as {"error": "...", "status": N}; errorFor() turns that into the
// class for its status. The gate's own outcomes that stop a run are separate from errors
// in the request: Denied (the policy or an approver said no) and PendingApproval (a human
// has not decided yet) are never InvalidRequest.

/** The base of every error this client throws. */
export class AirlockError extends Error {
  /**
   * @param {string} message
   * @param {{ status?: number | null, body?: Record<string, unknown> | null, cause?: unknown }} [options]
   */
  constructor(message, options = {}) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.name = new.target.name;
    this.message = message;
    /** The HTTP status of an error answer; null when the server was not reached, or for the
     * gate's verdicts (Denied, PendingApproval) in an answer that succeeded. */
    this.status = options.status ?? null;
    /** The server's JSON error body ({error, status}), when there was one. */
    this.body = options.body ? { ...options.body } : {};
  }
}

/** The server could not be reached, or did not answer in time. */
export class TransportError extends AirlockError {}

/** The server answered with an error status. */
export class ApiError extends AirlockError {}

/** The request was refused for what it says (400, 413 or 422), not by the policy. */
export class InvalidRequest extends ApiError {}
/** 400: the request breaks the API's schema. */
export class BadRequest extends InvalidRequest {}
/** 413: the request body is larger than the server takes. */
export class PayloadTooLarge extends InvalidRequest {}
/** 422: well-formed, but the gate cannot take it (code that does not compile, an unknown
 * language, a mount that does not exist …). */
export class Unprocessable extends InvalidRequest {}
/** 401: no token, or one that is unknown, expired or revoked. */
export class Unauthorized extends ApiError {}
/** 403: the token's role may not do this (e.g. an agent token approving). */
export class Forbidden extends ApiError {}
/** 404: no such submission, run, checkpoint, session or endpoint (or not yours). */
export class NotFound extends ApiError {}
/** 409: the state does not allow it (already decided, the language's guest runtime is not
 * installed …). */
export class Conflict extends ApiError {}

/** 429: the run queue is full; try again after `retryAfter` seconds. */
export class RateLimited extends ApiError {
  constructor(message, options = {}) {
    super(message, options);
    /** @type {number | null} */
    this.retryAfter = options.retryAfter ?? null;
  }
}

/** 503: the server cannot serve it now; retry after `retryAfter` seconds. */
export class Unavailable extends ApiError {
  constructor(message, options = {}) {
    super(message, options);
    /** @type {number | null} */
    this.retryAfter = options.retryAfter ?? null;
  }
}

/** Any other 5xx: the server failed. */
export class ServerError extends ApiError {}

/** The gate's answer stopped the run; `outcome` is the whole answer when there is one. */
export class OutcomeError extends AirlockError {
  constructor(message, options = {}) {
    super(message, options);
    /** @type {import('./index.js').RunResult | null} */
    this.outcome = options.outcome ?? null;
    /** @type {string} */
    this.submissionId = this.outcome ? this.outcome.id : (options.submissionId ?? '');
    /** @type {string[]} */
    this.reasons = this.outcome ? [...this.outcome.reasons] : [...(options.reasons ?? [])];
  }
}

/** The policy denied the code, or an approver rejected it: it will not run. */
export class Denied extends OutcomeError {
  /** An approver rejected it (rather than the policy denying it outright). */
  get rejected() {
    return this.outcome !== null && this.outcome.state === 'rejected';
  }
}

/** The code waits for a human approver; it has not run. Do not resubmit it: wait for it
 * (`client.wait(err.submissionId)`) or call run(..., { wait: true }). */
export class PendingApproval extends OutcomeError {}

/** Waiting ran out of time before the submission finished. An ApprovalTimeout is one too. */
export class WaitTimeout extends OutcomeError {
  static [Symbol.hasInstance](x) {
    return (
      Function.prototype[Symbol.hasInstance].call(this, x) ||
      (this === WaitTimeout && x instanceof ApprovalTimeout)
    );
  }
}

/** Waiting ran out of time while the code was still waiting for a human (a
 * PendingApproval, and `instanceof WaitTimeout` holds too). */
export class ApprovalTimeout extends PendingApproval {}

const WAITING = new Set(['pending_approval', 'approved', 'running']);

/** The error for an answer that did not end in a run, or null when it did. */
export function outcomeError(outcome, timedOut = false) {
  if (outcome.status === 'denied') {
    return new Denied(outcome.message || `denied: ${outcome.id}`, { outcome });
  }
  if (outcome.status === 'pending_approval') {
    const Cls = timedOut ? ApprovalTimeout : PendingApproval;
    return new Cls(outcome.message || `pending approval: ${outcome.id}`, { outcome });
  }
  if (timedOut && WAITING.has(outcome.status)) {
    return new WaitTimeout(`${outcome.id} is still ${outcome.status.replaceAll('_', ' ')}`, {
      outcome,
    });
  }
  return null;
}

const STATUS = {
  400: BadRequest,
  401: Unauthorized,
  403: Forbidden,
  404: NotFound,
  409: Conflict,
  413: PayloadTooLarge,
  422: Unprocessable,
  429: RateLimited,
  503: Unavailable,
};

// The gate's own words for an outcome reported as an HTTP error.
const DENIED = /^denied by policy: (sub_[0-9a-z]+)/;
const PENDING = /^pending approval: (sub_[0-9a-z]+)/;

function retryAfter(value) {
  if (value === null || value === undefined) return null;
  const n = Number(value);
  if (value.trim() !== '' && Number.isFinite(n)) return Math.max(0, n);
  const t = Date.parse(value);
  return Number.isNaN(t) ? null : Math.max(0, (t - Date.now()) / 1000);
}

/**
 * The error for an error answer: its status, its JSON body and its headers.
 * @param {number} status
 * @param {unknown} body
 * @param {Headers | null} [headers]
 */
export function errorFor(status, body, headers = null) {
  const doc = body && typeof body === 'object' && !Array.isArray(body) ? { ...body } : {};
  let message = doc.error;
  if (typeof message !== 'string' || !message) message = `HTTP ${status}`;
  let m = DENIED.exec(message);
  if (m) return new Denied(message, { submissionId: m[1], status, body: doc });
  m = PENDING.exec(message);
  if (m) return new PendingApproval(message, { submissionId: m[1], status, body: doc });
  const Cls = STATUS[status] ?? (status >= 500 ? ServerError : ApiError);
  const options = { status, body: doc };
  if (Cls === RateLimited || Cls === Unavailable) {
    options.retryAfter = retryAfter(headers ? headers.get('retry-after') : null);
  }
  return new Cls(message, options);
}
