// Function calls: run a snippet once in a fresh sandbox (POST /v1/calls), or up to 1,000 of them.
import { CallBatchRequestSchema, CallRequestSchema, DEFAULT_CALL_TIMEOUT_MS } from '@dsec/protocol';
import type { CallBatchItem, CallBatchResult, CallRequest, CallResult } from '@dsec/protocol';
import type { CallOptions, DsecClient } from './client.js';
import { validate } from './validate.js';

/** Time the request may take beyond the call's own time limit (queueing, transfer). */
const CALL_REQUEST_MARGIN_MS = 30_000;

/** Stateless calls: each runs as a fresh process in a fresh sandbox; nothing survives it. */
export class CallsApi {
  constructor(private readonly client: DsecClient) {}

  /** Runs one call and returns its result (a non-zero exit is a result, not an error). */
  async run(call: CallRequest, opts: CallOptions = {}): Promise<CallResult> {
    const body = validate(CallRequestSchema, call);
    const timeoutMs = opts.requestTimeoutMs ?? Math.max(this.client.requestTimeoutMs, (body.timeoutMs ?? DEFAULT_CALL_TIMEOUT_MS) + CALL_REQUEST_MARGIN_MS);
    return this.client.json<CallResult>({ method: 'POST', path: '/v1/calls', body, timeoutMs }, opts);
  }

  /**
   * Runs up to 1,000 calls; the reply has one item per call in request order: a result, or
   * `{error}` when that call could not run. No deadline unless `requestTimeoutMs` is given.
   */
  async runBatch(calls: CallRequest[], opts: CallOptions = {}): Promise<CallBatchItem[]> {
    const body = validate(CallBatchRequestSchema, { calls });
    const reply = await this.client.json<CallBatchResult>({ method: 'POST', path: '/v1/calls/batch', body, timeoutMs: opts.requestTimeoutMs ?? 0 }, opts);
    return reply.results;
  }
}
