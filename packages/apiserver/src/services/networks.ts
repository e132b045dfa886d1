// Sandbox networks: the policy of one sandbox (replace or patch), of every sandbox of a label
// selector at once, its addresses and counters, and its egress log. Run-time deny-domain rules
// of the project stay in every policy the API sets.
import {
  DsecError,
  applyNetworkPatch,
  invalidArgument,
  MAX_NETWORK_APPLY_SANDBOXES,
  normalizeNetworkPolicy,
  NetworkPolicySchema,
  parseOrThrow,
  withDeniedNames,
  KeyedSerialQueue,
  forEachBounded,
  restrictedEntries,
  restrictedPatchEntries,
} from '@dsec/protocol';
import type { RestrictedEntry } from '@dsec/protocol';
import type { ApplyNetworkRequest, EgressLogEntry, NetworkPolicy, NetworkPolicyPatch, SandboxNetwork, ApplyNetworkResult, EdgeClient } from '@dsec/protocol';
import { requireRole } from '../auth.js';
import type { Principal } from '../auth.js';
import type { SandboxTable } from '../db/schema.js';
import { ROOT_PROJECT_ID } from '../db/store.js';
import type { StateStore } from '../db/store.js';
import { publicError } from '../errors.js';
import type { NodeRegistry } from '../nodes.js';
import type { SandboxRow, ServiceSinks } from './common.js';
import type { LifecycleService } from './lifecycle.js';

/** Sandboxes whose policy `network:apply` changes at once. */
const NETWORK_APPLY_CONCURRENCY = 8;

/** A change of a policy: a whole new one, or a patch of the current one. */
export type NetworkChange = { replace: NetworkPolicy } | { patch: NetworkPolicyPatch };

/** Names run-time deny-domain rules refuse to a project's sandboxes. */
export type DeniedNames = (projectId: string) => Promise<string[]>;

/**
 * Refuses (400, naming the entry under `field`) a policy of a tenant's sandbox that names a
 * special destination: loopback, link-local, private and other special addresses are the
 * operator's (`node.network.allowedPrivateRanges`). The root project is the operator's own.
 */
export function refuseRestricted(projectId: string, entries: readonly RestrictedEntry[], field: string): void {
  if (projectId === ROOT_PROJECT_ID) return;
  const first = entries[0];
  if (first) throw invalidArgument(`${field}.${first.path}`, first.message);
}

/** Sandbox networks. */
export class NetworkService {
  /** Network changes of one sandbox run one after another (the stored policy follows the last). */
  private readonly serial = new KeyedSerialQueue();

  constructor(
    private readonly store: StateStore,
    private readonly nodes: NodeRegistry,
    private readonly lifecycle: LifecycleService,
    private readonly sinks: ServiceSinks,
    private readonly deniedNames?: DeniedNames,
  ) {}

  /** Replaces or patches a sandbox's network policy on its node, then records it. */
  async change(p: Principal, id: string, change: NetworkChange): Promise<SandboxNetwork> {
    const { row, edge } = await this.lifecycle.route(p, id);
    return this.changeOf(row, edge, change);
  }

  private changeOf(row: SandboxTable, edge: EdgeClient, change: NetworkChange, field = 'network'): Promise<SandboxNetwork> {
    return this.serial.run(row.id, async () => {
      if ('replace' in change) refuseRestricted(row.project_id, restrictedEntries(change.replace), field);
      else refuseRestricted(row.project_id, restrictedPatchEntries(change.patch), field);
      const denied = (await this.deniedNames?.(row.project_id)) ?? [];
      // A patched policy is checked as a whole (limits on rules and names) before it is applied.
      const next =
        'replace' in change
          ? change.replace
          : parseOrThrow(NetworkPolicySchema, applyNetworkPatch((await edge.networkInfo(row.id)).policy, change.patch), 'network');
      refuseRestricted(row.project_id, restrictedEntries(next), field);
      const info = await edge.setNetwork(row.id, normalizeNetworkPolicy(denied.length === 0 ? next : withDeniedNames(next, denied)));
      const spec = JSON.parse((await this.store.sandboxOnly(row.id))?.spec ?? row.spec) as Record<string, unknown>;
      await this.store.setSandboxSpec(row.id, JSON.stringify({ ...spec, network: info.policy }));
      return info;
    });
  }

  /** A sandbox's network: policy, addresses, counters (a paused sandbox keeps its network). */
  async get(p: Principal, id: string): Promise<SandboxNetwork> {
    const { row, edge } = await this.lifecycle.route(p, id, 'viewer', { paused: 'allow' });
    return edge.networkInfo(row.id);
  }

  /** The latest `limit` egress attempts of a sandbox, oldest first. */
  async log(p: Principal, id: string, limit: number): Promise<EgressLogEntry[]> {
    const { row, edge } = await this.lifecycle.route(p, id, 'viewer', { paused: 'allow' });
    return edge.networkLog(row.id, limit);
  }

  /**
   * Replaces or patches the policy of every visible sandbox carrying the selector's labels (a
   * whole training job). Each sandbox changes atomically; one that fails keeps its old policy
   * and is reported.
   */
  async apply(p: Principal, req: ApplyNetworkRequest): Promise<ApplyNetworkResult> {
    requireRole(p, 'member');
    const labels = Object.entries(req.selector.labels);
    const rows: SandboxRow[] = [];
    let after: string | undefined;
    for (;;) {
      const page = await this.store.listSandboxes({ projectIds: [...p.visibleProjects], labels, limit: 1000, ...(after ? { after } : {}) });
      rows.push(...page);
      if (rows.length > MAX_NETWORK_APPLY_SANDBOXES) {
        throw invalidArgument('selector.labels', `matches more than ${MAX_NETWORK_APPLY_SANDBOXES} sandboxes; narrow it`);
      }
      if (page.length < 1000) break;
      after = page[page.length - 1]?.id;
    }
    const change: NetworkChange = req.policy ? { replace: req.policy } : { patch: req.patch as NetworkPolicyPatch };
    // A tenant's request naming the operator's destinations is refused as a whole, before any sandbox changes.
    if (req.policy) refuseRestricted(p.projectId, restrictedEntries(req.policy), 'policy');
    else refuseRestricted(p.projectId, restrictedPatchEntries(req.patch as NetworkPolicyPatch), 'patch');
    const result: ApplyNetworkResult = { matched: rows.length, applied: [], failed: [] };
    await forEachBounded(rows, NETWORK_APPLY_CONCURRENCY, async (row) => {
      try {
        const node = this.nodes.get(row.node);
        if (!node) throw new DsecError('UNAVAILABLE', `node ${row.node} is not reachable`);
        if (row.state !== 'running') throw new DsecError('SANDBOX_NOT_RUNNING', `sandbox ${row.id} is ${row.state}`);
        const info = await this.changeOf(row, node.client, change, req.policy ? 'policy' : 'patch');
        result.applied.push({ id: row.id, network: info.policy });
      } catch (err) {
        result.failed.push({ id: row.id, error: publicError(err, this.sinks.log) });
      }
    });
    return result;
  }
}
