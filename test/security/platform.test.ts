// Adversarial suite at the platform level (apiserver + edge + watcher in one process, reached
// through the SDK): a sandbox of one tenant looking for another tenant's answers, the platform's
// secrets and its API.
import assert from 'node:assert/strict';
import { rm, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { DsecClient, DsecError, Sandbox } from '@dsec/sdk';
import { startTestPlatform } from '../helpers/platform.js';
import type { TestPlatform } from '../helpers/platform.js';
import { KIT, KIT_LAYER, hex, kitLayerDir, newCanary, probe, probes } from './fixture.js';

let platform: TestPlatform | undefined;
let admin: DsecClient;
let red: DsecClient;
let blue: DsecClient;
let redKey: string;
let blueKey: string;
let layerDir: string;
/** Blue's answer: in its sandbox's env and files, and so in the platform's database. */
const blueAnswer = newCanary();
/** A file the platform keeps next to its database. */
const platformCanary = newCanary();
const sandboxes: Sandbox[] = [];

async function tenant(name: string): Promise<{ client: DsecClient; key: string }> {
  const p = await admin.projects.create({ name });
  const { key } = await admin.keys.create({ name: `${name}-member`, role: 'member', project: p.id });
  return { client: new DsecClient({ apiUrl: platform!.url, apiKey: key }), key };
}

before(async () => {
  platform = await startTestPlatform();
  admin = new DsecClient({ apiUrl: platform.url, apiKey: platform.adminKey });
  layerDir = await kitLayerDir();
  await admin.layers.uploadDir(layerDir, { kind: 'toolkit', name: KIT_LAYER });
  ({ client: red, key: redKey } = await tenant('red'));
  ({ client: blue, key: blueKey } = await tenant('blue'));
  await writeFile(path.join(platform.home, 'expected_outputs.txt'), `${platformCanary}\n`);
});

after(async () => {
  try {
    for (const s of sandboxes) await s.kill().catch(() => undefined);
    await platform?.close();
  } finally {
    if (layerDir) await rm(layerDir, { recursive: true, force: true });
  }
});

async function create(client: DsecClient, env: Record<string, string> = {}): Promise<Sandbox> {
  const s = await Sandbox.create({ image: { base: 'busybox', toolkits: [KIT_LAYER] }, env, resources: { memoryMiB: 128 } }, { client });
  sandboxes.push(s);
  return s;
}

describe('platform', () => {
  test("a tenant's sandbox finds none of the platform's secrets or another tenant's answers: API keys, the files beside the database, the other sandbox's env and files", async () => {
    const victim = await create(blue, { ANSWER: blueAnswer });
    await victim.exec(`echo ${blueAnswer} > /root/answer.txt`, { check: true });
    const attacker = await create(red);
    const secrets = [blueAnswer, platformCanary, platform!.adminKey, redKey, blueKey];
    const r = await attacker.exec([KIT, 'scan', secrets.map(hex).join(','), '/'], { timeoutMs: 120_000 });
    assert.equal(r.exitCode, 0, r.stderr);
    const scan = probe(r, 'scan');
    assert.equal(scan.hits, 0, r.stdout);
    assert.ok(Number(scan.files) > 1000, JSON.stringify(scan));
  });

  test('the API is not reachable from inside a sandbox (its loopback is its own), so a sandbox cannot forge calls to the platform', async () => {
    const attacker = await create(red);
    const port = new URL(platform!.url).port;
    const r = await attacker.exec(
      `${KIT} ports 127.0.0.1 ${port} ${port} 1000; wget -q -T 2 -O - ${platform!.url}/v1/sandboxes >/dev/null 2>&1 && echo reached || echo unreached`,
    );
    assert.deepEqual(
      probes(r).map((p) => p.result),
      ['ECONNREFUSED'],
    );
    assert.match(r.stdout, /unreached\n$/);
  });

  test("a tenant's key cannot reach another tenant's sandbox: exec, files, processes, signals and destroy answer 404 SANDBOX_NOT_FOUND", async () => {
    const victim = await create(blue, { ANSWER: blueAnswer });
    await victim.exec(`echo ${blueAnswer} > /root/answer.txt`, { check: true });
    const stolen = await Sandbox.connect(victim.id, { client: red }).catch((err: unknown) => err);
    assert.ok(stolen instanceof DsecError && stolen.code === 'SANDBOX_NOT_FOUND', String(stolen));
    const base = `${platform!.url}/v1/sandboxes/${victim.id}`;
    const attempts: Array<[string, string, string?]> = [
      ['POST', '/exec', JSON.stringify({ cmd: 'cat /root/answer.txt' })],
      ['GET', '/files?path=/root/answer.txt'],
      ['PUT', '/files?path=/root/answer.txt', 'overwritten'],
      ['GET', '/processes'],
      ['POST', '/processes/1/signal', JSON.stringify({ signal: 'SIGKILL' })],
      ['GET', '/stats'],
      ['DELETE', ''],
    ];
    for (const [method, route, body] of attempts) {
      const res = await fetch(`${base}${route}`, {
        method,
        headers: { authorization: `Bearer ${redKey}`, 'content-type': 'application/json' },
        ...(body ? { body } : {}),
      });
      const reply = (await res.json()) as { error?: { code?: string } };
      assert.equal(res.status, 404, `${method} ${route}`);
      assert.equal(reply.error?.code, 'SANDBOX_NOT_FOUND', `${method} ${route}: ${JSON.stringify(reply)}`);
    }
    const still = await victim.exec('cat /root/answer.txt');
    assert.equal(still.stdout.trim(), blueAnswer, 'the victim is untouched');
  });
});
