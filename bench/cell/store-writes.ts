// The two store paths a cell leans on, measured alone on SQLite (a temp file, synchronous=FULL,
// as `dsec up` opens it): the lease pass over N running sandboxes (once a second in a running
// control plane) and N sandbox rows inserted as batch creates insert them (items of a batch in
// flight together). No root, no nodes: run it against two builds to compare them.
//   node bench/dist/cell/store-writes.js [--sandboxes 2000] [--batch 500] [--passes 21]
import { mkdtemp, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { performance } from 'node:perf_hooks';
import Database from 'better-sqlite3';
import { Authenticator, NodeRegistry, Placement, ROOT_PROJECT_ID, StateStore, createServices } from '@dsec/apiserver';

function arg(name: string, fallback: number): number {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 ? Number(process.argv[i + 1]) : fallback;
}

const median = (xs: number[]): number => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;

const SANDBOXES = arg('sandboxes', 2000);
const BATCH = arg('batch', 500);
const PASSES = arg('passes', 21);

const dir = await mkdtemp(path.join(os.tmpdir(), 'dsec-store-writes-'));
const store = await StateStore.openSqlite(new Database(path.join(dir, 'state.db')));
try {
  const services = createServices({ store, auth: new Authenticator(store), nodes: new NodeRegistry(), placement: new Placement() });
  // A create request as a row keeps it (about 1 KB: image, resources, env, labels, a network policy).
  const spec = JSON.stringify({
    image: { base: 'registry.example/team/python:3.12', workspace: 'ws-1234567890abcdef', toolkits: ['node-20', 'rust-1.80'] },
    resources: { cpu: 1, memoryMiB: 512, diskMiB: 2048, pids: 512 },
    env: Object.fromEntries(Array.from({ length: 12 }, (_, i) => [`VAR_${i}`, 'x'.repeat(24)])),
    network: { mode: 'allowlist', allow: Array.from({ length: 6 }, (_, i) => ({ host: `pkg${i}.example.org`, ports: [443] })) },
  });
  const lease = JSON.stringify({
    idleTimeoutMs: 86_400_000,
    maxLifetimeMs: 86_400_000,
    onIdle: 'pause',
    onOwnerLost: 'pause',
    onExpire: 'kill',
    ownerGraceMs: 60_000,
  });
  const now = new Date();
  const insertStart = performance.now();
  for (let b = 0; b < SANDBOXES; b += BATCH) {
    await Promise.all(
      Array.from({ length: Math.min(BATCH, SANDBOXES - b) }, (_, i) =>
        store.insertSandbox(
          {
            id: `n${(b + i) % 40}-${(b + i).toString(16).padStart(16, '0')}`,
            project_id: ROOT_PROJECT_ID,
            node: `n${(b + i) % 40}`,
            backend: 'container',
            state: 'running',
            spec,
            layers: '["a","b","c"]',
            cpu: 1,
            memory_mib: 512,
            created_at: now.toISOString(),
            expires_at: new Date(now.getTime() + 86_400_000).toISOString(),
            pool_id: null,
            owner_id: null,
            lease,
            last_active_at: now.toISOString(),
            paused_at: null,
            pause_reason: null,
          },
          { job: `job-${b}`, item: String(i) },
        ),
      ),
    );
  }
  const insertMs = performance.now() - insertStart;
  const passes: number[] = [];
  for (let i = 0; i < PASSES; i++) {
    const t = performance.now();
    await services.lifecycle.enforceLeases();
    passes.push(performance.now() - t);
  }
  console.log(
    JSON.stringify({
      sandboxes: SANDBOXES,
      batch: BATCH,
      insertMs: Math.round(insertMs),
      insertsPerSecond: Math.round((SANDBOXES / insertMs) * 1000),
      leasePassMedianMs: Number(median(passes).toFixed(2)),
    }),
  );
  await services.poolManager.stop();
} finally {
  await store.close();
  await rm(dir, { recursive: true, force: true });
}
