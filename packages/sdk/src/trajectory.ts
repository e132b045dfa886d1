// sandbox.trajectory: the recorded steps of a sandbox (they outlive it) and their replay.
import { DsecError, ReplayRequestSchema, TrajectoryQuerySchema } from '@dsec/protocol';
import type { ReplayEvent, ReplayRequest, ReplayResult, ReplayStep, Trajectory, TrajectoryStep } from '@dsec/protocol';
import type { CallOptions } from './client.js';
import { streamedError } from './layers.js';
import { readNdjson } from './ndjson.js';
import type { Sandbox } from './sandbox.js';
import type { SandboxScope } from './scope.js';
import { defined, validate } from './validate.js';

/** Options of `sandbox.trajectory`. */
export interface TrajectoryOptions extends CallOptions {
  /** Steps with a seq above this. */
  after?: number;
  /** Page size (1-1000). */
  limit?: number;
  /** false: leave the bounded copies of output and content out (digests stay). Default true. */
  content?: boolean;
}

/** Options of `sandbox.replay` (`sandbox.trajectory.replay`). */
export interface ReplayOptions extends Omit<ReplayRequest, 'upTo'>, CallOptions {
  /** Replay steps up to and including this seq. */
  upTo?: number;
  /** Called with each step's verdict as it is known (the reply is then streamed). */
  onStep?: (step: ReplayStep) => void;
}

/** What `sandbox.replay` returns: the verdicts and the new sandbox, ready to use. */
export type ReplayOutcome = Omit<ReplayResult, 'sandbox'> & { sandbox: Sandbox };

/**
 * The trajectory of one sandbox. Calling it (`for await (const step of sandbox.trajectory())`)
 * is the same as `sandbox.trajectory.steps()`.
 */
export interface TrajectoryApi {
  /** Every recorded step (commands and file changes) in order, fetched a page at a time. */
  (opts?: TrajectoryOptions): AsyncGenerator<TrajectoryStep>;
  /** Every recorded step (commands and file changes) in order, fetched a page at a time. */
  steps(opts?: TrajectoryOptions): AsyncGenerator<TrajectoryStep>;
  /** One page of the sandbox's trajectory. */
  page(opts?: TrajectoryOptions): Promise<Trajectory>;
  /**
   * Creates a fresh sandbox from this one's layers (or from a snapshot of it) and re-runs the
   * recorded steps in order, with a verdict for each (`same`, `exit-differs`, `output-differs`,
   * `not-replayable`). Works after this sandbox is gone (its node died), while its trajectory
   * is kept.
   */
  replay(opts?: ReplayOptions): Promise<ReplayOutcome>;
}

/** Builds the trajectory module of a sandbox. */
export function trajectoryApi(scope: SandboxScope): TrajectoryApi {
  const { client } = scope;
  const page = async (opts: TrajectoryOptions = {}): Promise<Trajectory> => {
    const query = validate(
      TrajectoryQuerySchema,
      defined({ after: opts.after, limit: opts.limit, content: opts.content === undefined ? undefined : String(opts.content) }),
      'query',
    );
    return client.json<Trajectory>(
      { method: 'GET', path: scope.route('/trajectory'), query: { after: query.after, limit: query.limit, content: query.content } },
      defined({ signal: opts.signal, requestTimeoutMs: opts.requestTimeoutMs }),
    );
  };
  async function* steps(opts: TrajectoryOptions = {}): AsyncGenerator<TrajectoryStep> {
    let after = opts.after;
    for (;;) {
      const p = await page({ ...opts, ...(after !== undefined ? { after } : {}) });
      yield* p.items;
      if (p.nextCursor === null) return;
      after = Number(p.nextCursor);
    }
  }
  const replay = async (opts: ReplayOptions = {}): Promise<ReplayOutcome> => {
    const { signal, requestTimeoutMs, onStep, ...rest } = opts;
    const body = validate(ReplayRequestSchema, defined(rest));
    const call = defined({ signal, requestTimeoutMs: requestTimeoutMs ?? 0 });
    let result: ReplayResult | undefined;
    if (!onStep) {
      result = await client.json<ReplayResult>({ method: 'POST', path: scope.route('/replay'), body }, call);
    } else {
      const reply = await client.stream({ method: 'POST', path: scope.route('/replay'), body, accept: 'application/x-ndjson' }, call);
      for await (const ev of readNdjson<ReplayEvent>(reply.body)) {
        if (ev.type === 'step') onStep(ev.step);
        else if (ev.type === 'done') result = ev.result;
        else if (ev.type === 'error') throw streamedError(ev.error);
      }
      if (!result) throw new DsecError('UNAVAILABLE', 'replay: the stream ended without a result');
    }
    return { ...result, sandbox: scope.adopt(result.sandbox) };
  };
  return Object.assign((opts?: TrajectoryOptions) => steps(opts), { steps, page, replay });
}
