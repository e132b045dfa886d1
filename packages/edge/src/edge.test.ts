// Unit tests of the node's state machine (no root): an Edge made of a fake Backend (our own
// interface), a fake call runner and a layer store that resolves any name. Ordering of pauses,
// resumes, destroys and agent calls, claim-once, refusals and events.
import assert from 'node:assert/strict';
import { mkdtemp, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { DsecError, isDsecError } from '@dsec/protocol';
import type { BackendKind, FileStat, LayerInfo, RaisedEvent, SandboxClaim, SandboxSpec, SandboxStats } from '@dsec/protocol';
import type { Backend, BackendCreateRequest, BackendPauseResult, BackendResumeResult, BackendSandbox, PauseFacet, SandboxAgent } from './backend.js';
import type { CallRunner } from './backends/fncall/index.js';
import type { AgentProcess } from './chronus/client.js';
import { Edge, MAX_HELD_EVENTS } from './edge.js';
import { Cgroups } from './host/cgroups.js';
import { LayerStore } from './layers/index.js';
import { NodeNetwork } from './net/network.js';

/** A promise opened by hand: lets a test hold a backend or agent call until it says so. */
function gate(): { promise: Promise<void>; open: () => void } {
  let open: () => void = () => undefined;
  const promise = new Promise<void>((r) => (open = r));
  return { promise, open };
}

/** Lets every pending continuation run. */
const settle = (): Promise<void> => new Promise((r) => setImmediate(r));

const isCode =
  (code: string, field?: string) =>
  (e: unknown): boolean =>
    isDsecError(e, code as never) && (field === undefined || e.details.field === field);

function layer(ref: string): LayerInfo {
  return {
    digest: `sha256:${ref.padEnd(64, '0').slice(0, 64)}`,
    kind: 'base',
    names: [ref],
    labels: {},
    contentBytes: 0,
    metaBytes: 0,
    blobBytes: 0,
    files: 0,
    createdAt: new Date(0).toISOString(),
  };
}

/** Resolves any name but `missing` (nothing is built, mounted or read). */
class AnyLayers extends LayerStore {
  override async resolve(ref: string): Promise<LayerInfo> {
    if (ref === 'missing') throw new DsecError('LAYER_NOT_FOUND', `layer ${ref} not found`);
    return layer(ref);
  }
}

const STAT: FileStat = { name: 'f', type: 'file', mode: 0o644, size: 1, mtimeMs: 0 };

/** The in-sandbox agent: file calls log themselves and can be held by a gate. */
class FakeAgent implements SandboxAgent {
  readonly connected = true;
  /** When set, the next stat waits for it. */
  hold: Promise<void> | undefined;

  constructor(
    private readonly id: string,
    private readonly log: string[],
  ) {}

  async stat(file: string): Promise<FileStat> {
    this.log.push(`stat ${this.id} ${file}`);
    const hold = this.hold;
    this.hold = undefined;
    await hold;
    this.log.push(`stat done ${this.id}`);
    return { ...STAT, name: path.basename(file) };
  }
  async writeFile(file: string): Promise<void> {
    this.log.push(`write ${this.id} ${file}`);
  }
  async list(): Promise<AgentProcess[]> {
    return [];
  }
  close(): void {}
  ping = unused;
  spawn = unused;
  attach = unused;
  wait = unused;
  signal = unused;
  writeStdin = unused;
  resize = unused;
  release = unused;
  readFile = unused;
  listDir = unused;
  mkdir = unused;
  remove = unused;
  rename = unused;
  symlink = unused;
  statfs = unused;
}

function unused(): Promise<never> {
  return Promise.reject(new Error('not used by these tests'));
}

/** A backend of our own interface that keeps sandboxes in memory and logs what it is asked. */
class FakeBackend implements Backend {
  readonly log: string[] = [];
  readonly agents = new Map<string, FakeAgent>();
  readonly claims = new Map<string, SandboxClaim>();
  /** When set, the next pause waits for it. */
  holdPause: Promise<void> | undefined;
  /** Destroys that fail before one succeeds. */
  failDestroys = 0;
  /** Sandboxes the backend no longer has (their destroy says SANDBOX_NOT_FOUND). */
  readonly gone = new Set<string>();
  readonly pausing?: PauseFacet;
  /** A VM backend's accelerator and boot time, as the node reports them; none by default. */
  capabilities?: { accel: 'kvm' | 'tcg'; bootMs: number };

  constructor(
    readonly kind: BackendKind = 'container',
    canPause = true,
  ) {
    const memory = { usageBytes: 1 << 20, swapBytes: 0 };
    const changed = { memoryBeforeBytes: 2 << 20, memoryAfterBytes: 1 << 20, swapBytes: 0 };
    if (canPause) {
      this.pausing = {
        pause: async (id): Promise<BackendPauseResult> => {
          this.log.push(`pause ${id}`);
          const hold = this.holdPause;
          this.holdPause = undefined;
          await hold;
          this.log.push(`paused ${id}`);
          return changed;
        },
        resume: async (id): Promise<BackendResumeResult> => {
          this.log.push(`resume ${id}`);
          return changed;
        },
        memory: async () => memory,
        freeze: async (id) => void this.log.push(`freeze ${id}`),
        thaw: async (id) => void this.log.push(`thaw ${id}`),
        isFrozen: async () => false,
      };
    }
  }

  async create(req: BackendCreateRequest): Promise<BackendSandbox> {
    this.log.push(`create ${req.id}`);
    this.agents.set(req.id, new FakeAgent(req.id, this.log));
    return { id: req.id, backend: this.kind, spec: req.spec, layers: req.layers, createdAt: new Date(0).toISOString() };
  }
  async recover(): Promise<BackendSandbox[]> {
    return [];
  }
  async agent(id: string): Promise<SandboxAgent> {
    const agent = this.agents.get(id);
    if (!agent) throw new DsecError('SANDBOX_NOT_FOUND', `no agent for ${id}`);
    return agent;
  }
  connectAgent(id: string): Promise<SandboxAgent> {
    return this.agent(id);
  }
  async claim(id: string, claim: SandboxClaim): Promise<void> {
    this.log.push(`claim ${id}`);
    this.claims.set(id, claim);
  }
  async destroy(id: string): Promise<void> {
    this.log.push(`destroy ${id}`);
    await settle();
    if (this.gone.has(id)) throw new DsecError('SANDBOX_NOT_FOUND', `no sandbox ${id}`);
    if (this.failDestroys > 0) {
      this.failDestroys--;
      throw new DsecError('BACKEND_FAILED', `destroy of ${id} failed`);
    }
    this.agents.delete(id);
  }
  async stats(): Promise<SandboxStats> {
    return { cpuUsageMs: 0, memoryBytes: 0, memoryPeakBytes: 0, memoryLimitBytes: 0, pids: 0, pidsLimit: 0, diskUsedBytes: 0, diskLimitBytes: 0, oomKills: 0 };
  }
  async close(): Promise<void> {}
}

const calls: CallRunner = {
  run: unused,
  runBatch: unused,
  close: async () => undefined,
};

const SPEC: SandboxSpec = { image: { base: 'busybox' } };

describe('Edge state machine (fake backend)', () => {
  let home: string;
  let backend: FakeBackend;
  let plain: FakeBackend;
  let edge: Edge;
  const events: RaisedEvent[] = [];

  before(async () => {
    home = await mkdtemp(path.join(os.tmpdir(), 'dsec-edge-unit-'));
    backend = new FakeBackend('container');
    plain = new FakeBackend('microvm', false);
    edge = new Edge({
      home,
      nodeName: 'unit',
      layers: new AnyLayers({ root: path.join(home, 'layers') }),
      cgroups: new Cgroups('v2', 'dsec-unit-never-touched'),
      runtimeNs: { destroy: async () => undefined },
      backends: [backend, plain],
      calls,
      network: new NodeNetwork({}, { home, nflogBinary: '/nonexistent', netlinkBinary: '/nonexistent', raise: () => undefined }),
      maxSandboxes: 6,
      kernelLog: false,
    });
    edge.onEvent((ev) => events.push(ev));
  });

  after(async () => {
    await edge.close();
    await rm(home, { recursive: true, force: true });
  });

  test('create registers a running sandbox; info, list and capacity report it', async () => {
    const sb = await edge.create(SPEC, { id: 'unit-create' });
    assert.equal(sb.state, 'running');
    assert.equal(sb.node, 'unit');
    assert.deepEqual(sb.layers, [layer('busybox').digest]);
    assert.ok((await edge.list()).some((s) => s.id === 'unit-create'));
    assert.deepEqual(edge.capacity().backends, ['container', 'microvm']);
    // A VM backend's accelerator goes into the capacity the control plane registers the node by
    // (under its kind: `microvm` here, `vm` alike); a backend without one, or absent, adds none.
    assert.equal(edge.capacity().microvm, undefined);
    plain.capabilities = { accel: 'kvm', bootMs: 700 };
    assert.deepEqual(edge.capacity().microvm, { accel: 'kvm', bootMs: 700 });
    assert.equal(edge.capacity().vm, undefined);
    delete plain.capabilities;
    assert.match(edge.newId(), /^unit-[0-9a-f]{16}$/);
    await edge.destroy(sb.id);
    assert.ok(!(await edge.list()).some((s) => s.id === 'unit-create'));
  });

  test('create refuses a backend the node lacks, a bad or taken id, a missing layer, an unknown syscall, a full node', async () => {
    backend.log.length = 0;
    plain.log.length = 0;
    await assert.rejects(edge.create({ ...SPEC, backend: 'vm' }), isCode('INVALID_ARGUMENT', 'backend'));
    await assert.rejects(edge.create(SPEC, { id: 'Bad_Id' }), isCode('INVALID_ARGUMENT', 'id'));
    await assert.rejects(edge.create({ image: { base: 'busybox', toolkits: ['ok', 'missing'] } }), isCode('LAYER_NOT_FOUND', 'image.toolkits.1'));
    await assert.rejects(edge.create({ ...SPEC, protect: { denySyscalls: ['open', 'nosuchcall'] } }), isCode('INVALID_ARGUMENT', 'protect.denySyscalls.1'));
    await assert.rejects(
      edge.create({ ...SPEC, network: { mode: 'allowlist', allow: [{ host: 'a.test' }] }, backend: 'microvm' }),
      isCode('INVALID_ARGUMENT', 'network.mode'),
    );
    const made = [];
    for (let i = 0; i < 6; i++) made.push(await edge.create(SPEC, { id: `unit-full-${i}` }));
    await assert.rejects(edge.create(SPEC, { id: 'unit-full-0' }), isCode('CONFLICT'));
    await assert.rejects(edge.create(SPEC), isCode('CAPACITY_EXHAUSTED'));
    for (const sb of made) await edge.destroy(sb.id);
    assert.equal(backend.log.filter((l) => l.startsWith('create')).length, 6, 'nothing refused reached the backend');
    assert.deepEqual(plain.log, []);
  });

  test('a pause drains calls under way; calls made during it wait, are refused while paused, and run after the resume', async () => {
    const sb = await edge.create(SPEC, { id: 'unit-drain' });
    const agent = backend.agents.get(sb.id) as FakeAgent;
    const held = gate();
    agent.hold = held.promise;
    backend.log.length = 0;
    const during = edge.stat(sb.id, '/before');
    const pause = edge.pause(sb.id, { reason: 'test' });
    const waiting = edge.stat(sb.id, '/during');
    await settle();
    assert.deepEqual(backend.log, [`stat ${sb.id} /before`], 'the pause waits for the call under way; the new call waits for the pause');
    held.open();
    await during;
    const r = await pause;
    assert.ok(r.durationMs >= 0);
    await assert.rejects(waiting, isCode('SANDBOX_NOT_RUNNING'));
    assert.deepEqual(backend.log, [`stat ${sb.id} /before`, `stat done ${sb.id}`, `pause ${sb.id}`, `paused ${sb.id}`]);
    assert.equal(edge.info(sb.id).state, 'paused');
    await assert.rejects(edge.agent(sb.id), isCode('SANDBOX_NOT_RUNNING'));
    await edge.resume(sb.id);
    assert.equal((await edge.stat(sb.id, '/after')).name, 'after');
    await edge.destroy(sb.id);
  });

  test('pause with memory "file" is 400 naming memory on a backend without it, also when the sandbox is paused already', async () => {
    const sb = await edge.create(SPEC, { id: 'unit-pause-file' });
    await assert.rejects(edge.pause(sb.id, { memory: 'file' }), isCode('INVALID_ARGUMENT', 'memory'));
    await edge.pause(sb.id);
    await assert.rejects(edge.pause(sb.id, { memory: 'file' }), isCode('INVALID_ARGUMENT', 'memory'));
    assert.equal((await edge.pause(sb.id)).durationMs, 0, 'a pause of a paused sandbox with memory kept changes nothing');
    await edge.destroy(sb.id);
  });

  test('calls made while a pause is in the backend wait for it, then find the sandbox paused', async () => {
    const sb = await edge.create(SPEC, { id: 'unit-during' });
    const held = gate();
    backend.holdPause = held.promise;
    backend.log.length = 0;
    const pause = edge.pause(sb.id);
    await settle();
    const call = edge.stat(sb.id, '/x');
    await settle();
    assert.deepEqual(backend.log, [`pause ${sb.id}`], 'nothing reaches the agent of a sandbox being frozen');
    held.open();
    await pause;
    await assert.rejects(call, isCode('SANDBOX_NOT_RUNNING'));
    await edge.destroy(sb.id);
  });

  test('an aborted signal: a pause stops draining and leaves the sandbox running; a call stops waiting for a pause; a begun pause completes', async () => {
    const sb = await edge.create(SPEC, { id: 'unit-cancel' });
    const agent = backend.agents.get(sb.id) as FakeAgent;
    const held = gate();
    agent.hold = held.promise;
    backend.log.length = 0;
    const during = edge.stat(sb.id, '/before');
    const ac = new AbortController();
    const pause = edge.pause(sb.id, { signal: ac.signal });
    await settle();
    const reason = new Error('caller went away');
    ac.abort(reason);
    await assert.rejects(pause, (e: unknown) => e === reason);
    held.open();
    await during;
    assert.equal(edge.info(sb.id).state, 'running');
    assert.ok(!backend.log.some((l) => l.startsWith('pause ')), 'nothing was frozen');
    // An already aborted call never reaches the agent.
    await assert.rejects(edge.stat(sb.id, '/x', { signal: AbortSignal.abort(reason) }), (e: unknown) => e === reason);
    assert.ok(!backend.log.includes(`stat ${sb.id} /x`));
    // A call waiting for a pause in the backend stops waiting; the pause itself completes.
    const frozen = gate();
    backend.holdPause = frozen.promise;
    const pausing = new AbortController();
    const begun = edge.pause(sb.id, { signal: pausing.signal });
    await settle();
    const waiter = new AbortController();
    const waiting = edge.readFile(sb.id, '/y', { signal: waiter.signal });
    await settle();
    waiter.abort(reason);
    pausing.abort(reason);
    await assert.rejects(waiting, (e: unknown) => e === reason);
    await assert.rejects(begun, (e: unknown) => e === reason);
    frozen.open();
    await settle();
    assert.equal(edge.info(sb.id).state, 'paused', 'the pause completed on the node');
    await edge.destroy(sb.id);
  });

  test('pausing a paused sandbox and resuming a running one change nothing; concurrent pauses pause once', async () => {
    const sb = await edge.create(SPEC, { id: 'unit-idem' });
    backend.log.length = 0;
    const noop = await edge.resume(sb.id);
    assert.equal(noop.durationMs, 0);
    const [a, b] = await Promise.all([edge.pause(sb.id), edge.pause(sb.id)]);
    assert.equal(backend.log.filter((l) => l.startsWith('pause ')).length, 1);
    assert.equal([a, b].filter((r) => r.durationMs === 0).length, 1, 'the second found it paused');
    const [c, d] = await Promise.all([edge.resume(sb.id), edge.resume(sb.id)]);
    assert.equal(backend.log.filter((l) => l.startsWith('resume ')).length, 1);
    assert.equal([c, d].filter((r) => r.durationMs === 0).length, 1);
    assert.equal(edge.info(sb.id).state, 'running');
    await edge.destroy(sb.id);
  });

  test('a backend without the pausing facet: pause, snapshot and the host-side writable layer are refused', async () => {
    const sb = await edge.create({ ...SPEC, backend: 'microvm' }, { id: 'unit-nopause' });
    await assert.rejects(edge.pause(sb.id), isCode('INVALID_ARGUMENT'));
    await assert.rejects(edge.snapshot(sb.id), isCode('INVALID_ARGUMENT'));
    assert.throws(() => edge.upperDir(sb.id), isCode('INVALID_ARGUMENT'));
    assert.equal(edge.info(sb.id).state, 'running');
    await edge.destroy(sb.id);
  });

  test('claim once: a fresh sandbox takes the claim; a claimed, used or paused one is refused', async () => {
    const fresh = await edge.create(SPEC, { id: 'unit-claim' });
    const claimed = await edge.claim(fresh.id, { env: { A: '1' }, labels: { who: 'me' } });
    assert.deepEqual(claimed.spec.labels, { who: 'me' });
    assert.deepEqual(backend.claims.get(fresh.id), { env: { A: '1' }, labels: { who: 'me' } });
    await assert.rejects(edge.claim(fresh.id, {}), isCode('CONFLICT'));

    const used = await edge.create(SPEC, { id: 'unit-used' });
    await edge.stat(used.id, '/x');
    await assert.rejects(edge.claim(used.id, {}), isCode('CONFLICT'));

    const paused = await edge.create(SPEC, { id: 'unit-paused' });
    await edge.pause(paused.id);
    await assert.rejects(edge.claim(paused.id, {}), isCode('SANDBOX_NOT_RUNNING'));
    for (const id of [fresh.id, used.id, paused.id]) await edge.destroy(id);
  });

  test('destroy waits for a pause under way; concurrent destroys share one; a failed destroy leaves it failed, and a retry ends it', async () => {
    const sb = await edge.create(SPEC, { id: 'unit-destroy' });
    const held = gate();
    backend.holdPause = held.promise;
    backend.log.length = 0;
    const pause = edge.pause(sb.id);
    await settle();
    const d1 = edge.destroy(sb.id);
    const d2 = edge.destroy(sb.id);
    await settle();
    assert.deepEqual(backend.log, [`pause ${sb.id}`], 'the destroy waits for the pause');
    held.open();
    await pause;
    await Promise.all([d1, d2]);
    assert.deepEqual(backend.log, [`pause ${sb.id}`, `paused ${sb.id}`, `destroy ${sb.id}`]);
    assert.throws(() => edge.info(sb.id), isCode('SANDBOX_NOT_FOUND'));

    const failing = await edge.create(SPEC, { id: 'unit-fail' });
    backend.failDestroys = 1;
    await assert.rejects(edge.destroy(failing.id), isCode('BACKEND_FAILED'));
    assert.equal(edge.info(failing.id).state, 'failed');
    await edge.destroy(failing.id);
    assert.throws(() => edge.info(failing.id), isCode('SANDBOX_NOT_FOUND'));
  });

  test('a sandbox its backend lost is forgotten; a destroy of one the backend no longer has still cleans up', async () => {
    const lost = await edge.create({ ...SPEC, backend: 'microvm' }, { id: 'unit-lost' });
    plain.gone.add(lost.id);
    edge.raise({ kind: 'sandbox.lost', severity: 'warning', sandboxId: lost.id, message: 'its QEMU process exited', data: { backend: 'microvm' } });
    await settle();
    assert.ok(!(await edge.list()).some((s) => s.id === lost.id), 'the lost sandbox left the node');
    await assert.rejects(async () => edge.destroy(lost.id), isCode('SANDBOX_NOT_FOUND'));
    // Gone from the backend without an event: the destroy succeeds and the entry goes.
    const gone = await edge.create({ ...SPEC, backend: 'microvm' }, { id: 'unit-gone' });
    plain.gone.add(gone.id);
    await edge.destroy(gone.id);
    assert.ok(!(await edge.list()).some((s) => s.id === gone.id));
    // Their places are free again: the node takes its full count.
    const made = [];
    for (let i = 0; i < 6; i++) made.push(await edge.create(SPEC, { id: `unit-after-lost-${i}` }));
    for (const sb of made) await edge.destroy(sb.id);
  });

  test('events carry the node and a time; a failing sink does not stop the others; unsubscribing stops delivery', async () => {
    const seen: string[] = [];
    const offBad = edge.onEvent(() => {
      throw new Error('a broken sink');
    });
    const off = edge.onEvent((ev) => seen.push(ev.kind));
    const sb = await edge.create(SPEC, { id: 'unit-events' });
    await edge.pause(sb.id, { reason: 'idle' });
    off();
    offBad();
    await edge.resume(sb.id);
    assert.deepEqual(seen, ['sandbox.paused']);
    const paused = events.find((e) => e.kind === 'sandbox.paused' && e.sandboxId === sb.id);
    assert.equal(paused?.node, 'unit');
    assert.ok(paused?.at && !Number.isNaN(Date.parse(paused.at)));
    assert.equal((paused?.data as { reason?: string } | undefined)?.reason, 'idle');
    assert.ok(events.some((e) => e.kind === 'sandbox.resumed' && e.sandboxId === sb.id));
    await edge.destroy(sb.id);
  });
});

describe('events raised while nobody subscribes', () => {
  /** A backend that recovers one sandbox whose watched paths cannot be followed (its writable layer is gone). */
  class AdoptingBackend extends FakeBackend {
    readonly writableLayer = { upperDir: (id: string): string => path.join(os.tmpdir(), 'dsec-edge-unit-no-such-dir', id, 'upper') };
    override async recover(): Promise<BackendSandbox[]> {
      const spec: SandboxSpec = { ...SPEC, protect: { watch: ['/etc'] } };
      return [{ id: 'unit-adopted', backend: this.kind, spec, layers: [], createdAt: new Date(0).toISOString() }];
    }
  }

  test('what the edge raises while it opens (adoption) reaches its first subscriber; later ones get no replay; the hold is bounded', async () => {
    const home = await mkdtemp(path.join(os.tmpdir(), 'dsec-edge-unit-'));
    const edge = new Edge({
      home,
      nodeName: 'held',
      layers: new AnyLayers({ root: path.join(home, 'layers') }),
      cgroups: new Cgroups('v2', 'dsec-unit-never-touched'),
      runtimeNs: { destroy: async () => undefined },
      backends: [new AdoptingBackend()],
      calls,
      network: new NodeNetwork({}, { home, nflogBinary: '/nonexistent', netlinkBinary: '/nonexistent', raise: () => undefined }),
      kernelLog: false,
    });
    try {
      await edge.adopt(0);
      assert.ok(
        (await edge.list()).some((s) => s.id === 'unit-adopted'),
        'the sandbox was adopted',
      );
      const first: RaisedEvent[] = [];
      const offFirst = edge.onEvent((ev) => first.push(ev));
      assert.deepEqual(
        first.map((e) => [e.kind, e.sandboxId, e.node]),
        [['protected-path.write', 'unit-adopted', 'held']],
        'the refusal raised at adoption, before anyone subscribed, is handed over on subscribing',
      );
      assert.ok(first[0]?.at && Date.parse(first[0].at) > 0, 'with the time it was raised');
      const second: string[] = [];
      const offSecond = edge.onEvent((ev) => second.push(ev.kind));
      assert.deepEqual(second, [], 'handed over once, not to every subscriber');
      offFirst();
      offSecond();

      // Nobody subscribed (a remote node between sessions): held, the newest MAX_HELD_EVENTS of them.
      for (let i = 0; i < MAX_HELD_EVENTS + 5; i++) edge.raise({ kind: 'egress.denied', severity: 'info', sandboxId: 'unit-adopted', message: `denied ${i}` });
      const next: string[] = [];
      edge.onEvent((ev) => next.push(ev.message));
      assert.equal(next.length, MAX_HELD_EVENTS);
      assert.equal(next[0], 'denied 5', 'the oldest went');
      assert.equal(next.at(-1), `denied ${MAX_HELD_EVENTS + 4}`);
    } finally {
      await edge.close();
      await rm(home, { recursive: true, force: true });
    }
  });
});
