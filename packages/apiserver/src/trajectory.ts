// The trajectory log: every command and every file change that reaches a sandbox through the
// API, in order, with exit codes, output digests and bounded copies. The control plane keeps it
// (not the node), so it survives the node; a replay re-runs it on a fresh sandbox.
//
// The exec path stays cheap: a step is built in memory as the command runs (hashing output as
// it streams by) and appended to a batch; batches are written every quarter second in one
// transaction, never on the request's path. Reads flush first, so a step of a completed command
// is always seen by the next read.
import { DsecError } from '@dsec/protocol';
import type { ExecSpec, ImageSpec, Recovery, Resources, TrajectoryStep, TrajectoryStepKind } from '@dsec/protocol';
import type { TrajectoryStepTable, TrajectoryTable } from './db/schema.js';
import type { StateStore } from './db/store.js';
import { ExecRecording, FileRecording } from './trajectory-recording.js';
import { TrajectoryBudget } from './trajectory-budget.js';
import type { TrajectoryBudgetOptions } from './trajectory-budget.js';

export {
  ByteRecorder,
  ExecRecording,
  FileRecording,
  StepRecording,
  sha256Hex,
  TRAJECTORY_DATA_COPY_BYTES,
  TRAJECTORY_OUTPUT_COPY_BYTES,
} from './trajectory-recording.js';

/** Most steps stored per sandbox; later steps set `truncated`. */
export const DEFAULT_TRAJECTORY_MAX_STEPS = 10_000;
/** Most stored bytes per sandbox (steps as JSON, copies included); later steps set `truncated`. */
export const DEFAULT_TRAJECTORY_MAX_BYTES = 64 * 1024 * 1024;
/** How long the trajectory of a destroyed sandbox is kept. */
export const DEFAULT_TRAJECTORY_RETENTION_MS = 7 * 86_400_000;
/**
 * Interval of batch writes. SQLite's commit (synchronous = FULL: an fsync) holds the event loop
 * for milliseconds on a loaded disk; at 20 ms, one exec in four through the API waited behind
 * one (issue 15). Reads flush first, so nobody sees a step missing.
 */
const FLUSH_INTERVAL_MS = 250;
/** A batch this large is written at once. */
const FLUSH_BATCH_STEPS = 512;
/** Interval of the pass that deletes expired trajectories. */
const PRUNE_INTERVAL_MS = 3_600_000;

/** Limits of {@link TrajectoryLog}. */
export interface TrajectoryOptions {
  /** Default {@link DEFAULT_TRAJECTORY_MAX_STEPS}. */
  maxSteps?: number;
  /** Default {@link DEFAULT_TRAJECTORY_MAX_BYTES}. */
  maxBytes?: number;
  /** Default {@link DEFAULT_TRAJECTORY_RETENTION_MS}. */
  retentionMs?: number;
  /** Where write failures are reported. */
  log?: (line: string) => void;
  /** Byte budgets per tenant and in all (none: only `maxBytes` per sandbox). */
  budget?: Omit<TrajectoryBudgetOptions, 'log'> | undefined;
}

/** The sandbox a trajectory belongs to, as it was created (layer references resolved). */
export interface TrajectorySpec {
  backend: string;
  image: ImageSpec;
  snapshots?: string[];
  /** The snapshot the sandbox was created from. */
  snapshot?: string;
  resources: Resources;
  env?: Record<string, string>;
  labels?: Record<string, string>;
  timeoutMs?: number;
  /** What happens when its node is lost (kept so that a replayed sandbox keeps it too). */
  recovery?: Recovery;
}

/** What a trajectory's header holds. */
export interface TrajectoryHeader {
  sandboxId: string;
  projectId: string;
  spec: TrajectorySpec;
  layers: string[];
  createdAt: string;
}

/** Counters of one sandbox's log, kept in memory while it is written. */
interface LogState {
  projectId: string;
  nextSeq: number;
  steps: number;
  bytes: number;
  /** `steps` and `bytes` as last written. */
  storedSteps: number;
  storedBytes: number;
  truncated: boolean;
  /** A byte budget stopped the recording: nothing more is stored. */
  cut: boolean;
  /**
   * Steps of running commands already counted, with their stored size; made by the first such
   * step (most sandboxes' logs never have one: an empty map for each would cost ~290 bytes a
   * sandbox on a control plane holding hundreds of thousands).
   */
  provisional: Map<number, number> | undefined;
  /** The sandbox is gone: the state is dropped after each late step. */
  ended: boolean;
}

/** The trajectory log of every sandbox of the control plane. */
export class TrajectoryLog {
  private readonly states = new Map<string, LogState>();
  private readonly loading = new Map<string, Promise<LogState>>();
  private readonly headers = new Map<string, TrajectoryTable>();
  private readonly steps = new Map<string, TrajectoryStepTable>();
  private readonly ends = new Map<string, string>();
  /** Trajectories cut by a byte budget whose mark is not written yet (a write failed). */
  private readonly cuts = new Map<string, string>();
  /** Logs whose counters changed since the last write. */
  private readonly dirty = new Map<string, LogState>();
  /** Commands that run now, by `sandbox/proc` (stdin written later is added to them). */
  private readonly runningExecs = new Map<string, ExecRecording>();
  private flushing: Promise<void> = Promise.resolve();
  private timer: NodeJS.Timeout | undefined;
  private readonly pruneTimer: NodeJS.Timeout;
  private readonly maxSteps: number;
  private readonly maxBytes: number;
  private readonly retentionMs: number;
  private readonly log: (line: string) => void;
  private readonly budget: TrajectoryBudget | undefined;

  constructor(
    private readonly store: StateStore,
    /** The header of a sandbox that has none yet (created before this log, or elsewhere). */
    private readonly headerOf: (sandboxId: string) => Promise<TrajectoryHeader | undefined>,
    opts: TrajectoryOptions = {},
  ) {
    this.maxSteps = opts.maxSteps ?? DEFAULT_TRAJECTORY_MAX_STEPS;
    this.maxBytes = opts.maxBytes ?? DEFAULT_TRAJECTORY_MAX_BYTES;
    this.retentionMs = opts.retentionMs ?? DEFAULT_TRAJECTORY_RETENTION_MS;
    this.log = opts.log ?? (() => undefined);
    this.budget = opts.budget ? new TrajectoryBudget(store, { ...opts.budget, log: this.log }) : undefined;
    this.pruneTimer = setInterval(
      () => void this.prune().catch((err: unknown) => this.log(`trajectory: prune failed: ${(err as Error).message}`)),
      PRUNE_INTERVAL_MS,
    );
    this.pruneTimer.unref();
  }

  /** Starts the log of a new sandbox. */
  open(h: TrajectoryHeader): void {
    this.states.set(h.sandboxId, {
      projectId: h.projectId,
      nextSeq: 0,
      steps: 0,
      bytes: 0,
      storedSteps: 0,
      storedBytes: 0,
      truncated: false,
      cut: false,
      provisional: undefined,
      ended: false,
    });
    this.headers.set(h.sandboxId, headerRow(h));
    this.schedule();
  }

  /** The sandbox was destroyed: its log is closed (kept for the retention time). */
  end(sandboxId: string): void {
    this.ends.set(sandboxId, new Date().toISOString());
    const st = this.states.get(sandboxId);
    if (st) {
      // Commands still running may yet report their end; the state goes with the last of them.
      st.ended = true;
      if (!st.provisional) this.states.delete(sandboxId);
    }
    this.schedule();
  }

  /** Begins recording a command; `signal` is the request's (its abort kills the command). */
  async beginExec(sandboxId: string, spec: ExecSpec, via: 'exec' | 'stream' | 'ws', signal?: AbortSignal): Promise<ExecRecording> {
    const seq = await this.takeSeq(sandboxId);
    return new ExecRecording(this, sandboxId, seq, new Date().toISOString(), spec, via, signal);
  }

  /** Begins recording a file change. */
  async beginFile(sandboxId: string, kind: Exclude<TrajectoryStepKind, 'exec'>, fields: Partial<TrajectoryStep>): Promise<FileRecording> {
    const seq = await this.takeSeq(sandboxId);
    return new FileRecording(this, sandboxId, seq, kind, new Date().toISOString()).set(fields);
  }

  /**
   * The seq of a new step: counted here when this process is the store's only writer, else
   * handed out by the database (replicas record steps of one sandbox side by side).
   */
  private async takeSeq(sandboxId: string): Promise<number> {
    const st = this.states.get(sandboxId) ?? (await this.load(sandboxId));
    if (!this.store.shared) return st.nextSeq++;
    const seq = await this.store.nextTrajectorySeq(sandboxId);
    st.nextSeq = Math.max(st.nextSeq, seq + 1);
    return seq;
  }

  /** The seq the next step of a sandbox will get (steps below it happened before now). */
  async position(sandboxId: string): Promise<number> {
    const st = this.states.get(sandboxId) ?? (await this.load(sandboxId));
    return this.store.shared ? this.store.peekTrajectorySeq(sandboxId) : st.nextSeq;
  }

  /** Adds bytes written to a running command's stdin to its step. */
  noteStdin(sandboxId: string, proc: number, data: Uint8Array): void {
    this.runningExecs.get(`${sandboxId}/${proc}`)?.addStdin(data);
  }

  /** @internal */
  running(rec: ExecRecording): void {
    if (rec.procId !== undefined) this.runningExecs.set(`${rec.sandboxId}/${rec.procId}`, rec);
  }

  /** @internal A running command will never report its end: it stays stored as running. */
  abandoned(rec: ExecRecording): void {
    const st = this.states.get(rec.sandboxId);
    if (!st) return;
    forgetProvisional(st, rec.seq);
    if (st.ended && !st.provisional) this.states.delete(rec.sandboxId);
  }

  /** @internal */
  notRunning(rec: ExecRecording): void {
    if (rec.procId !== undefined && this.runningExecs.get(`${rec.sandboxId}/${rec.procId}`) === rec) this.runningExecs.delete(`${rec.sandboxId}/${rec.procId}`);
  }

  /**
   * @internal Appends a step to the batch. A provisional step (a command still running) is
   * replaced when it ends. Past the limits the step is dropped and the log marked truncated.
   */
  commit(sandboxId: string, step: TrajectoryStep, provisional = false): void {
    const st = this.states.get(sandboxId);
    if (st === undefined) {
      // The log was closed (the sandbox is gone) or not loaded: load it, then commit.
      void this.load(sandboxId)
        .then(() => this.commit(sandboxId, step, provisional))
        .catch((err: unknown) => this.log(`trajectory: ${sandboxId} step ${step.seq} lost: ${(err as Error).message}`));
      return;
    }
    if (st.cut) return;
    let json = JSON.stringify(step);
    const counted = st.provisional?.get(step.seq);
    const isNew = counted === undefined;
    if (isNew && st.steps >= this.maxSteps) {
      st.truncated = true;
      this.touched(sandboxId, st);
      return;
    }
    if (st.bytes - (counted ?? 0) + json.length > this.maxBytes) {
      // Over the byte budget: keep the step's facts and digests, without the copies.
      for (const key of ['stdout', 'stderr', 'stdin', 'data'] as const) delete step[key]?.base64;
      if (step.replayable) Object.assign(step, { replayable: false, reason: 'over the trajectory byte limit: content not kept' });
      st.truncated = true;
      json = JSON.stringify(step);
      if (isNew && st.bytes + json.length > this.maxBytes) {
        this.touched(sandboxId, st);
        return;
      }
    }
    st.bytes += json.length - (counted ?? 0);
    if (isNew) st.steps++;
    if (provisional) (st.provisional ??= new Map()).set(step.seq, json.length);
    else forgetProvisional(st, step.seq);
    this.steps.set(`${sandboxId}/${step.seq}`, {
      sandbox_id: sandboxId,
      seq: step.seq,
      kind: step.kind,
      started_at: step.startedAt,
      bytes: json.length,
      step: json,
    });
    this.touched(sandboxId, st);
  }

  private touched(sandboxId: string, st: LogState): void {
    this.dirty.set(sandboxId, st);
    // A late step of a gone sandbox: its counters travel with the batch; nothing stays here.
    if (st.ended && !st.provisional) this.states.delete(sandboxId);
    this.schedule(this.steps.size >= FLUSH_BATCH_STEPS);
  }

  private async load(sandboxId: string): Promise<LogState> {
    let pending = this.loading.get(sandboxId);
    if (!pending) {
      pending = (async () => {
        await this.flush();
        let row = await this.store.trajectory(sandboxId);
        if (!row) {
          const h = await this.headerOf(sandboxId);
          if (!h) throw new DsecError('SANDBOX_NOT_FOUND', `sandbox ${sandboxId} has no trajectory`, { sandboxId });
          row = headerRow(h);
          this.headers.set(sandboxId, row);
        }
        const st: LogState = {
          projectId: row.project_id,
          nextSeq: (await this.store.lastTrajectorySeq(sandboxId)) + 1,
          steps: row.steps,
          bytes: row.bytes,
          storedSteps: row.steps,
          storedBytes: row.bytes,
          truncated: row.truncated === 1,
          cut: row.cut_at !== null,
          provisional: undefined,
          ended: row.ended_at !== null,
        };
        this.states.set(sandboxId, st);
        return st;
      })().finally(() => this.loading.delete(sandboxId));
      this.loading.set(sandboxId, pending);
    }
    return pending;
  }

  private schedule(now = false): void {
    if (now) {
      clearTimeout(this.timer);
      this.timer = undefined;
      void this.flush().catch(() => undefined);
      return;
    }
    if (this.timer) return;
    this.timer = setTimeout(() => {
      this.timer = undefined;
      void this.flush().catch(() => undefined);
    }, FLUSH_INTERVAL_MS);
    this.timer.unref();
  }

  /** Writes everything appended so far; resolves when it is stored. */
  flush(): Promise<void> {
    const run = this.flushing.then(() => this.writeBatch());
    this.flushing = run.catch(() => undefined);
    return run;
  }

  private async writeBatch(): Promise<void> {
    if (this.headers.size === 0 && this.steps.size === 0 && this.ends.size === 0 && this.dirty.size === 0 && this.cuts.size === 0) return;
    const headers = [...this.headers.values()];
    let steps = [...this.steps.values()];
    const ends = [...this.ends].map(([sandboxId, at]) => ({ sandboxId, at }));
    const dirty = new Map(this.dirty);
    this.headers.clear();
    this.steps.clear();
    this.ends.clear();
    this.dirty.clear();
    const cuts = [...this.cuts].map(([sandboxId, at]) => ({ sandboxId, at }));
    this.cuts.clear();
    try {
      if (this.budget) {
        // The byte budgets: what does not fit cuts its trajectory (its steps of this batch stay out).
        const growth = [...dirty].map(([id, st]) => ({ sandboxId: id, projectId: st.projectId, delta: st.bytes - st.storedBytes }));
        const cut = await this.budget.admit(growth.filter((g) => g.delta !== 0));
        if (cut.size > 0) {
          steps = steps.filter((s) => !cut.has(s.sandbox_id));
          const at = new Date().toISOString();
          for (const id of cut) {
            const st = dirty.get(id)!;
            Object.assign(st, { steps: st.storedSteps, bytes: st.storedBytes, truncated: true, cut: true });
            st.provisional = undefined;
            if (st.ended) this.states.delete(id);
            cuts.push({ sandboxId: id, at });
          }
        }
      }
      const counters: Array<Pick<TrajectoryTable, 'sandbox_id' | 'steps' | 'bytes' | 'truncated'>> = [];
      for (const [id, st] of dirty) counters.push({ sandbox_id: id, steps: st.steps, bytes: st.bytes, truncated: st.truncated ? 1 : 0 });
      await this.store.writeTrajectories({ headers, steps, counters, ends, cuts });
      for (const st of dirty.values()) Object.assign(st, { storedSteps: st.steps, storedBytes: st.bytes });
    } catch (err) {
      this.budget?.forget();
      for (const c of cuts) if (!this.cuts.has(c.sandboxId)) this.cuts.set(c.sandboxId, c.at);
      // Keep the batch (newer entries win) and try again: a completed step is never dropped.
      for (const h of headers) if (!this.headers.has(h.sandbox_id)) this.headers.set(h.sandbox_id, h);
      for (const s of steps) if (!this.steps.has(`${s.sandbox_id}/${s.seq}`)) this.steps.set(`${s.sandbox_id}/${s.seq}`, s);
      for (const e of ends) if (!this.ends.has(e.sandboxId)) this.ends.set(e.sandboxId, e.at);
      for (const [id, st] of dirty) if (!this.dirty.has(id)) this.dirty.set(id, st);
      this.log(`trajectory: write failed (retrying): ${(err as Error).message}`);
      this.schedule();
      throw err;
    }
  }

  /** The stored header of a sandbox's trajectory (after a flush). */
  async header(sandboxId: string): Promise<TrajectoryTable | undefined> {
    await this.flush();
    return this.store.trajectory(sandboxId);
  }

  /** Stored steps with a seq above `after`, in order (after a flush). */
  async page(sandboxId: string, after: number, limit: number): Promise<TrajectoryStep[]> {
    await this.flush();
    return (await this.store.trajectorySteps(sandboxId, after, limit)).map((r) => JSON.parse(r.step) as TrajectoryStep);
  }

  /** Every stored step with a seq above `after`, read a page at a time. */
  async *stepsAfter(sandboxId: string, after: number): AsyncGenerator<TrajectoryStep> {
    for (let last = after; ;) {
      const page = await this.page(sandboxId, last, 200);
      for (const s of page) yield s;
      const tail = page[page.length - 1];
      if (!tail) return;
      last = tail.seq;
    }
  }

  /** Deletes the trajectories of sandboxes that ended longer ago than the retention time. */
  async prune(now = Date.now()): Promise<number> {
    await this.flush();
    let total = 0;
    for (let n = -1; n !== 0; total += n) n = await this.store.pruneTrajectories(new Date(now - this.retentionMs).toISOString());
    if (total > 0) this.budget?.forget();
    return total;
  }

  /** Writes what is pending and stops the timers. */
  async close(): Promise<void> {
    clearInterval(this.pruneTimer);
    clearTimeout(this.timer);
    this.timer = undefined;
    await this.flush().catch(() => undefined);
  }
}

/** Forgets a running step's count; the map goes with its last entry. */
function forgetProvisional(st: LogState, seq: number): void {
  if (st.provisional?.delete(seq) && st.provisional.size === 0) st.provisional = undefined;
}

function headerRow(h: TrajectoryHeader): TrajectoryTable {
  return {
    sandbox_id: h.sandboxId,
    project_id: h.projectId,
    spec: JSON.stringify(h.spec),
    layers: JSON.stringify(h.layers),
    created_at: h.createdAt,
    ended_at: null,
    steps: 0,
    bytes: 0,
    truncated: 0,
    cut_at: null,
  };
}
