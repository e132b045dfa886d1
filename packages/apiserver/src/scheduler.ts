// Placement: filter nodes by health, backend and free capacity (with over-commit), sample k of
// them and take the least loaded ("power of k choices"). The edge has the last word: it may
// still refuse, and the caller then tries another node.
import { randomInt } from 'node:crypto';
import type { BackendKind } from '@dsec/protocol';

/** Default CPU over-commit: DSec found ~90% of sandboxes use <= 5% of the CPU they request. */
export const DEFAULT_CPU_OVERCOMMIT = 8;
/** Default memory over-commit. */
export const DEFAULT_MEMORY_OVERCOMMIT = 1.5;
/** Share of its requested CPU a best-effort sandbox counts against a node. */
export const BEST_EFFORT_CPU_FACTOR = 0.1;
/** Nodes sampled per placement. */
export const DEFAULT_SAMPLE_K = 2;

/** Capacity and use of a node as the scheduler sees it. */
export interface NodeView {
  name: string;
  healthy: boolean;
  /** Placement skips a cordoned node (cordon, drain). */
  cordoned?: boolean;
  backends: readonly BackendKind[];
  /** The accelerator of the node's microVMs (its boot probe); `microvm` placement prefers `kvm`. */
  microvmAccel?: 'kvm' | 'tcg' | undefined;
  capacity: { cpu: number; memoryMiB: number; sandboxes: number };
  allocated: { cpu: number; memoryMiB: number; sandboxes: number };
}

/** What one sandbox asks of a node. */
export interface PlacementRequest {
  backend: BackendKind;
  cpu: number;
  memoryMiB: number;
  cpuClass: 'latency-sensitive' | 'best-effort';
}

/** Options of {@link Placement}. */
export interface PlacementOptions {
  cpuOvercommit?: number;
  memoryOvercommit?: number;
  sampleK?: number;
}

/** The scheduler's placement policy. */
export class Placement {
  readonly cpuOvercommit: number;
  readonly memoryOvercommit: number;
  readonly sampleK: number;

  constructor(o: PlacementOptions = {}) {
    this.cpuOvercommit = o.cpuOvercommit ?? DEFAULT_CPU_OVERCOMMIT;
    this.memoryOvercommit = o.memoryOvercommit ?? DEFAULT_MEMORY_OVERCOMMIT;
    this.sampleK = o.sampleK ?? DEFAULT_SAMPLE_K;
  }

  /** CPU a request counts against a node (best-effort sandboxes count a fraction). */
  cpuCharge(req: Pick<PlacementRequest, 'cpu' | 'cpuClass'>): number {
    return req.cpuClass === 'best-effort' ? req.cpu * BEST_EFFORT_CPU_FACTOR : req.cpu;
  }

  /** What a node can hold after over-commit. */
  allocatable(n: NodeView): { cpu: number; memoryMiB: number } {
    return { cpu: n.capacity.cpu * this.cpuOvercommit, memoryMiB: n.capacity.memoryMiB * this.memoryOvercommit };
  }

  /** True when the node is healthy, has the backend, and has room for the request. */
  fits(n: NodeView, req: PlacementRequest): boolean {
    const a = this.allocatable(n);
    return (
      n.healthy &&
      !n.cordoned &&
      n.backends.includes(req.backend) &&
      n.allocated.sandboxes + 1 <= n.capacity.sandboxes &&
      n.allocated.cpu + this.cpuCharge(req) <= a.cpu &&
      n.allocated.memoryMiB + req.memoryMiB <= a.memoryMiB
    );
  }

  /** Load of a node in [0, 1+]: the fullest of its dimensions. */
  load(n: NodeView): number {
    const a = this.allocatable(n);
    return Math.max(n.allocated.cpu / a.cpu, n.allocated.memoryMiB / a.memoryMiB, n.allocated.sandboxes / n.capacity.sandboxes);
  }

  /** Picks a node, or undefined when none fits. `exclude` names nodes that already refused. */
  place(req: PlacementRequest, nodes: readonly NodeView[], exclude: ReadonlySet<string> = new Set()): NodeView | undefined {
    let candidates = nodes.filter((n) => !exclude.has(n.name) && this.fits(n, req));
    // MicroVMs go to KVM nodes while one has room; TCG nodes (no usable KVM) take the rest.
    if (req.backend === 'microvm' && candidates.some((n) => n.microvmAccel === 'kvm')) candidates = candidates.filter((n) => n.microvmAccel === 'kvm');
    if (candidates.length <= this.sampleK) return this.leastLoaded(candidates);
    const sample: NodeView[] = [];
    const picked = new Set<number>();
    while (sample.length < this.sampleK) {
      const i = randomInt(candidates.length);
      if (picked.has(i)) continue;
      picked.add(i);
      sample.push(candidates[i]!);
    }
    return this.leastLoaded(sample);
  }

  /**
   * Places many requests in one pass (a batch): each request sees the ones placed before it.
   * Nothing is charged; the caller charges the nodes it keeps. Undefined where no node fits.
   */
  placeMany<N extends NodeView>(reqs: readonly PlacementRequest[], nodes: readonly N[]): Array<N | undefined> {
    const views = nodes.map((n) => ({ ...n, allocated: { ...n.allocated } }));
    const nodeOf = new Map<NodeView, N>(views.map((v, i) => [v, nodes[i]!]));
    return reqs.map((req) => {
      const v = this.place(req, views);
      if (!v) return undefined;
      v.allocated.cpu += this.cpuCharge(req);
      v.allocated.memoryMiB += req.memoryMiB;
      v.allocated.sandboxes += 1;
      return nodeOf.get(v);
    });
  }

  private leastLoaded(nodes: NodeView[]): NodeView | undefined {
    let best: NodeView | undefined;
    let bestLoad = Infinity;
    for (const n of nodes) {
      const l = this.load(n);
      if (l < bestLoad) {
        best = n;
        bestLoad = l;
      }
    }
    return best;
  }
}
