// Placement: filter nodes by health, backend and room, sample k of them and take the least
// loaded ("power of k choices"). The edge has the last word: it may still refuse, and the caller
// then tries another node.
//
// Room is judged on what the node's sandboxes use, measured, rather than on what they request
// (DSec: ~90% of sandboxes use <= 5% of the CPU they request). A node has room while
//   - its measured use, plus an idle estimate for the sandboxes placed since it was measured,
//     plus an idle estimate for the new one, stays under a target share of the node: CPU (for a
//     latency-sensitive sandbox only: a best-effort one runs at the lowest weight and takes only
//     cycles nobody else wants) and memory;
//   - the requests stay under a wide over-commit bound (the blast radius if all wake at once);
//   - the sandbox count stays under the node's own limit, and the sandbox asks for no more than
//     the whole node has.
// A busy node (measured CPU or memory past the target) takes nothing more that could compete
// with its running sandboxes, which keep their CPU through their weights (latency-sensitive
// weight = 1024 x cores, best-effort 2 and SCHED_IDLE: the classes never share a weight band).
// MicroVMs are the exception to measured use: a guest never hands back memory it touched (no
// balloon), so a microVM's use climbs to its size and stays. Their memory counts at full size,
// with no idle discount and no over-commit: their requests together stay under the memory target,
// and they are a floor under the node's expected use.
// Anti-affinity: a request may name a label its job shares; placement prefers the nodes holding
// the fewest sandboxes with that label, then the least loaded.
import { randomInt } from 'node:crypto';
import type { Accel, BackendAccel, BackendKind } from '@dsec/protocol';

/**
 * Default bound of CPU requests per CPU of a node. Wide: requests are not what fills a node,
 * measured use is; this bounds the harm if every sandbox wakes at once (a 2-core node: 512 cores
 * of requests, 512 default sandboxes).
 */
export const DEFAULT_CPU_OVERCOMMIT = 256;
/** Default bound of memory requests per byte of a node (a 24 GiB node: 288 GiB, 576 default sandboxes). */
export const DEFAULT_MEMORY_OVERCOMMIT = 12;
/** Share of its requested CPU a best-effort sandbox counts against the request bound. */
export const BEST_EFFORT_CPU_FACTOR = 0.1;
/** Nodes sampled per placement. */
export const DEFAULT_SAMPLE_K = 2;
/** Share of a node's CPUs that measured use may reach before latency-sensitive placement stops. */
export const DEFAULT_CPU_TARGET = 0.8;
/** Share of a node's memory that measured use may reach before placement stops. */
export const DEFAULT_MEMORY_TARGET = 0.8;
/** CPU an idle sandbox is expected to use, as a share of its request (before it is measured). */
export const DEFAULT_IDLE_CPU_SHARE = 0.002;
/** Memory an idle sandbox is expected to use, as a share of its limit (before it is measured). */
export const DEFAULT_IDLE_MEMORY_SHARE = 1 / 16;

/**
 * Anti-affinity: a sandbox labelled `dsec.spread-by: <key>` is spread over the nodes by the value
 * of its label `<key>` (`job: j1` and `dsec.spread-by: job`: the sandboxes of job j1 go to the
 * nodes holding the fewest of them).
 */
export const SPREAD_BY_LABEL = 'dsec.spread-by';

/** The label (`key=value`) a sandbox is spread by, or undefined. */
export function spreadOf(labels: Readonly<Record<string, string>> | undefined): string | undefined {
  const key = labels?.[SPREAD_BY_LABEL];
  const value = key === undefined ? undefined : labels?.[key];
  return key === undefined || value === undefined ? undefined : `${key}=${value}`;
}

/** What a node's sandboxes use, measured by the node (all of them together). */
export interface NodeUsage {
  /** CPU cores busy (a rate over the last measuring interval). */
  cpu: number;
  memoryMiB: number;
  /** Sandboxes the node held when it measured. */
  sandboxes: number;
}

/** Capacity and use of a node as the scheduler sees it. */
export interface NodeView {
  name: string;
  healthy: boolean;
  /** Placement skips a cordoned node (cordon, drain). */
  cordoned?: boolean;
  backends: readonly BackendKind[];
  /** The accelerator of each virtual-machine backend of the node (its boot probe); their placement prefers `kvm`. */
  accel?: BackendAccel | undefined;
  capacity: { cpu: number; memoryMiB: number; sandboxes: number };
  allocated: { cpu: number; memoryMiB: number; sandboxes: number };
  /** Latest measured use; absent until the node is measured (every sandbox then counts its idle estimate). */
  usage?: NodeUsage | undefined;
  /** Memory the node's microVMs request (counted at full size: a guest keeps what it touched). */
  microvmMemoryMiB?: number | undefined;
  /** Sandboxes on the node carrying a label (`key=value`): anti-affinity. */
  labelCount?: ((label: string) => number) | undefined;
}

/** What one sandbox asks of a node. */
export interface PlacementRequest {
  backend: BackendKind;
  cpu: number;
  memoryMiB: number;
  cpuClass: 'latency-sensitive' | 'best-effort';
  /** A label (`key=value`) the request's job shares: nodes with fewer such sandboxes come first. */
  spread?: string | undefined;
}

/** Options of {@link Placement}. */
export interface PlacementOptions {
  cpuOvercommit?: number;
  memoryOvercommit?: number;
  sampleK?: number;
  cpuTarget?: number;
  memoryTarget?: number;
  idleCpuShare?: number;
  idleMemoryShare?: number;
}

/** The scheduler's placement policy. */
export class Placement {
  readonly cpuOvercommit: number;
  readonly memoryOvercommit: number;
  readonly sampleK: number;
  readonly cpuTarget: number;
  readonly memoryTarget: number;
  readonly idleCpuShare: number;
  readonly idleMemoryShare: number;

  constructor(o: PlacementOptions = {}) {
    this.cpuOvercommit = o.cpuOvercommit ?? DEFAULT_CPU_OVERCOMMIT;
    this.memoryOvercommit = o.memoryOvercommit ?? DEFAULT_MEMORY_OVERCOMMIT;
    this.sampleK = o.sampleK ?? DEFAULT_SAMPLE_K;
    this.cpuTarget = o.cpuTarget ?? DEFAULT_CPU_TARGET;
    this.memoryTarget = o.memoryTarget ?? DEFAULT_MEMORY_TARGET;
    this.idleCpuShare = o.idleCpuShare ?? DEFAULT_IDLE_CPU_SHARE;
    this.idleMemoryShare = o.idleMemoryShare ?? DEFAULT_IDLE_MEMORY_SHARE;
  }

  /** CPU a request counts against a node (best-effort sandboxes count a fraction). */
  cpuCharge(req: Pick<PlacementRequest, 'cpu' | 'cpuClass'>): number {
    return req.cpuClass === 'best-effort' ? req.cpu * BEST_EFFORT_CPU_FACTOR : req.cpu;
  }

  /**
   * What the node's sandboxes are taken to use: the measured use plus the idle estimate of the
   * sandboxes placed since the measure (at their average request); memory never less than what
   * its microVMs request.
   */
  expected(n: NodeView): { cpu: number; memoryMiB: number } {
    const u = n.usage;
    const unmeasured = Math.max(0, n.allocated.sandboxes - (u?.sandboxes ?? 0));
    const per = n.allocated.sandboxes > 0 ? unmeasured / n.allocated.sandboxes : 0;
    return {
      cpu: (u?.cpu ?? 0) + n.allocated.cpu * per * this.idleCpuShare,
      memoryMiB: Math.max((u?.memoryMiB ?? 0) + n.allocated.memoryMiB * per * this.idleMemoryShare, n.microvmMemoryMiB ?? 0),
    };
  }

  /** What a node can hold after over-commit. */
  allocatable(n: NodeView): { cpu: number; memoryMiB: number } {
    return { cpu: n.capacity.cpu * this.cpuOvercommit, memoryMiB: n.capacity.memoryMiB * this.memoryOvercommit };
  }

  /** True when the node is healthy, has the backend, and has room for the request. */
  fits(n: NodeView, req: PlacementRequest): boolean {
    const a = this.allocatable(n);
    if (!n.healthy || n.cordoned || !n.backends.includes(req.backend)) return false;
    if (n.allocated.sandboxes + 1 > n.capacity.sandboxes) return false;
    // One sandbox never asks for more than the whole node has: it could never get it.
    if (req.cpu > n.capacity.cpu || req.memoryMiB > n.capacity.memoryMiB) return false;
    if (n.allocated.cpu + this.cpuCharge(req) > a.cpu || n.allocated.memoryMiB + req.memoryMiB > a.memoryMiB) return false;
    const e = this.expected(n);
    const memoryTarget = n.capacity.memoryMiB * this.memoryTarget;
    if (req.backend === 'microvm' || req.backend === 'vm') {
      // A microVM's memory, all of it, with the microVMs already there: never over-committed.
      if ((n.microvmMemoryMiB ?? 0) + req.memoryMiB > memoryTarget || e.memoryMiB + req.memoryMiB > memoryTarget) return false;
    } else if (e.memoryMiB + req.memoryMiB * this.idleMemoryShare > memoryTarget) return false;
    // A best-effort sandbox takes only the cycles nobody else wants: a busy node still takes it.
    if (req.cpuClass === 'best-effort') return true;
    return e.cpu + req.cpu * this.idleCpuShare <= n.capacity.cpu * this.cpuTarget;
  }

  /** Load of a node in [0, 1+]: the fullest of its dimensions, measured or requested. */
  load(n: NodeView): number {
    const a = this.allocatable(n);
    const e = this.expected(n);
    return Math.max(
      e.cpu / (n.capacity.cpu * this.cpuTarget),
      e.memoryMiB / (n.capacity.memoryMiB * this.memoryTarget),
      n.allocated.cpu / a.cpu,
      n.allocated.memoryMiB / a.memoryMiB,
      n.allocated.sandboxes / n.capacity.sandboxes,
    );
  }

  /** Picks a node, or undefined when none fits. `exclude` names nodes that already refused. */
  place<V extends NodeView>(req: PlacementRequest, nodes: readonly V[], exclude: ReadonlySet<string> = new Set()): V | undefined {
    let candidates = nodes.filter((n) => !exclude.has(n.name) && this.fits(n, req));
    // Virtual machines (microvm, vm) go to nodes that run their backend under KVM while one has
    // room; nodes without usable KVM (TCG) take the rest.
    if (candidates.some((n) => accelFor(n, req.backend) === 'kvm')) candidates = candidates.filter((n) => accelFor(n, req.backend) === 'kvm');
    const spread = req.spread;
    if (spread !== undefined && candidates.length > 1) {
      // Anti-affinity: only the nodes holding the fewest sandboxes of the job compete.
      const counts = candidates.map((n) => n.labelCount?.(spread) ?? 0);
      const fewest = Math.min(...counts);
      candidates = candidates.filter((_, i) => counts[i] === fewest);
    }
    if (candidates.length <= this.sampleK) return this.leastLoaded(candidates);
    const sample: V[] = [];
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
    const views = nodes.map((n) => {
      // Each request sees the ones placed before it, labels included.
      const placed = new Map<string, number>();
      const base = n.labelCount;
      return { ...n, allocated: { ...n.allocated }, placed, labelCount: (l: string) => (base?.(l) ?? 0) + (placed.get(l) ?? 0) };
    });
    const nodeOf = new Map(views.map((v, i) => [v, nodes[i]!]));
    return reqs.map((req) => {
      const v = this.place(req, views);
      if (!v) return undefined;
      v.allocated.cpu += this.cpuCharge(req);
      v.allocated.memoryMiB += req.memoryMiB;
      v.allocated.sandboxes += 1;
      // As the registry charges it (NodeRegistry.charge): both VM backends' memory counts at full size.
      if (req.backend === 'microvm' || req.backend === 'vm') v.microvmMemoryMiB = (v.microvmMemoryMiB ?? 0) + req.memoryMiB;
      if (req.spread !== undefined) v.placed.set(req.spread, (v.placed.get(req.spread) ?? 0) + 1);
      return nodeOf.get(v);
    });
  }

  private leastLoaded<V extends NodeView>(nodes: V[]): V | undefined {
    let best: V | undefined;
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

/** The accelerator a node runs a backend's sandboxes under; undefined for a backend that is no virtual machine or that the node lacks. */
export function accelFor(n: Pick<NodeView, 'accel'>, backend: BackendKind): Accel | undefined {
  return backend === 'microvm' || backend === 'vm' ? n.accel?.[backend] : undefined;
}
