// Function calls: stateless runs on any healthy node (the fncall backend), one or a batch.
import { DsecError } from '@dsec/protocol';
import type { CallBatchRequest, CallBatchResult, CallRequest, CallResult, EdgeClient } from '@dsec/protocol';
import { requireRole } from '../auth.js';
import type { Principal } from '../auth.js';
import type { NodeRegistry } from '../nodes.js';
import type { TenantSlots } from '../tenant-limits.js';
import type { LayerService } from './layers.js';

/** Calls of one batch a node runs at once (the fncall runner's `BATCH_PARALLELISM`): the slots a batch takes. */
export const BATCH_SLOTS = 8;

/** Function calls. */
export class CallService {
  constructor(
    private readonly nodes: NodeRegistry,
    private readonly layers: LayerService,
    private readonly slots: TenantSlots,
  ) {}

  /** Runs one stateless call on a healthy node, in one of its tenant's call slots. */
  async run(p: Principal, req: CallRequest, signal?: AbortSignal): Promise<CallResult> {
    requireRole(p, 'member');
    const spec = await this.resolve(p, req, '');
    const node = this.node();
    return this.slots.run('call', p.tenantId, node.name, () => node.client.calls.run(spec, signal ? { signal } : {}));
  }

  /** Runs up to 1,000 calls; results come back in request order. */
  async runBatch(p: Principal, req: CallBatchRequest, signal?: AbortSignal): Promise<CallBatchResult> {
    requireRole(p, 'member');
    const resolved: CallRequest[] = [];
    for (const [i, c] of req.calls.entries()) resolved.push(await this.resolve(p, c, `calls.${i}.`));
    // A batch takes as many slots as the node runs of it at once (never more than a limit allows).
    const node = this.node();
    const reply = await this.slots.run(
      'call',
      p.tenantId,
      node.name,
      () => node.client.calls.runBatch({ calls: resolved }, signal ? { signal } : {}),
      Math.min(resolved.length, BATCH_SLOTS, this.slots.limits.callsPerTenant, this.slots.limits.callSlotsPerNode),
    );
    return { results: reply.results };
  }

  /** A call with its image's layer references resolved to digests in the caller's project. */
  private async resolve(p: Principal, spec: CallRequest, prefix: string): Promise<CallRequest> {
    if (!spec.image) return spec;
    const resolve = await this.layers.resolver(p.projectId);
    const image: NonNullable<CallRequest['image']> = { base: resolve(spec.image.base, `${prefix}image.base`) };
    if (spec.image.workspace) image.workspace = resolve(spec.image.workspace, `${prefix}image.workspace`);
    if (spec.image.toolkits?.length) image.toolkits = spec.image.toolkits.map((t, i) => resolve(t, `${prefix}image.toolkits.${i}`));
    return { ...spec, image };
  }

  /** A healthy node for a call: calls hold no state, so any node will do. */
  private node(): { name: string; client: EdgeClient } {
    const healthy = this.nodes.all().filter((n) => n.healthy);
    const n = healthy[Math.floor(Math.random() * healthy.length)];
    if (!n) throw new DsecError('CAPACITY_EXHAUSTED', 'no healthy node can run calls', { retryAfterMs: 1000 });
    return n;
  }
}
