// The `sim` backend of `npm run cell`: a node whose sandboxes are records (FakeEdge) and whose
// calls take the time the real container backend took, measured by `npm run bench` (dsec edge
// rows of docs/benchmarks.md, run of 2026-11-29 on a 2-core EPYC): the delays are timers, so
// one process can stand for many nodes. It reports the use an idle busybox sandbox measured
// (0.19 MiB charged to its cgroups, CPU asleep). A test tool only: it is reachable from the
// testing entry point (`@dsec/apiserver/testing`) alone, no configuration names it, and a
// sandbox spec cannot select it (its sandboxes are `container` ones as far as the API knows).
import { DsecError } from '@dsec/protocol';
import type {
  EdgeCallOptions,
  EdgeExecOptions,
  EdgeSandbox,
  ExecResult,
  ExecSpec,
  NodeCapacity,
  NodePauseResult,
  NodeUsageReport,
  SandboxSpec,
} from '@dsec/protocol';
import { FakeEdge, fakeLayer } from './fake-edge.js';

/** How long each call takes on the node (ms): the real container backend's p50s. */
export interface SimDelays {
  create: number;
  destroy: number;
  exec: number;
  pause: number;
  resume: number;
}

/**
 * Measured on the container backend (docs/benchmarks.md, `dsec edge` rows): create 27.4 ms
 * (create to first exec 28.29 less the exec), exec 0.92 ms, destroy 26.6 ms, pause 7.26 ms,
 * resume 2.20 ms.
 */
export const CONTAINER_DELAYS: Readonly<SimDelays> = Object.freeze({ create: 27.4, destroy: 26.6, exec: 0.92, pause: 7.26, resume: 2.2 });

/** Memory an idle busybox sandbox is charged (density bench: 0.19 MiB). */
export const SIM_IDLE_SANDBOX_BYTES = Math.round(0.19 * 1048576);

/** Options of a {@link SimEdge}. */
export interface SimEdgeOptions {
  capacity?: Partial<NodeCapacity>;
  delays?: Partial<SimDelays>;
}

const sleep = (ms: number, signal?: AbortSignal): Promise<void> =>
  new Promise((resolve, reject) => {
    if (ms <= 0) return resolve();
    const t = setTimeout(resolve, ms);
    signal?.addEventListener(
      'abort',
      () => {
        clearTimeout(t);
        reject(signal.reason as Error);
      },
      { once: true },
    );
  });

/** The sandbox as a node reports it, without the fake's own bookkeeping (files, policy). */
function plain(sb: EdgeSandbox): EdgeSandbox {
  return { id: sb.id, node: sb.node, backend: sb.backend, state: sb.state, spec: sb.spec, layers: sb.layers, createdAt: sb.createdAt };
}

/** A simulated node. */
export class SimEdge extends FakeEdge {
  readonly delays: SimDelays;
  private readonly cap: NodeCapacity;
  /** CPU its sandboxes used so far (ms), and when it was last counted. */
  private cpuMs = 0;
  private countedAt = Date.now();

  constructor(nodeName: string, o: SimEdgeOptions = {}) {
    super(nodeName);
    this.delays = { ...CONTAINER_DELAYS, ...o.delays };
    this.cap = { cpu: 64, memoryMiB: 262_144, sandboxes: 4000, backends: ['container'], ...o.capacity };
    // A layer another node built is pulled by digest (as from the cluster's registry).
    const known = this.layers.resolve.bind(this.layers);
    this.layers.resolve = async (ref, ...rest) =>
      known(ref, ...rest).catch((err: unknown) => {
        if (!/^sha256:[0-9a-f]{64}$/.test(ref)) throw err;
        const info = { ...fakeLayer(ref), digest: ref };
        this.layerInfos.set(ref, info);
        return info;
      });
  }

  override capacity(): NodeCapacity {
    return this.cap;
  }

  override async create(spec: SandboxSpec, opts: EdgeCallOptions & { id?: string } = {}): Promise<EdgeSandbox> {
    if (this.sandboxes.size >= this.cap.sandboxes) {
      throw new DsecError('CAPACITY_EXHAUSTED', `node ${this.nodeName} is full (${this.cap.sandboxes} sandboxes)`, { retryAfterMs: 1000 });
    }
    await sleep(this.delays.create, opts.signal);
    return plain(await super.create(spec, opts));
  }

  override async claim(id: string, claim: unknown, opts?: EdgeCallOptions): Promise<EdgeSandbox> {
    return plain(await super.claim(id, claim, opts));
  }

  override async list(): Promise<EdgeSandbox[]> {
    return (await super.list()).map(plain);
  }

  override async destroy(id: string, opts?: EdgeCallOptions): Promise<void> {
    if (this.sandboxes.has(id)) await sleep(this.delays.destroy);
    return super.destroy(id, opts);
  }

  override async exec(id: string, spec: ExecSpec, opts: EdgeExecOptions = {}): Promise<ExecResult> {
    await sleep(this.delays.exec, opts.signal);
    return super.exec(id, spec, opts);
  }

  override async pause(id: string, opts?: EdgeCallOptions): Promise<NodePauseResult> {
    await sleep(this.delays.pause);
    return super.pause(id, opts);
  }

  override async resume(id: string, opts?: EdgeCallOptions): Promise<NodePauseResult> {
    await sleep(this.delays.resume);
    return super.resume(id, opts);
  }

  /** Idle sandboxes: asleep (a thousandth of a core each), 0.19 MiB each. */
  override async usage(): Promise<NodeUsageReport> {
    const n = this.sandboxes.size;
    const now = Date.now();
    this.cpuMs += (now - this.countedAt) * n * 0.001;
    this.countedAt = now;
    return { cpuUsageMs: this.cpuMs, memoryBytes: n * SIM_IDLE_SANDBOX_BYTES, sandboxes: n };
  }
}
