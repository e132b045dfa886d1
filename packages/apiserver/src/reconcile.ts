// The control plane's start-up reconcile, on a store that one process serves alone (`dsec up`):
// whatever a crash (SIGKILL, power cut) cut short is settled before the first request. Rows in a
// transitional state are driven to a final one against what their node reports, sandboxes on a
// node with no row are destroyed, pending idempotency keys and open trajectories of gone
// sandboxes are let go, and every project's usage is recomputed from the rows that remain.
// Each row it settles raises its row event, as the services do, so live lists follow.
import { DsecError } from '@dsec/protocol';
import type { EdgeClient, EdgeSandbox, Sandbox } from '@dsec/protocol';
import type { SandboxTable } from './db/schema.js';
import { IN_FLIGHT_STATES } from './db/store.js';
import type { Reservation, StateStore } from './db/store.js';
import type { NodeRegistry } from './nodes.js';
import { POOLED_STATE } from './pools.js';
import { PAUSING, RESUMING } from './services/common.js';
import type { SandboxRowEvents } from './services/sandbox-events.js';

/** What {@link reconcileAtStart} works on. */
export interface ReconcileDeps {
  store: StateStore;
  nodes: NodeRegistry;
  log: (line: string) => void;
  /** The API's view of a row: the first reply recorded on an idempotency key settled here. */
  toSandbox?: (row: SandboxTable & { labels: Record<string, string> }) => Sandbox;
  /** Where the row events of the rows it settles go (the lifecycle's); none: not raised. */
  rowEvents?: Pick<SandboxRowEvents, 'created' | 'stateChanged' | 'deleted'>;
}

/** One row the reconcile moved: from its state to `to` (`deleted`: the row is gone). */
export interface SettledRow {
  id: string;
  from: string;
  to: string;
}

/** What the start-up reconcile did. */
export interface ReconcileReport {
  /** Rows moved to a final state (or deleted). */
  settled: SettledRow[];
  /** Sandboxes a node ran with no row: destroyed. */
  orphans: string[];
  /** Nodes that did not answer: their rows were left as they are. */
  unreachable: string[];
  /** Projects whose usage did not match their rows, before and after. */
  usage: Array<{ projectId: string; before: Reservation; after: Reservation }>;
  /** Idempotency keys of requests that died with the previous process before making a sandbox: dropped. */
  idempotencyKeys: number;
  /** Keys of requests that died after their sandbox stood: done with it (`key -> sandbox id`). */
  idempotencySettled: string[];
  /** Open trajectories of sandboxes whose row is gone, now ended. */
  trajectories: number;
}

/** True when the report changed nothing. */
export function reconcileWasClean(r: ReconcileReport): boolean {
  return r.settled.length + r.orphans.length + r.usage.length + r.idempotencyKeys + r.idempotencySettled.length + r.trajectories === 0;
}

/** One line for the log. */
export function reconcileSummary(r: ReconcileReport): string {
  const parts = [
    ...r.settled.map((s) => `${s.id} ${s.from} -> ${s.to}`),
    ...(r.orphans.length ? [`orphans destroyed: ${r.orphans.join(', ')}`] : []),
    ...(r.usage.length ? [`usage recomputed for ${r.usage.map((u) => `${u.projectId} (${u.before.sandboxes} -> ${u.after.sandboxes})`).join(', ')}`] : []),
    ...(r.idempotencyKeys ? [`${r.idempotencyKeys} pending idempotency keys dropped`] : []),
    ...(r.idempotencySettled.length ? [`idempotency keys settled with their sandbox: ${r.idempotencySettled.join(', ')}`] : []),
    ...(r.trajectories ? [`${r.trajectories} trajectories ended`] : []),
    ...(r.unreachable.length ? [`nodes not reconciled (unreachable): ${r.unreachable.join(', ')}`] : []),
  ];
  return `dsec: reconciled at start: ${parts.join('; ')}`;
}

/** Destroys a sandbox on its node; one the node no longer has is fine. */
async function destroyOnNode(client: EdgeClient, id: string): Promise<void> {
  try {
    await client.destroy(id);
  } catch (err) {
    if (!(err instanceof DsecError && err.code === 'SANDBOX_NOT_FOUND')) throw err;
  }
}

/** Raises the row event of a row settled `to` (as {@link settleRow} names it); pool members raise none. */
function raiseSettled(d: ReconcileDeps, row: SandboxTable, to: string): void {
  if (!d.rowEvents || row.pool_id !== null) return;
  if (to === 'deleted') d.rowEvents.deleted(row, row.state);
  else if (to === 'lost' || to === 'running' || to === 'failed') d.rowEvents.stateChanged(row, to, row.state);
}

/**
 * Moves a row from the state and replica tag it was read with to `to`; false when it has moved
 * since (another replica took it up again): it is left alone.
 */
function moveAsRead(store: StateStore, row: SandboxTable, to: string, also: Partial<Omit<SandboxTable, 'id' | 'state'>> = {}): Promise<boolean> {
  return store.transitionSandbox(row.id, [row.state], to, also, row.replica ?? null);
}

/**
 * Takes a row up as this process's work in the in-flight state `to` (as {@link moveAsRead}):
 * the row as it now stands (tagged with this process where the store tags), or undefined.
 */
async function takeAsRead(store: StateStore, row: SandboxTable, to: string): Promise<SandboxTable | undefined> {
  if (!(await moveAsRead(store, row, to))) return undefined;
  return { ...row, state: to, replica: store.sessionTag ?? row.replica };
}

/**
 * Settles one row against its node's view (`onNode` undefined: the node does not run it).
 * Returns the state the row was left in, `deleted`, or undefined when it was already final or
 * had moved since it was read. Each write is guarded by the state and replica tag read, and
 * comes before what it asks of the node: a process that lost the row to another (a live replica
 * took it up again) never acts on its sandbox.
 */
async function settleRow(
  store: StateStore,
  client: EdgeClient,
  row: SandboxTable,
  onNode: EdgeSandbox | undefined,
  log: (line: string) => void,
): Promise<string | undefined> {
  const running = { paused_at: null, pause_reason: null };
  switch (row.state) {
    case 'creating':
    case 'stopping':
      // A create (or a pool claim: `creating` until its node handed it over) cut short is
      // rolled back (its caller never got the sandbox: a retry with the same idempotency key
      // makes a new one); a delete cut short is finished. A sandbox whose destroy fails after
      // its row went runs without a row: the watcher destroys it as an orphan (its node share went
      // with the row, so until then the node holds one more than its count).
      if (!(await store.deleteSandbox(row, true))) return undefined;
      if (onNode) await destroyOnNode(client, row.id).catch((err: unknown) => log(`dsec: reconcile: destroying ${row.id}: ${(err as Error).message}`));
      return 'deleted';
    case PAUSING:
    case RESUMING:
    case 'running':
    case 'paused': {
      if (!onNode) return (await moveAsRead(store, row, 'lost')) ? 'lost' : undefined;
      if (row.state === 'paused' && onNode.state === 'paused') return undefined;
      // A pause cut short is undone (its caller saw no answer; an idle or owner pause comes
      // again on the next lease pass); a resume cut short is finished. Either way: running.
      if (onNode.state === 'paused' && row.state === 'running') {
        // Only at a start alone (a running row is nobody's work under way).
        await client.resume(row.id, { reason: 'reconcile' });
        return undefined;
      }
      if (onNode.state === 'paused' && row.state !== 'paused') {
        // Taken up as this process's resume first, then resumed on its node, then running.
        const taken = await takeAsRead(store, row, RESUMING);
        if (!taken) return undefined;
        try {
          await client.resume(row.id, { reason: 'reconcile' });
        } catch (err) {
          log(`dsec: reconcile: ${row.id} (${row.state}): ${(err as Error).message}`);
          return (await moveAsRead(store, taken, 'failed')) ? 'failed' : undefined;
        }
        return (await moveAsRead(store, taken, 'running', running)) ? 'running' : undefined;
      }
      if (row.state === 'running') return undefined;
      return (await moveAsRead(store, row, 'running', running)) ? 'running' : undefined;
    }
    case POOLED_STATE:
      if (onNode) return undefined;
      // Nobody has seen a pool member's id: one its node lost simply goes.
      return (await store.deleteSandbox(row, true)) ? 'deleted' : undefined;
    default:
      // failed, lost: final already, and deletable.
      return undefined;
  }
}

function emptyReport(): ReconcileReport {
  return { settled: [], orphans: [], unreachable: [], usage: [], idempotencyKeys: 0, idempotencySettled: [], trajectories: 0 };
}

/** A node's client and what it runs, by sandbox id. */
interface NodeView {
  client: EdgeClient;
  sandboxes: Map<string, EdgeSandbox>;
}
type NodeViews = Map<string, NodeView>;

/** What each node runs, by sandbox id; a node that does not answer is reported unreachable. */
async function nodeViews(of: ReturnType<NodeRegistry['all']>, report: ReconcileReport, log: (line: string) => void): Promise<NodeViews> {
  const views: NodeViews = new Map();
  for (const n of of) {
    try {
      views.set(n.name, { client: n.client, sandboxes: new Map((await n.client.list()).map((s) => [s.id, s])) });
    } catch (err) {
      report.unreachable.push(n.name);
      log(`dsec: reconcile: node ${n.name} did not answer: ${(err as Error).message}`);
    }
  }
  return views;
}

/** Settles each row against its node's view (rows on nodes without a view are left as they are). */
async function settleRows(d: ReconcileDeps, rows: readonly SandboxTable[], views: NodeViews, report: ReconcileReport): Promise<void> {
  for (const row of rows) {
    const view = views.get(row.node);
    if (!view) continue;
    try {
      const to = await settleRow(d.store, view.client, row, view.sandboxes.get(row.id), d.log);
      if (to) {
        report.settled.push({ id: row.id, from: row.state, to });
        raiseSettled(d, row, to);
      }
    } catch (err) {
      // The node refused (it will be retried by a delete): the row stays deletable.
      d.log(`dsec: reconcile: ${row.id} (${row.state}): ${(err as Error).message}`);
      await failRow(d, row, report);
    }
  }
}

/**
 * A row that could not be settled becomes `failed`: listed, and deletable. Only while it is
 * still in the state and tagged with the replica it was read with: a row another replica took up
 * again since (a pause of a live replica) is left alone.
 */
async function failRow(d: ReconcileDeps, row: SandboxTable, report: ReconcileReport): Promise<void> {
  if (!['failed', 'lost'].includes(row.state) && (await moveAsRead(d.store, row, 'failed'))) {
    report.settled.push({ id: row.id, from: row.state, to: 'failed' });
    raiseSettled(d, row, 'failed');
  }
}

/** Destroys the sandboxes `view` runs that are not in `known` (no row); reported as orphans. */
async function destroyOrphans(d: ReconcileDeps, name: string, view: NodeView, known: Set<string>, report: ReconcileReport): Promise<void> {
  for (const id of view.sandboxes.keys()) {
    if (known.has(id)) continue;
    try {
      await destroyOnNode(view.client, id);
      report.orphans.push(id);
    } catch (err) {
      d.log(`dsec: reconcile: orphan ${id} on ${name}: ${(err as Error).message}`);
    }
  }
}

/**
 * Settles pending idempotency keys created before `before` whose request died (with `replica`,
 * only that gone replica's), once the rows are settled: a key whose sandbox stands is done with
 * it (its first reply recorded), so that a retry gets that sandbox and not a second one; the
 * others go (a retry creates anew).
 */
async function settleKeys(d: ReconcileDeps, report: ReconcileReport, before: string, replica?: string): Promise<void> {
  const keys = await d.store.settlePendingIdempotencyKeys(before, replica);
  report.idempotencyKeys = keys.dropped;
  for (const k of keys.settled) {
    report.idempotencySettled.push(`${k.key} -> ${k.sandbox_id}`);
    const row = d.toSandbox && k.sandbox_id ? await d.store.sandbox(k.sandbox_id) : undefined;
    if (row && d.toSandbox) await d.store.setIdempotencyResponse(k.project_id, k.key, JSON.stringify(d.toSandbox(row)));
  }
}

/** What {@link reconcileGoneReplica} did: the rows it settled, the reservations it gave back, its idempotency keys. */
export interface GoneReplicaReport {
  settled: SettledRow[];
  released: Array<{ projectId: string; released: Reservation }>;
  unreachable: string[];
  /** Its pending keys without a standing sandbox: dropped. */
  idempotencyKeys: number;
  /** Its pending keys settled with their sandbox (`key -> sandbox id`). */
  idempotencySettled: string[];
}

/**
 * Settles the work of a replica that is gone (no session on the shared store), beside the live
 * ones: each row it left `creating`, `pausing`, `resuming` or `stopping` is settled against its
 * node as the start-up reconcile settles it (a create rolled back, a delete finished, a pause or
 * resume driven to `running`); on a node this replica does not reach, a create or delete is
 * finished in the store alone (the node destroys the sandbox, row-less, when its session opens
 * or it starts again) and a pause or resume becomes `failed` (deletable). Its reservations
 * without a row are given back (once, whichever replica gets there first), and its pending
 * idempotency keys settled as the start-up reconcile settles them. `onSettled` is told
 * of each row it settled, as read, and where to (the caller's node allocation: a deleted or lost
 * row's share goes back). Only the rows still tagged with that replica and still in their state
 * are moved: a live replica's work is never touched.
 */
export async function reconcileGoneReplica(
  d: ReconcileDeps,
  replica: string,
  onSettled: (row: SandboxTable, to: string) => void = () => undefined,
): Promise<GoneReplicaReport> {
  const rows = await d.store.inFlightRowsOf(replica);
  const report = emptyReport();
  const names = new Set(rows.map((r) => r.node));
  const views = await nodeViews(
    d.nodes.all().filter((n) => names.has(n.name) && n.state === 'ready'),
    report,
    d.log,
  );
  await settleRows(d, rows, views, report);
  for (const row of rows) {
    if (views.has(row.node)) continue;
    if (row.state === 'creating' || row.state === 'stopping') {
      if (await d.store.deleteSandbox(row, true)) {
        report.settled.push({ id: row.id, from: row.state, to: 'deleted' });
        raiseSettled(d, row, 'deleted');
      }
    } else {
      await failRow(d, row, report);
    }
  }
  const byId = new Map(rows.map((r) => [r.id, r]));
  for (const s of report.settled) onSettled(byId.get(s.id)!, s.to);
  const released = await d.store.releaseReplicaReservations(replica);
  await settleKeys(d, report, new Date().toISOString(), replica);
  return {
    settled: report.settled,
    released,
    unreachable: report.unreachable,
    idempotencyKeys: report.idempotencyKeys,
    idempotencySettled: report.idempotencySettled,
  };
}

/**
 * The start of a replica beside live ones (a shared store), for the nodes it reaches from the
 * start (a `dsec up --db` platform's built-in node, which no other replica reaches): the rows on
 * them that a replica without a session on the store left in a transitional state (this node's
 * own previous life, killed) are settled against the node at once, as {@link reconcileGoneReplica}
 * settles them, and every sandbox a node runs without a row is destroyed (a row is written before
 * its sandbox is made, and the node is listed before the rows are read: no create under way is
 * taken for an orphan). Rows of live replicas, and untagged ones, are left as they are; the
 * rest of a gone replica's work (reservations, keys, rows on other nodes) is the lease pass's.
 */
export async function reconcileOwnNodes(d: ReconcileDeps): Promise<ReconcileReport> {
  const report = emptyReport();
  const views = await nodeViews(
    d.nodes.all().filter((n) => n.state === 'ready'),
    report,
    d.log,
  );
  if (views.size === 0) return report;
  const gone = new Set(await d.store.replicasWithoutSessions());
  const rows = await d.store.sandboxesOnNodes([...views.keys()]);
  const theirs = rows.filter((r) => !!r.replica && gone.has(r.replica) && IN_FLIGHT_STATES.includes(r.state));
  await settleRows(d, theirs, views, report);
  const known = new Set(rows.map((r) => r.id));
  for (const [name, view] of views) await destroyOrphans(d, name, view, known, report);
  return report;
}

/**
 * Reconciles the store with its nodes at start. Only for a store that this process alone
 * serves (SQLite, or PostgreSQL while this replica holds the replicas' lock alone:
 * PostgresListener.joinReplicas): another replica's requests under way would look like crashes here.
 */
export async function reconcileAtStart(d: ReconcileDeps): Promise<ReconcileReport> {
  const { store, nodes, log } = d;
  const report = emptyReport();
  const views = await nodeViews(nodes.all(), report, log);
  // Only the rows of nodes reached now: a row elsewhere is neither settled nor an orphan's match
  // here (its node's session-open recount does that), and a cell's store holds hundreds of thousands.
  const rows = await store.sandboxesOnNodes([...views.keys()]);
  await settleRows(d, rows, views, report);
  const known = new Set(rows.map((r) => r.id));
  for (const [name, view] of views) await destroyOrphans(d, name, view, known, report);
  // This process is the only apiserver: a key still pending belongs to a request that died with
  // the previous one (the rows are settled above).
  await settleKeys(d, report, new Date().toISOString());
  report.trajectories = await store.endOrphanTrajectories(new Date().toISOString());
  report.usage = await store.recomputeUsage();
  return report;
}

/** How long a replica with work on a shared store may show no session before its work is settled (ms). */
export const GONE_REPLICA_MS = 10_000;

/**
 * The lease pass's watch over the other replicas of a shared store: a replica that has work on
 * the store (rows it left in a transitional state, reservations without rows, pending
 * idempotency keys) and no session on
 * the database for {@link GONE_REPLICA_MS} (every session of a replica carries its tag, and its
 * listening connection stays open as long as it runs, reconnecting within a second when it
 * drops) is gone, and its work is settled ({@link reconcileGoneReplica}). The first-missing times
 * live in memory: a restarted replica waits the bound again.
 */
export class GoneReplicas {
  private readonly missing = new Map<string, number>();

  constructor(
    private readonly d: ReconcileDeps,
    /** Told of each row the settle moved, as read, and where to (the node's share of a deleted or lost one, when this replica counted it). */
    private readonly onSettled: (row: SandboxTable, to: string) => void,
    private readonly boundMs = GONE_REPLICA_MS,
  ) {}

  /** One pass; returns the replicas whose work it settled. */
  async pass(now = Date.now()): Promise<string[]> {
    const gone = new Set(await this.d.store.replicasWithoutSessions());
    for (const tag of this.missing.keys()) if (!gone.has(tag)) this.missing.delete(tag);
    const settled: string[] = [];
    for (const tag of gone) {
      const since = this.missing.get(tag);
      if (since === undefined) this.missing.set(tag, now);
      if (since === undefined || now - since < this.boundMs) continue;
      try {
        const r = await reconcileGoneReplica(this.d, tag, this.onSettled);
        this.missing.delete(tag);
        settled.push(tag);
        const parts = [
          ...r.settled.map((s) => `${s.id} ${s.from} -> ${s.to}`),
          ...r.released.map((x) => `${x.released.sandboxes} reserved without a row given back to ${x.projectId}`),
          ...(r.idempotencyKeys ? [`${r.idempotencyKeys} pending idempotency keys dropped`] : []),
          ...(r.idempotencySettled.length ? [`idempotency keys settled with their sandbox: ${r.idempotencySettled.join(', ')}`] : []),
          ...(r.unreachable.length ? [`nodes not reached: ${r.unreachable.join(', ')}`] : []),
        ];
        this.d.log(`dsec: settled the work of gone replica ${tag}: ${parts.join('; ') || 'nothing left'}`);
      } catch (err) {
        this.d.log(`dsec: settling the work of gone replica ${tag}: ${(err as Error).message}`);
      }
    }
    return settled;
  }
}
