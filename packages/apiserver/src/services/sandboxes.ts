// Sandboxes as a resource: create (one, or a batch with per-item results), read, list, update
// (lease, owner), stats. The create path itself is the CreatePipeline's.
import { DsecError, invalidArgument, DEFAULT_PAGE_SIZE, forEachBounded, Limiter } from '@dsec/protocol';
import type {
  SandboxStatsSample,
  BatchItemResult,
  CreateSandboxBatchRequest,
  CreateSandboxBatchResult,
  CreateSandboxRequest,
  ListSandboxesQuery,
  Sandbox,
  SandboxRequest,
  SandboxStats,
  UpdateSandboxRequest,
} from '@dsec/protocol';
import type { AdmissionQueue } from '../admission.js';
import { requireRole } from '../auth.js';
import type { Principal } from '../auth.js';
import { crashPoint } from '../crash-points.js';
import type { SandboxTable } from '../db/schema.js';
import type { StateStore } from '../db/store.js';
import { itemError } from '../errors.js';
import { hashOf } from '../idempotency.js';
import type { IdempotencyKeys } from '../idempotency.js';
import { leaseOf, mergeLease, renewSpanMs } from '../leases.js';
import type { NodeRegistry } from '../nodes.js';
import type { Placement } from '../scheduler.js';
import { abortableSleep } from './common.js';
import type { ServiceSinks } from './common.js';
import { capacityError, placementOf, reservationOf } from './create-pipeline.js';
import type { CreateItem, CreatePipeline, Ticket } from './create-pipeline.js';
import type { LayerService } from './layers.js';
import { OWNER_GONE_REASONS } from './lifecycle.js';
import type { LifecycleService } from './lifecycle.js';
import type { OwnerService } from './owners.js';

/**
 * Creates of one batch that run at once on each node (a node's cores, not the batch's size, set
 * the pace): a batch spread over many nodes runs this many on each of them.
 */
export const DEFAULT_BATCH_CONCURRENCY = 16;
/**
 * Placed creates of all batches that run at once in this replica: a batch spread over hundreds of
 * nodes (16 on each) would otherwise start thousands of pipelines from one request. Creates still
 * waiting for admission do not count (they wait on capacity, not on work this replica does).
 */
export const BATCH_CREATES_IN_FLIGHT = 256;

/** Options of {@link SandboxService.create}. */
export interface CreateSandboxOptions {
  signal?: AbortSignal | undefined;
  /** The `Idempotency-Key` header, already validated. */
  idempotencyKey?: string | undefined;
  /** Called when the reply is a replay of an earlier request with the same key. */
  onReplay?: () => void;
}

/** Options of {@link SandboxService.createBatch}. */
export interface CreateBatchOptions {
  signal?: AbortSignal | undefined;
  /** The batch's `Idempotency-Key` (validated): item i is created under `<key>#<i>`. */
  idempotencyKey?: string | undefined;
  /** Called with each item as it finishes (in completion order). */
  onItem?: (item: BatchItemResult) => void;
  /** Creates that run at once on each node; default {@link DEFAULT_BATCH_CONCURRENCY}. */
  concurrency?: number;
  /** Called once the batch as a whole is accepted (before any item is created). */
  onStart?: () => void;
}

/** What {@link SandboxService} is built from. */
export interface SandboxServiceDeps {
  store: StateStore;
  nodes: NodeRegistry;
  placement: Placement;
  admission: AdmissionQueue;
  idempotency: IdempotencyKeys;
  pipeline: CreatePipeline;
  lifecycle: LifecycleService;
  owners: OwnerService;
  layers: LayerService;
  sinks: ServiceSinks;
}

/** One unit of a batch's work: run it, or give back what it holds without running it. */
interface BatchTask {
  run(): Promise<void>;
  cancel(): Promise<void>;
  /** The node it was placed on; none for an item still to be admitted (or waiting on its key). */
  node?: string;
}

/** Sandboxes: create, batch, read, list, update. */
export class SandboxService {
  /** Bounds the placed creates of all batches at once ({@link BATCH_CREATES_IN_FLIGHT}). */
  private readonly placedCreates = new Limiter(BATCH_CREATES_IN_FLIGHT);

  constructor(private readonly d: SandboxServiceDeps) {}

  /**
   * Creates a sandbox: claimed from a warm pool of the project when one matches, else admitted
   * (quota, node capacity; refused or queued as the request asks), placed and created on its
   * node. With an idempotency key, a retry gets the first request's sandbox. Nothing is left
   * behind on failure.
   */
  async create(p: Principal, body: CreateSandboxRequest, opts: CreateSandboxOptions = {}): Promise<Sandbox> {
    requireRole(p, 'member');
    const { admission, ...req } = body;
    const { pipeline, idempotency } = this.d;
    const item = await this.d.layers.withResolver(p.projectId, (resolve) => pipeline.prepare(p.projectId, req, '', resolve, p));
    const key = opts.idempotencyKey;
    if (key !== undefined) {
      const held = await idempotency.acquire(p.projectId, key, item.requestHash, opts.signal);
      if (!held.owned) {
        opts.onReplay?.();
        return pipeline.replayIdempotent(held.row);
      }
    }
    return pipeline.createHeld(p.projectId, item, admission ?? {}, opts.signal, key);
  }

  /**
   * A fork with memory of `source` (a VM): `body` is validated and resolved as any create, then
   * the sandbox is made on the source's node from a copy of its memory and disk.
   */
  async createMemoryFork(p: Principal, body: CreateSandboxRequest, source: SandboxTable, signal?: AbortSignal): Promise<Sandbox> {
    requireRole(p, 'member');
    const { admission, ...req } = body;
    const item = await this.d.pipeline.prepare(p.projectId, req, '', await this.d.layers.resolver(p.projectId), p);
    return this.d.pipeline.createMemoryFork(p.projectId, item, source, admission ?? {}, signal);
  }

  /**
   * Creates many sandboxes in one request, each with its own result: validation per item,
   * claims from pools, quota for the rest in one transaction, placement in one pass over the
   * nodes, then the creates with bounded concurrency on each node. Items refused for capacity fail alone
   * (or wait, if the batch asks to); a failed item leaves nothing behind. `items` that failed
   * their schema arrive as errors in `invalid` (index -> error), the others parsed.
   */
  async createBatch(
    p: Principal,
    batch: CreateSandboxBatchRequest,
    opts: CreateBatchOptions = {},
    invalid: ReadonlyMap<number, unknown> = new Map(),
  ): Promise<CreateSandboxBatchResult> {
    requireRole(p, 'member');
    const { pipeline, idempotency, store } = this.d;
    const key = opts.idempotencyKey;
    const { signal } = opts;
    const admission = batch.admission ?? {};
    const projectId = p.projectId;
    const resolve = await this.d.layers.resolver(projectId);
    const count = batch.items?.length ?? batch.count ?? 0;
    const results: BatchItemResult[] = new Array<BatchItemResult>(count);
    const finish = (index: number, outcome: { sandbox: Sandbox } | { error: unknown }): void => {
      const r: BatchItemResult =
        'sandbox' in outcome ? { index, sandbox: outcome.sandbox } : { index, error: itemError(outcome.error, (l) => this.d.sinks.log(`${l} (a batch item)`)) };
      results[index] = r;
      opts.onItem?.(r);
    };

    // Validation: a bad spec fails the whole request; a bad item fails alone.
    const items: Array<{ index: number; item: CreateItem }> = [];
    if (batch.spec) {
      const item = await pipeline.prepare(projectId, batch.spec, 'spec', resolve, p);
      for (let i = 0; i < count; i++) items.push({ index: i, item });
    } else {
      for (const [i, raw] of (batch.items ?? []).entries()) {
        const refused = invalid.get(i);
        if (refused !== undefined) {
          finish(i, { error: refused });
          continue;
        }
        try {
          items.push({ index: i, item: await pipeline.prepare(projectId, raw as SandboxRequest, `items.${i}`, resolve, p) });
        } catch (err) {
          finish(i, { error: err });
        }
      }
    }
    if (key !== undefined) {
      // The batch's own key guards against reusing it for another batch; items get `<key>#<i>`.
      const { admission: _ignored, ...what } = batch;
      const held = await idempotency.acquire(projectId, key, hashOf({ batch: what }), signal);
      if (held.owned) await idempotency.complete(projectId, key, null);
    }

    opts.onStart?.();

    const tasks: BatchTask[] = [];
    const itemKey = (index: number): string | undefined => (key === undefined ? undefined : `${key}#${index}`);
    const cancelled = (): DsecError => new DsecError('CANCELLED', 'the request was cancelled before this item was created');
    /** A task for one item whose key (if any) is held: through the whole pipeline, or with a ticket. */
    const held = (index: number, item: CreateItem, ticket?: Ticket): BatchTask => ({
      ...(ticket ? { node: ticket.node.name } : {}),
      run: async () => {
        try {
          finish(index, { sandbox: await pipeline.createHeld(projectId, item, admission, signal, itemKey(index), ticket) });
        } catch (err) {
          finish(index, { error: err });
        }
      },
      cancel: async () => {
        await ticket?.release();
        const k = itemKey(index);
        if (k !== undefined) await idempotency.release(projectId, k);
        finish(index, { error: cancelled() });
      },
    });

    // Keys and claims, item by item (a claim is one short transaction). Once a claim finds no
    // ready member for a spec, the batch's other items of that spec do not look again.
    const fresh: Array<{ index: number; item: CreateItem }> = [];
    const noMember = new Set<string>();
    for (const it of items) {
      const k = itemKey(it.index);
      try {
        if (k !== undefined) {
          const got = await idempotency.tryAcquire(projectId, k, it.item.requestHash);
          if ('pending' in got) {
            // Another request holds this item's key: wait for it, as a single create would.
            tasks.push({
              run: async () => {
                try {
                  const again = await idempotency.acquire(projectId, k, it.item.requestHash, signal);
                  finish(it.index, {
                    sandbox: again.owned ? await pipeline.createHeld(projectId, it.item, admission, signal, k) : await pipeline.replayIdempotent(again.row),
                  });
                } catch (err) {
                  finish(it.index, { error: err });
                }
              },
              cancel: async () => finish(it.index, { error: cancelled() }),
            });
            continue;
          }
          if (!got.owned) {
            finish(it.index, { sandbox: await pipeline.replayIdempotent(got.row) });
            continue;
          }
        }
        const claimed = noMember.has(it.item.poolKey) ? undefined : await pipeline.claimFromPool(projectId, it.item, k);
        if (!claimed) {
          noMember.add(it.item.poolKey);
          fresh.push(it);
          continue;
        }
        if (k !== undefined) await idempotency.complete(projectId, k, claimed);
        finish(it.index, { sandbox: claimed });
      } catch (err) {
        if (k !== undefined) await idempotency.release(projectId, k).catch(() => undefined);
        finish(it.index, { error: err });
      }
    }

    // Quota for the rest in one transaction, placement in one pass, unless the project already
    // has creates waiting (they go first: these queue behind them, or are refused).
    const queued = this.d.admission.waiting(projectId) > 0;
    const refusals = queued
      ? fresh.map(() => undefined)
      : await store.reserveMany(
          projectId,
          fresh.map((f) => reservationOf(f.item)),
        );
    const admitted = queued ? [] : fresh.filter((_, i) => !refusals[i]);
    const nodes = this.d.placement.placeMany(
      admitted.map((f) => placementOf(f.item)),
      this.d.nodes.all(),
    );
    const later: Array<{ index: number; item: CreateItem; refusal: DsecError | undefined }> = queued ? fresh.map((f) => ({ ...f, refusal: undefined })) : [];
    for (const [i, f] of admitted.entries()) {
      const node = nodes[i];
      if (node) {
        pipeline.chargeNode(node, f.item, 1);
        tasks.push(held(f.index, f.item, pipeline.ticket(projectId, f.item, node, reservationOf(f.item))));
      } else {
        await store.unreserve(projectId, reservationOf(f.item));
        later.push({ ...f, refusal: capacityError(f.item) });
      }
    }
    if (!queued) for (const [i, f] of fresh.entries()) if (refusals[i]) later.push({ ...f, refusal: refusals[i] });
    if (admitted.length > 0) crashPoint('batch.reserved');
    for (const f of later.sort((a, b) => a.index - b.index)) {
      // Waiting, or behind the project's waiting creates: the admission queue answers.
      if (admission.wait || !f.refusal) {
        tasks.push(held(f.index, f.item));
        continue;
      }
      const k = itemKey(f.index);
      if (k !== undefined) await idempotency.release(projectId, k);
      finish(f.index, { error: f.refusal });
    }

    // The creates, a few at a time on each node (the items still to be admitted a few at a time
    // together); after a cancel the rest are given back unstarted.
    const lanes = new Map<string, BatchTask[]>();
    for (const t of tasks) {
      const lane = lanes.get(t.node ?? '');
      if (lane) lane.push(t);
      else lanes.set(t.node ?? '', [t]);
    }
    const limit = opts.concurrency ?? DEFAULT_BATCH_CONCURRENCY;
    const step = (t: BatchTask): Promise<void> => (signal?.aborted ? t.cancel() : t.run());
    await Promise.all([...lanes].map(([node, lane]) => forEachBounded(lane, limit, (t) => (node ? this.placedCreates.run(() => step(t)) : step(t)))));
    const created = results.filter((r) => r.sandbox).length;
    return { items: results, created, failed: count - created };
  }

  /** GET /v1/sandboxes/{id} */
  async get(p: Principal, id: string): Promise<Sandbox> {
    return this.d.lifecycle.toSandbox(await this.d.lifecycle.sandboxRow(p, id));
  }

  /** GET /v1/sandboxes: a page of the visible sandboxes, filtered by labels and state. */
  async list(p: Principal, q: ListSandboxesQuery): Promise<{ items: Sandbox[]; nextCursor: string | null }> {
    const limit = q.limit ?? DEFAULT_PAGE_SIZE;
    const labels = (q.label ?? []).map((l) => {
      const i = l.indexOf('=');
      return [l.slice(0, i), l.slice(i + 1)] as [string, string];
    });
    let after: string | undefined;
    if (q.cursor) {
      after = Buffer.from(q.cursor, 'base64url').toString('utf8');
      if (!/^[a-z0-9-]{1,128}$/.test(after)) throw invalidArgument('query.cursor', 'not a cursor from this API');
    }
    const rows = await this.d.store.listSandboxes({
      projectIds: [...p.visibleProjects],
      labels,
      ...(q.state ? { state: q.state } : {}),
      limit: limit + 1,
      ...(after ? { after } : {}),
    });
    const page = rows.slice(0, limit);
    const last = page[page.length - 1];
    return {
      items: page.map((r) => this.d.lifecycle.toSandbox(r)),
      nextCursor: rows.length > limit && last ? Buffer.from(last.id).toString('base64url') : null,
    };
  }

  /**
   * PATCH /v1/sandboxes/{id}: changes the lease (fields given replace the granted ones; a new
   * maxLifetimeMs counts from creation) or the owner. A new owner taking over a sandbox that
   * was paused because its old owner went away resumes it.
   */
  async update(p: Principal, id: string, req: UpdateSandboxRequest): Promise<Sandbox> {
    requireRole(p, 'member');
    const row = await this.d.lifecycle.sandboxRow(p, id);
    const set: Parameters<StateStore['updateSandbox']>[1] = {};
    if (req.lease) {
      const current = leaseOf(row);
      const lease = mergeLease(current, req.lease);
      // A resume after the lifetime ended renews the span granted at creation, not this one.
      if (req.lease.maxLifetimeMs !== undefined) lease.renewMs = renewSpanMs(current);
      set.lease = JSON.stringify(lease);
      set.expires_at = new Date(Date.parse(row.created_at) + lease.maxLifetimeMs).toISOString();
    }
    if (req.owner !== undefined) {
      if (req.owner !== null) await this.d.owners.liveOwner(p, req.owner, 'owner');
      set.owner_id = req.owner;
    }
    await this.d.store.updateSandbox(row.id, set);
    if (req.owner && row.state === 'paused' && OWNER_GONE_REASONS.includes(row.pause_reason ?? '')) await this.d.lifecycle.resumeRow(row, 'owner-reattached');
    return this.get(p, row.id);
  }

  /**
   * GET /v1/sandboxes/{id}/stats as a stream: the stats now and every `intervalMs` until `signal`
   * aborts (viewer). The sandbox is routed again for each sample (it may be deleted, or its node
   * lost); a failure ends the stream with one line naming its error code.
   */
  async statsStream(p: Principal, id: string, intervalMs: number, signal: AbortSignal): Promise<AsyncGenerator<SandboxStatsSample>> {
    // Refused (404, 403) before the stream starts, as a plain GET would be.
    await this.d.lifecycle.route(p, id, 'viewer', { paused: 'allow' });
    return this.statsSamples(p, id, intervalMs, signal);
  }

  private async *statsSamples(p: Principal, id: string, intervalMs: number, signal: AbortSignal): AsyncGenerator<SandboxStatsSample> {
    while (!signal.aborted) {
      const at = new Date().toISOString();
      try {
        yield { at, stats: await this.stats(p, id) };
      } catch (err) {
        if (signal.aborted) return;
        const e = err instanceof DsecError ? err : new DsecError('INTERNAL', 'stats could not be read');
        yield { at, error: { code: e.code, message: e.message } };
        return;
      }
      await abortableSleep(intervalMs, signal);
    }
  }

  /** GET /v1/sandboxes/{id}/stats: read on the host, so a paused sandbox is measured as it is. */
  async stats(p: Principal, id: string): Promise<SandboxStats> {
    const { edge, row } = await this.d.lifecycle.route(p, id, 'viewer', { paused: 'allow' });
    return edge.stats(row.id);
  }
}
