// The nodes the control plane can place sandboxes on, each reached through an EdgeClient: the
// in-process edge, or an edge on another machine whose session came in on the node port (the
// rest of the control plane cannot tell them apart). A remote node whose session ended keeps
// its entry (state `unreachable`, then `lost`) with a client that refuses every call.
import { DsecError } from '@dsec/protocol';
import type { Accel, BackendAccel, EdgeClient, NodeCapacity, NodeState, NodeUsageReport } from '@dsec/protocol';
import type { NodeView } from './scheduler.js';

/** A node as the control plane tracks it. */
export interface NodeEntry extends NodeView {
  client: EdgeClient;
  /** False for the in-process edge. */
  remote: boolean;
  state: NodeState;
  /** When it entered its state (ms since the epoch). */
  stateSince: number;
  /** The watcher's verdict: the node answered its last list. */
  answering: boolean;
  /** Where its session comes from, its wire version and when it joined (remote nodes). */
  address: string | null;
  version: number | null;
  joinedAt: string | null;
  /** When its session last carried a frame (ms since the epoch; remote nodes). */
  lastHeardAt: () => number | null;
  /** Sandboxes per spread label (`key=value`) on the node: anti-affinity. */
  spreads: Map<string, number>;
  /** The node's previous usage report and when it came (the CPU rate is taken between two). */
  lastReport?: { report: NodeUsageReport; at: number } | undefined;
}

/** One sandbox's share of its node's allocation, as {@link NodeRegistry.charge} counts it. */
export interface NodeShare {
  /** CPU charged (none while paused). */
  cpu: number;
  memoryMiB: number;
  /** Its spread label (`key=value`), if any. */
  spread?: string | undefined;
  backend?: string | undefined;
}

/** What a remote node's session brings. */
export interface NodeSessionInfo {
  address: string | null;
  version: number | null;
  joinedAt: string | null;
  cordoned: boolean;
  lastHeardAt?: () => number | null;
}

/** Registry of nodes with their allocation (requested CPU and memory of their sandboxes). */
export class NodeRegistry {
  private readonly nodes = new Map<string, NodeEntry>();
  /**
   * Per node, the `stopping` and `creating` rows its last recount counted, with the share each
   * was counted for: another process's work under way, whose share the process that finishes it
   * here gives back (a teardown, the abandoned-delete pass, the settling of a gone replica's
   * rows), or the lease pass once another replica deleted its row ({@link giveBackRecounted}).
   */
  private readonly recountedInFlight = new Map<string, Map<string, NodeShare>>();

  /** Adds the in-process node. */
  add(client: EdgeClient): NodeEntry {
    const entry = this.entry(client, false);
    this.nodes.set(entry.name, entry);
    return entry;
  }

  /**
   * A remote node's session is up: its entry (new, or the one it left) now reaches it through
   * `client`. The allocation is kept; the caller recounts it from the store.
   */
  attach(client: EdgeClient, info: NodeSessionInfo): NodeEntry {
    const before = this.nodes.get(client.nodeName);
    const entry = this.entry(client, true);
    if (before) {
      entry.allocated = before.allocated;
      entry.microvmMemoryMiB = before.microvmMemoryMiB;
      entry.spreads = before.spreads;
      entry.labelCount = (l) => entry.spreads.get(l) ?? 0;
    }
    entry.address = info.address;
    entry.version = info.version;
    entry.joinedAt = info.joinedAt;
    entry.cordoned = info.cordoned;
    if (info.lastHeardAt) entry.lastHeardAt = info.lastHeardAt;
    this.nodes.set(entry.name, entry);
    return entry;
  }

  /**
   * A remote node's session `client` ended: the node is `unreachable` and every call on it is
   * refused with UNAVAILABLE. Nothing happens when a newer session replaced that one.
   */
  detach(name: string, client: EdgeClient): NodeEntry | undefined {
    const n = this.nodes.get(name);
    if (!n || n.client !== client) return undefined;
    n.client = unreachableEdge(name, client.capacity());
    this.setState(n, 'unreachable');
    return n;
  }

  /** Marks a node lost (after its grace). */
  markLost(name: string): NodeEntry | undefined {
    const n = this.nodes.get(name);
    if (!n || n.state !== 'unreachable') return undefined;
    this.setState(n, 'lost');
    return n;
  }

  /** Forgets a node (removed from the cluster). */
  remove(name: string): void {
    this.nodes.delete(name);
  }

  /** Every node. */
  all(): NodeEntry[] {
    return [...this.nodes.values()];
  }

  /** A node by name. */
  get(name: string): NodeEntry | undefined {
    return this.nodes.get(name);
  }

  /**
   * Adds (or with a negative sign removes) one sandbox's requests to a node's allocation, and
   * its spread label (anti-affinity) to the node's counts. A microVM's memory is also counted
   * apart (placement counts it at full size).
   */
  charge(name: string, cpu: number, memoryMiB: number, sign: 1 | -1, spread?: string, backend?: string): void {
    const n = this.nodes.get(name);
    if (!n) return;
    if (backend === 'microvm' || backend === 'vm') n.microvmMemoryMiB = Math.max(0, (n.microvmMemoryMiB ?? 0) + sign * memoryMiB);
    if (spread !== undefined) {
      const c = Math.max(0, (n.spreads.get(spread) ?? 0) + sign);
      if (c === 0) n.spreads.delete(spread);
      else n.spreads.set(spread, c);
    }
    n.allocated.cpu = Math.max(0, n.allocated.cpu + sign * cpu);
    n.allocated.memoryMiB = Math.max(0, n.allocated.memoryMiB + sign * memoryMiB);
    n.allocated.sandboxes = Math.max(0, n.allocated.sandboxes + sign);
  }

  /** {@link charge} of one sandbox's share. */
  chargeShare(name: string, share: NodeShare, sign: 1 | -1): void {
    this.charge(name, share.cpu, share.memoryMiB, sign, share.spread, share.backend);
  }

  /**
   * Whether the node's last recount counted the `stopping` or `creating` row `id` (forgotten
   * here): a teardown or settle that would not give its share back otherwise (a `lost` row's, an
   * abandoned one's, a gone replica's) gives it back when this says so.
   */
  takeRecounted(name: string, id: string): boolean {
    return this.takeShare(name, id) !== undefined;
  }

  /** The recounted `stopping` and `creating` rows, by node (see {@link takeRecounted}). */
  recounted(): Array<{ node: string; id: string }> {
    return [...this.recountedInFlight].flatMap(([node, ids]) => [...ids.keys()].map((id) => ({ node, id })));
  }

  /**
   * Gives back the share the node's last recount counted for row `id` (forgotten here), when it
   * still holds it: the row's work ended in a settle or the abandoned-delete pass here, or went
   * without this process seeing it go (another replica deleted it). False when it was not
   * counted, or was taken meanwhile.
   */
  giveBackRecounted(name: string, id: string): boolean {
    const share = this.takeShare(name, id);
    if (!share) return false;
    this.chargeShare(name, share, -1);
    return true;
  }

  private takeShare(name: string, id: string): NodeShare | undefined {
    const shares = this.recountedInFlight.get(name);
    const share = shares?.get(id);
    if (!shares || !share) return undefined;
    shares.delete(id);
    if (shares.size === 0) this.recountedInFlight.delete(name);
    return share;
  }

  /**
   * Forgets that the node's last recount counted row `id`: its create finished (it holds the
   * node as any sandbox does now, and is given back as one) or it was marked lost (which gave its
   * share back): a later teardown must not give it back a second time.
   */
  forgetRecounted(name: string, id: string): void {
    this.takeRecounted(name, id);
  }

  /** Records that a recount at start charged the node for the `stopping` and `creating` rows `shares` (by id; see {@link takeRecounted}). */
  markRecounted(name: string, shares: ReadonlyMap<string, NodeShare>): void {
    if (shares.size > 0) this.recountedInFlight.set(name, new Map(shares));
    else this.recountedInFlight.delete(name);
  }

  /**
   * Adds (or removes) CPU alone: a paused sandbox gives its CPU back to the node and keeps its
   * memory and its place in the sandbox count.
   */
  chargeCpu(name: string, cpu: number, sign: 1 | -1): void {
    const n = this.nodes.get(name);
    if (n) n.allocated.cpu = Math.max(0, n.allocated.cpu + sign * cpu);
  }

  /**
   * Sets a node's allocation (and spread counts) outright (recounted from the store when its
   * session opens, or at start); `inFlight` names the `stopping` and `creating` rows counted in
   * it, with the share each was counted for.
   */
  setAllocated(
    name: string,
    allocated: NodeView['allocated'],
    spreads?: ReadonlyMap<string, number>,
    microvmMemoryMiB?: number,
    inFlight?: ReadonlyMap<string, NodeShare>,
  ): void {
    const n = this.nodes.get(name);
    if (!n) return;
    if (inFlight) this.markRecounted(name, inFlight);
    n.allocated = { ...allocated };
    if (microvmMemoryMiB !== undefined) n.microvmMemoryMiB = microvmMemoryMiB;
    if (spreads) {
      n.spreads.clear();
      for (const [k, v] of spreads) n.spreads.set(k, v);
    }
  }

  /**
   * Records a node's usage report (`at`: when it came, ms): the measured use placement judges
   * room by. The CPU is the rate since the previous report; the first report sets memory alone.
   */
  setUsage(name: string, report: NodeUsageReport, at = Date.now()): void {
    const n = this.nodes.get(name);
    if (!n) return;
    const prev = n.lastReport;
    const dt = prev ? at - prev.at : 0;
    const cpu = prev && dt > 0 && report.cpuUsageMs >= prev.report.cpuUsageMs ? (report.cpuUsageMs - prev.report.cpuUsageMs) / dt : (n.usage?.cpu ?? 0);
    n.usage = { cpu, memoryMiB: report.memoryBytes / 1048576, sandboxes: report.sandboxes };
    n.lastReport = { report, at };
  }

  /** Marks a node answering or not (the watcher's verdict). */
  setHealthy(name: string, healthy: boolean): void {
    const n = this.nodes.get(name);
    if (!n) return;
    n.answering = healthy;
    n.healthy = n.state === 'ready' && healthy;
  }

  /** Cordons (placement skips it) or uncordons a node. */
  setCordoned(name: string, cordoned: boolean): void {
    const n = this.nodes.get(name);
    if (n) n.cordoned = cordoned;
  }

  private setState(n: NodeEntry, state: NodeState): void {
    n.state = state;
    n.stateSince = Date.now();
    n.healthy = state === 'ready' && n.answering;
  }

  private entry(client: EdgeClient, remote: boolean): NodeEntry {
    const cap = client.capacity();
    const spreads = new Map<string, number>();
    return {
      spreads,
      labelCount: (l: string) => spreads.get(l) ?? 0,
      name: client.nodeName,
      healthy: true,
      cordoned: false,
      backends: cap.backends,
      accel: backendAccel(cap),
      capacity: { cpu: cap.cpu, memoryMiB: cap.memoryMiB, sandboxes: cap.sandboxes },
      allocated: { cpu: 0, memoryMiB: 0, sandboxes: 0 },
      client,
      remote,
      state: 'ready',
      stateSince: Date.now(),
      answering: true,
      address: null,
      version: null,
      joinedAt: null,
      lastHeardAt: () => null,
    };
  }
}

/** The accelerator of each virtual-machine backend a node reports in its capacity (absent: none). */
export function backendAccel(cap: NodeCapacity): BackendAccel | undefined {
  if (!cap.microvm && !cap.vm) return undefined;
  return { ...(cap.microvm ? { microvm: cap.microvm.accel } : {}), ...(cap.vm ? { vm: cap.vm.accel } : {}) };
}

/** A node's accelerators as the API shows them: `accel`, and `microvmAccel` (`accel.microvm`) for clients that read that. */
export function accelFields(n: Pick<NodeView, 'accel'>): { accel?: BackendAccel; microvmAccel?: Accel } {
  if (!n.accel) return {};
  return { accel: { ...n.accel }, ...(n.accel.microvm ? { microvmAccel: n.accel.microvm } : {}) };
}

/** An EdgeClient of a node whose session is down: every call is UNAVAILABLE, no events. */
export function unreachableEdge(name: string, cap: NodeCapacity): EdgeClient {
  const refuse = (): Promise<never> => Promise.reject(new DsecError('UNAVAILABLE', `node ${name} is unreachable`, { node: name }));
  const base = { nodeName: name, capacity: () => cap, onEvent: () => () => undefined };
  const refusing = (target: object): object =>
    new Proxy(target, {
      get: (t, prop) => (prop in t ? (t as Record<string | symbol, unknown>)[prop] : prop === 'then' ? undefined : refuse),
    });
  return refusing({ ...base, layers: refusing({}), calls: refusing({}) }) as EdgeClient;
}
