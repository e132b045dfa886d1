// The Debian layers of the fncall runtimes, built in the background one at a time (in the order
// asked: the node's start-up list first, a runtime a call asked for moves to the front) and kept
// in a machine-wide cache directory, so that other node homes on the machine (and the next start)
// take them in at once. A call never waits for a build: until its layer is ready it is refused
// with UNAVAILABLE naming the runtime, what is built and for how long, and a retry hint.
import { DsecError } from '@dsec/protocol';
import type { LayerInfo } from '@dsec/protocol';
import type { LayerStore } from '../../layers/index.js';
import { buildThroughCache } from '../../layers/machine-cache.js';
import { DEFAULT_DEBIAN_SUITE } from '../../layers/debian.js';
import { RUNTIME_LAYERS, runtimeLayerName } from './runtimes.js';
import type { RuntimeLayerId } from './runtimes.js';

/** Retry hint of a call refused because its runtime is still being built. */
export const RUNTIME_RETRY_AFTER_MS = 5_000;

/** Options of {@link RuntimeBuilds}. */
export interface RuntimeBuildsOptions {
  /** The node's layer store (where calls mount layers from). */
  layers: LayerStore;
  /** Machine-wide cache of built runtime layers (`<dir>/<layer name>/`); none: built into the node's store only. */
  cacheDir?: string | undefined;
  /** Debian suite of the runtimes. Default bookworm. */
  suite?: string;
  /** Progress and failures of builds. */
  log?: (line: string) => void;
}

type BuildState = { state: 'queued' } | { state: 'building'; since: number } | { state: 'failed'; error: string; at: number };

/** Background builds of the Debian runtime layers. */
export class RuntimeBuilds {
  private readonly ready = new Map<RuntimeLayerId, LayerInfo>();
  private readonly states = new Map<RuntimeLayerId, BuildState>();
  private readonly queue: RuntimeLayerId[] = [];
  private running = false;
  private closed = false;
  private readonly abort = new AbortController();
  private idle: Promise<void> = Promise.resolve();
  private readonly suite: string;

  constructor(private readonly o: RuntimeBuildsOptions) {
    this.suite = o.suite ?? DEFAULT_DEBIAN_SUITE;
  }

  /** The layer's name in the node's store and in the cache. */
  nameOf(id: RuntimeLayerId): string {
    return runtimeLayerName(RUNTIME_LAYERS[id], this.suite);
  }

  /** Notes the layers the node's store already holds. */
  async init(): Promise<void> {
    for (const id of Object.keys(RUNTIME_LAYERS) as RuntimeLayerId[]) {
      const info = await this.o.layers.resolve(this.nameOf(id)).catch(() => undefined);
      if (info) this.ready.set(id, info);
    }
  }

  /** Queues builds (in this order) of the layers not ready yet. */
  prebuild(ids: readonly RuntimeLayerId[]): void {
    for (const id of ids) this.enqueue(id, false);
  }

  /** Where a layer stands: ready, queued, building or failed. */
  status(id: RuntimeLayerId): 'ready' | BuildState['state'] | 'absent' {
    return this.ready.has(id) ? 'ready' : (this.states.get(id)?.state ?? 'absent');
  }

  /**
   * The layer when it is ready. Otherwise its build is started (or moved to the front of the
   * queue) and the call is refused at once with UNAVAILABLE.
   */
  layerFor(id: RuntimeLayerId, runtime: string): LayerInfo {
    const info = this.ready.get(id);
    if (info) return info;
    if (this.closed) throw new DsecError('UNAVAILABLE', 'the fncall backend is closed');
    const before = this.states.get(id);
    this.enqueue(id, true);
    const layer = RUNTIME_LAYERS[id];
    const what = `Debian packages ${layer.packages.join(', ')}`;
    const state = this.states.get(id);
    let how: string;
    if (state?.state === 'building') how = `is being built (${what}; ${Math.round((Date.now() - state.since) / 1000)} s so far)`;
    else how = `is queued to be built (${what}) behind ${this.queue.indexOf(id)} other runtime(s)`;
    if (before?.state === 'failed') how += `; the last build failed: ${before.error}`;
    throw new DsecError('UNAVAILABLE', `runtime ${runtime} is not ready yet: its layer ${how}; retry in a few seconds`, {
      runtime,
      retryAfterMs: RUNTIME_RETRY_AFTER_MS,
    });
  }

  private enqueue(id: RuntimeLayerId, front: boolean): void {
    if (this.closed || this.ready.has(id) || this.states.get(id)?.state === 'building') return;
    const at = this.queue.indexOf(id);
    if (at >= 0) {
      if (!front) return;
      this.queue.splice(at, 1);
    }
    if (front) this.queue.unshift(id);
    else this.queue.push(id);
    this.states.set(id, { state: 'queued' });
    if (!this.running) {
      this.running = true;
      this.idle = this.drain().finally(() => (this.running = false));
    }
  }

  private async drain(): Promise<void> {
    for (let id = this.queue.shift(); id !== undefined && !this.closed; id = this.queue.shift()) {
      const since = Date.now();
      this.states.set(id, { state: 'building', since });
      try {
        const info = await this.build(id);
        this.ready.set(id, info);
        this.states.delete(id);
        this.o.log?.(`dsec: fncall runtime layer ${id} ready (${Math.round((Date.now() - since) / 1000)} s)`);
      } catch (err) {
        if (this.closed) return;
        const error = err instanceof Error ? err.message : String(err);
        this.states.set(id, { state: 'failed', error: error.slice(0, 500), at: Date.now() });
        this.o.log?.(`dsec: building fncall runtime layer ${id} failed: ${error}`);
      }
    }
  }

  /** Takes the layer from the machine-wide cache, or builds it there (or in the node's store without a cache). */
  private async build(id: RuntimeLayerId): Promise<LayerInfo> {
    const name = this.nameOf(id);
    const source = { type: 'debian' as const, suite: this.suite, packages: [...RUNTIME_LAYERS[id].packages] };
    const signal = this.abort.signal;
    if (this.o.cacheDir === undefined) return this.o.layers.build(source, { kind: 'base', name, signal });
    return buildThroughCache(this.o.layers, this.o.cacheDir, name, (scratch) => scratch.build(source, { kind: 'base', name, signal }));
  }

  /** Stops the build in progress and drops the queue. */
  async close(): Promise<void> {
    this.closed = true;
    this.queue.length = 0;
    this.abort.abort(new DsecError('CANCELLED', 'the fncall backend is closing'));
    await this.idle.catch(() => undefined);
  }
}
