// Adversarial: nothing a sandbox puts in its writable layer can block the platform. A sandbox
// swaps files for FIFOs, unix sockets and symlinks out of it (and a directory for a symlink to
// /) as fast as it can, while every reader of that layer runs against it: diff (with hashes),
// verify, snapshot, the files API (read, list, tar download) and the protected-path watch. The
// platform serves every tenant from one event loop: a host-side open that waited on a FIFO, or
// a hash that held the loop, would stall them all. Meanwhile /healthz and another tenant's
// exec must keep answering within a generous bound. DSEC_LONG=1 swaps for longer.
import assert from 'node:assert/strict';
import { rm } from 'node:fs/promises';
import { after, before, describe, test } from 'node:test';
import { DsecClient, Sandbox } from '@dsec/sdk';
import { startTestPlatform } from '../helpers/platform.js';
import type { TestPlatform } from '../helpers/platform.js';
import { KIT, KIT_LAYER, kitLayerDir, probe } from './fixture.js';

/** Seconds the sandbox swaps file types for. */
const SWAP_SECONDS = process.env.DSEC_LONG === '1' ? 240 : 25;
/** An answer slower than this is a stall (a blocked platform never answers at all). */
const LIVENESS_MS = 5_000;
const DIR = '/work';

let platform: TestPlatform | undefined;
let layerDir: string | undefined;
let admin: DsecClient;
let red: DsecClient;
let redKey: string;
let blue: DsecClient;
const sandboxes: Sandbox[] = [];
const uncaught: unknown[] = [];
const onUncaught = (err: unknown): void => {
  uncaught.push(err);
};

async function tenant(name: string): Promise<{ client: DsecClient; key: string }> {
  const p = await admin.projects.create({ name });
  const { key } = await admin.keys.create({ name: `${name}-member`, role: 'member', project: p.id });
  return { client: new DsecClient({ apiUrl: platform!.url, apiKey: key }), key };
}

before(async () => {
  process.on('uncaughtException', onUncaught);
  process.on('unhandledRejection', onUncaught);
  platform = await startTestPlatform();
  admin = new DsecClient({ apiUrl: platform.url, apiKey: platform.adminKey });
  layerDir = await kitLayerDir();
  await admin.layers.uploadDir(layerDir, { kind: 'toolkit', name: KIT_LAYER });
  ({ client: red, key: redKey } = await tenant('red'));
  ({ client: blue } = await tenant('blue'));
});

after(async () => {
  try {
    for (const s of sandboxes) await s.kill().catch(() => undefined);
    await platform?.close();
  } finally {
    if (layerDir) await rm(layerDir, { recursive: true, force: true });
    process.off('uncaughtException', onUncaught);
    process.off('unhandledRejection', onUncaught);
  }
});

/** Runs `fn` in a loop until `stop` is set; errors are expected (the files come and go) and counted. */
async function loop(stop: { done: boolean }, counts: Map<string, number>, name: string, fn: () => Promise<unknown>, pauseMs = 0): Promise<void> {
  while (!stop.done) {
    try {
      await fn();
      counts.set(name, (counts.get(name) ?? 0) + 1);
    } catch {
      counts.set(`${name} (refused)`, (counts.get(`${name} (refused)`) ?? 0) + 1);
    }
    if (pauseMs > 0) await new Promise((r) => setTimeout(r, pauseMs));
  }
}

/** Downloads DIR as a tar with a plain request; the stream may fail when the tree changes under it. */
async function downloadTar(id: string, key: string): Promise<number> {
  const res = await fetch(`${platform!.url}/v1/sandboxes/${id}/files/tar?path=${encodeURIComponent(DIR)}`, { headers: { authorization: `Bearer ${key}` } });
  const body = await res.arrayBuffer();
  if (res.status !== 200) throw new Error(`tar download: ${res.status}`);
  return body.byteLength;
}

describe('host-side reads of a writable layer', () => {
  test(`a sandbox swapping files for FIFOs, sockets and symlinks under every host-side reader never stalls the platform (${SWAP_SECONDS} s)`, async () => {
    const attacker = await Sandbox.create(
      { image: { base: 'busybox', toolkits: [KIT_LAYER] }, resources: { memoryMiB: 128, cpu: 0.5 }, protect: { watch: [DIR] } },
      { client: red },
    );
    sandboxes.push(attacker);
    const bystander = await Sandbox.create({ image: { base: 'busybox' }, resources: { memoryMiB: 64 } }, { client: blue });
    sandboxes.push(bystander);
    await attacker.exec(`mkdir -p ${DIR}`, { check: true });

    const swapper = attacker.exec([KIT, 'swap', DIR, String(SWAP_SECONDS)], { timeoutMs: (SWAP_SECONDS + 120) * 1000 });
    const stop = { done: false };
    const counts = new Map<string, number>();
    const expected = { [`${DIR}/f0`]: '0'.repeat(64), [`${DIR}/f1`]: '0'.repeat(64), [`${DIR}/d/f`]: '0'.repeat(64) };
    const readers = [
      // Short pauses: the race needs many rounds, not a saturated 2-core machine.
      loop(stop, counts, 'diff', () => attacker.diff({ paths: [DIR], hash: true }), 10),
      loop(stop, counts, 'verify', () => attacker.verify(expected), 10),
      loop(stop, counts, 'snapshot', () => attacker.snapshot(), 1000),
      loop(stop, counts, 'files.read', () => attacker.files.read(`${DIR}/f${Math.floor(Math.random() * 4)}`), 10),
      loop(stop, counts, 'files.list', () => attacker.files.list(DIR), 10),
      loop(stop, counts, 'files.tar', () => downloadTar(attacker.id, redKey), 50),
    ];

    // The bystander's exec and /healthz, one after the other, each timed.
    let slowest = { what: '', ms: 0 };
    let probes = 0;
    const started = Date.now();
    try {
      while (Date.now() - started < SWAP_SECONDS * 1000) {
        for (const [what, fn] of [
          ['healthz', async () => (await fetch(`${platform!.url}/healthz`, { signal: AbortSignal.timeout(4 * LIVENESS_MS) })).status],
          ['exec', async () => (await bystander.exec('echo alive', { timeoutMs: 4 * LIVENESS_MS })).stdout],
        ] as const) {
          const t0 = Date.now();
          const answer = await fn();
          const ms = Date.now() - t0;
          assert.ok(answer === 200 || answer === 'alive\n', `${what} answered ${String(answer)}`);
          assert.ok(ms < LIVENESS_MS, `${what} took ${ms} ms while the sandbox raced the host's readers (bound ${LIVENESS_MS} ms)`);
          if (ms > slowest.ms) slowest = { what, ms };
          probes++;
        }
        await new Promise((r) => setTimeout(r, 100));
      }
    } finally {
      stop.done = true;
      await Promise.all(readers);
    }
    const r = await swapper;
    const swaps = Number(probe(r, 'swap').swaps);
    assert.ok(swaps > 0, r.stdout + r.stderr);
    for (const name of ['diff', 'verify', 'snapshot', 'files.list'])
      assert.ok((counts.get(name) ?? 0) > 0, `${name} never completed: ${JSON.stringify([...counts])}`);
    assert.deepEqual(uncaught, [], 'no uncaught exception in the platform');
    console.log(
      `host-reads: ${swaps} swaps, ${probes} probes, slowest ${slowest.what} ${slowest.ms} ms, readers ${JSON.stringify(Object.fromEntries(counts))}`,
    );
  });

  test('a FIFO, a socket and a symlink are refused with a clear reason, never opened: verify, diff, files read', async () => {
    const s = await Sandbox.create({ image: { base: 'busybox', toolkits: [KIT_LAYER] }, resources: { memoryMiB: 64 } }, { client: red });
    sandboxes.push(s);
    // f1 a FIFO, f2 a unix socket, f3 a symlink to /etc/shadow (what `kit swap` makes at step 0).
    await s.exec(
      `mkdir -p ${DIR} && ${KIT} swap ${DIR} 1 >/dev/null; rm -f ${DIR}/f* && mkfifo ${DIR}/f1 && ln -s /etc/shadow ${DIR}/f3 && echo regular > ${DIR}/f0`,
      {
        check: true,
      },
    );
    const sha = '0'.repeat(64);
    const v = await s.verify({ [`${DIR}/f1`]: sha, [`${DIR}/f3`]: sha, [`${DIR}/f0`]: sha });
    const reasons = Object.fromEntries(v.results.map((x) => [x.path, x.reason]));
    assert.deepEqual(reasons, { [`${DIR}/f1`]: 'not-a-file', [`${DIR}/f3`]: 'symlink-in-path', [`${DIR}/f0`]: 'mismatch' });
    const d = await s.diff({ paths: [DIR], hash: true });
    const fifo = d.entries.find((e) => e.path === `${DIR}/f1`);
    assert.equal(fifo?.type, 'other');
    assert.equal(fifo?.sha256, undefined);
    assert.ok(d.entries.find((e) => e.path === `${DIR}/f0`)?.sha256, 'the regular file is hashed');
    const t0 = Date.now();
    await assert.rejects(s.files.read(`${DIR}/f1`));
    assert.ok(Date.now() - t0 < LIVENESS_MS, 'reading a FIFO is refused at once');
  });
});
