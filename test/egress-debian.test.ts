// Egress under real work, end to end: a Debian sandbox with Node, npm, Python, curl and git
// installs a generated tree of hundreds of packages with `npm install` and runs its `npm test`,
// through the npm preset (the registry reached over the transparent TLS port, on npm's own
// keep-alive connections) and through the npm mirror (cold, then warm); the operator's CA
// (node.network.caCertificates) is what makes the registry's certificate trusted in the sandbox;
// a client that opens far more connections than its limit is slowed, not failed, and the events
// say why. The registry is local: `registry.npmjs.org` maps (node.network.hosts) to a loopback
// address of this run, served over TLS with a certificate of a CA the test makes. Nothing here
// reaches the public network, and nothing depends on the host's proxy or CA variables.
//
// The image: a Debian base (ca-certificates, git, python3, curl) built once with the project's
// Debian builder, plus a toolkit of the Node and npm that run this test; both are kept in a cache
// layer store (DSEC_TEST_CACHE, default /var/tmp/dsec-test-cache) so later runs copy them in.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { after, before, describe, test } from 'node:test';
import { ROOT_PROJECT_ID } from '@dsec/apiserver';
import { LayerStore, makeCertificateAuthority, nodeToolkitName, writeNodeToolkitTree } from '@dsec/edge';
import { NetworkConfigSchema } from '@dsec/protocol';
import type { LayerInfo, NetworkPolicy } from '@dsec/protocol';
import { DsecClient, Sandbox } from '@dsec/sdk';
import { generatePackageTree, startNpmRegistry } from './helpers/npm-registry.js';
import type { NpmRegistry } from './helpers/npm-registry.js';
import { startTestPlatform } from './helpers/platform.js';
import type { TestPlatform } from './helpers/platform.js';

const run = promisify(execFile);

/** Persistent cache of built layers (outside every test home). */
const CACHE_DIR = process.env.DSEC_TEST_CACHE ?? '/var/tmp/dsec-test-cache';
const BASE_PACKAGES = ['ca-certificates', 'git', 'python3', 'curl', 'libstdc++6'];
const BASE_NAME = `egress-debian-${createHash('sha256').update(BASE_PACKAGES.join(',')).digest('hex').slice(0, 12)}`;
const NODE_NAME = nodeToolkitName('egress-node');
/** Packages in the generated tree. */
const TREE_SIZE = 200;
/** Per-sandbox connection limit of this node (small, so that the burst meets it). */
const SANDBOX_CONNECTIONS = 32;
const INSTALL_TIMEOUT_MS = 240_000;
/** npm's home and cache inside the sandbox (empty in each new sandbox). */
const NPM_ENV = { HOME: '/root', npm_config_cache: '/root/.npm', npm_config_update_notifier: 'false' };
/** A loopback address of this run for the registry (port 443, as the transparent TLS port dials). */
const REGISTRY_ADDRESS = `127.${100 + ((randomBytes(1)[0] ?? 0) % 100)}.${randomBytes(1)[0] ?? 0}.${1 + ((randomBytes(1)[0] ?? 0) % 250)}`;

/**
 * The node lets its proxy dial the registry's private address: the operator's
 * `allowedPrivateRanges` where the configuration has it, else the policy's `allowAddresses`.
 */
const OPERATOR_RANGES = 'allowedPrivateRanges' in NetworkConfigSchema.shape;

let platform: TestPlatform;
let registry: NpmRegistry;
let client: DsecClient;
let scratch: string;
const tree = generatePackageTree(TREE_SIZE);
const sandboxes: Sandbox[] = [];

/** The layers from the cache store, built there on first use; returns their blob directories. */
async function cachedLayers(): Promise<Array<{ info: LayerInfo; name: string; blobDir: string }>> {
  const root = path.join(CACHE_DIR, 'layers');
  await mkdir(root, { recursive: true });
  const store = new LayerStore({ root, unmountLingerMs: 0 });
  await store.init();
  try {
    let base = await store.resolve(BASE_NAME).catch(() => undefined);
    base ??= await store.build({ type: 'debian', packages: BASE_PACKAGES }, { kind: 'base', name: BASE_NAME });
    let node = await store.resolve(NODE_NAME).catch(() => undefined);
    if (!node) {
      // The Node and npm running this test, as /usr/local in a toolkit layer.
      const dir = path.join(scratch, 'node-toolkit');
      await writeNodeToolkitTree(dir);
      node = await store.build({ type: 'dir', path: dir }, { kind: 'toolkit', name: NODE_NAME });
      await rm(dir, { recursive: true, force: true });
    }
    return [base, node].map((info, i) => ({
      info,
      name: i === 0 ? BASE_NAME : NODE_NAME,
      blobDir: path.join(root, 'blobs', info.digest.replace(/^sha256:/, '')),
    }));
  } finally {
    await store.close();
  }
}

/** A bare git repository with one commit, served over "dumb" HTTP by the registry under /git/. */
async function gitRepository(dir: string): Promise<void> {
  const env = { PATH: process.env.PATH ?? '/usr/bin:/bin', HOME: dir, GIT_CONFIG_NOSYSTEM: '1' };
  const src = path.join(dir, 'src');
  await mkdir(src, { recursive: true });
  await writeFile(path.join(src, 'README'), 'served through the egress proxy\n');
  const git = (args: string[], cwd: string): Promise<unknown> => run('git', ['-c', 'user.name=dsec', '-c', 'user.email=dsec@localhost', ...args], { cwd, env });
  await git(['init', '-q'], src);
  await git(['add', 'README'], src);
  await git(['commit', '-q', '-m', 'one'], src);
  await git(['clone', '-q', '--bare', src, path.join(dir, 'www', 'repo.git')], dir);
  await git(['update-server-info'], path.join(dir, 'www', 'repo.git'));
}

function policy(extra: Partial<NetworkPolicy> = {}): NetworkPolicy {
  return { mode: 'allowlist', presets: ['npm'], ...(OPERATOR_RANGES ? {} : { allowAddresses: [REGISTRY_ADDRESS] }), ...extra };
}

async function newSandbox(net: NetworkPolicy): Promise<Sandbox> {
  const sb = await Sandbox.create({ image: { base: BASE_NAME, toolkits: [NODE_NAME] }, resources: { cpu: 2, memoryMiB: 2048 }, network: net }, { client });
  sandboxes.push(sb);
  return sb;
}

async function destroy(sb: Sandbox): Promise<void> {
  await sb.kill().catch(() => undefined);
  sandboxes.splice(sandboxes.indexOf(sb), 1);
}

/** Polls until `pred` holds; fails after `ms`. */
async function waitFor(what: string, pred: () => Promise<boolean>, ms = 15_000): Promise<void> {
  const until = Date.now() + ms;
  while (!(await pred())) {
    if (Date.now() > until) assert.fail(`not within ${ms} ms: ${what}`);
    await new Promise((r) => setTimeout(r, 200));
  }
}

/** Writes the project, runs `npm install` and `npm test`; returns what the install printed. */
async function installAndTest(sb: Sandbox): Promise<void> {
  await sb.exec(['mkdir', '-p', '/work', '/root'], { check: true });
  await sb.files.write('/work/package.json', tree.packageJson);
  await sb.files.write('/work/test.js', tree.testJs);
  const install = await sb.exec(['npm', 'install', '--no-audit', '--no-fund', '--no-update-notifier', '--loglevel=warn'], {
    cwd: '/work',
    timeoutMs: INSTALL_TIMEOUT_MS,
  });
  assert.equal(install.exitCode, 0, `npm install: ${install.stderr.slice(-2000)}`);
  const t = await sb.exec(['npm', 'test', '--silent'], { cwd: '/work', env: NPM_ENV, timeoutMs: 60_000 });
  assert.equal(t.exitCode, 0, `npm test: ${t.stdout.slice(-1000)} ${t.stderr.slice(-1000)}`);
  assert.match(t.stdout, new RegExp(`all ${TREE_SIZE} packages load`));
}

/** The sandbox's open proxied connections go back to zero. */
async function connectionsSettle(sb: Sandbox): Promise<void> {
  await waitFor('open connections back at zero', async () => (await sb.network()).stats.connections === 0);
}

describe('egress under real work (Debian image, npm, operator CA)', { timeout: 900_000 }, () => {
  before(async () => {
    scratch = await mkdtemp(path.join(os.tmpdir(), 'dsec-egress-'));
    const layers = await cachedLayers();
    const ca = await makeCertificateAuthority('dsec egress test CA');
    await gitRepository(scratch);
    registry = await startNpmRegistry(tree.contents, {
      host: REGISTRY_ADDRESS,
      port: 443,
      tls: await ca.issue(['registry.npmjs.org']),
      publicUrl: 'https://registry.npmjs.org',
      staticFiles: { prefix: '/git/', dir: path.join(scratch, 'www') },
    });
    platform = await startTestPlatform(
      {
        network: {
          hosts: { 'registry.npmjs.org': REGISTRY_ADDRESS },
          nameservers: [],
          caCertificates: [ca.cert],
          proxyLimits: { maxConnections: SANDBOX_CONNECTIONS, queueTimeoutMs: 60_000 },
          ...(OPERATOR_RANGES ? { allowedPrivateRanges: [`${REGISTRY_ADDRESS}/32`] } : {}),
        },
      },
      layers.map((l) => l.blobDir),
    );
    for (const l of layers) {
      const stored = await platform.platform.edge.layers.resolve(l.info.digest);
      await platform.platform.edge.layers.tag(stored.digest, l.name);
      await platform.platform.services.layers.register(ROOT_PROJECT_ID, stored, l.name);
    }
    client = new DsecClient({ apiUrl: platform.url, apiKey: platform.adminKey });
  });

  after(async () => {
    for (const sb of [...sandboxes]) await sb.kill().catch(() => undefined);
    await platform?.close();
    await registry?.close();
    if (scratch) await rm(scratch, { recursive: true, force: true });
  });

  test("the operator's CA reaches Node, Python, curl and git in the sandbox", async () => {
    const sb = await newSandbox(policy());
    try {
      const url = 'https://registry.npmjs.org/dsec-fixture-000';
      const checks: Array<[string, string[]]> = [
        [
          'node',
          [
            'node',
            '-e',
            `require('https').get(${JSON.stringify(url)}, (r) => process.exit(r.statusCode === 200 ? 0 : 3)).on('error', (e) => { console.error(e.message); process.exit(2); })`,
          ],
        ],
        ['python', ['python3', '-c', `import urllib.request; assert urllib.request.urlopen(${JSON.stringify(url)}, timeout=20).status == 200`]],
        ['curl', ['curl', '-sSf', '-o', '/dev/null', '--max-time', '20', url]],
        ['git', ['git', 'clone', '-q', 'https://registry.npmjs.org/git/repo.git', '/tmp/repo']],
      ];
      for (const [tool, cmd] of checks) {
        const r = await sb.exec(cmd, { timeoutMs: 60_000 });
        assert.equal(r.exitCode, 0, `${tool}: ${r.stderr.slice(-1000)}`);
      }
      assert.equal((await sb.files.read('/tmp/repo/README')).toString(), 'served through the egress proxy\n');
      // The control: the same Node without the operator's CA does not trust the registry.
      const bare = await sb.exec(
        [
          'sh',
          '-c',
          `unset NODE_EXTRA_CA_CERTS; exec node -e "require('https').get('${url}', () => process.exit(0)).on('error', (e) => { console.log(e.code); process.exit(2); })"`,
        ],
        { timeoutMs: 60_000 },
      );
      assert.equal(bare.exitCode, 2, bare.stdout + bare.stderr);
      assert.match(bare.stdout, /UNABLE_TO_VERIFY_LEAF_SIGNATURE|SELF_SIGNED|UNABLE_TO_GET_ISSUER/);
    } finally {
      await destroy(sb);
    }
  });

  test(`npm install of ${TREE_SIZE} packages through the preset: few connections, none refused, back to zero`, async (t) => {
    const sb = await newSandbox(policy());
    try {
      registry.resetCounters();
      await installAndTest(sb);
      const opened = registry.connections;
      t.diagnostic(`preset install: ${opened} registry connections for ${registry.requests} requests`);
      // A tunnel per request would be >= TREE_SIZE * 2 connections; npm's keep-alive sockets are a few dozen at most.
      assert.ok(opened > 0 && opened < TREE_SIZE / 2, `registry connections for ${registry.requests} requests: ${opened}`);
      assert.deepEqual(
        (await sb.network.log({ limit: 1000 })).filter((e) => e.verdict === 'denied').map((e) => `${e.host} ${e.reason}`),
        [],
      );
      await connectionsSettle(sb);
    } finally {
      await destroy(sb);
    }
  });

  test('npm install through the npm mirror, cold then warm (the warm one never reaches the registry)', async () => {
    const cold = await newSandbox(policy({ mirrors: { npm: {} } }));
    try {
      registry.resetCounters();
      await installAndTest(cold);
      assert.ok(registry.requests >= TREE_SIZE, `the cold mirror fetched ${registry.requests} documents and tarballs`);
      await connectionsSettle(cold);
    } finally {
      await destroy(cold);
    }
    const warm = await newSandbox(policy({ mirrors: { npm: {} } }));
    try {
      registry.resetCounters();
      await installAndTest(warm);
      assert.equal(registry.requests, 0, 'everything came from the mirror cache');
      await connectionsSettle(warm);
    } finally {
      await destroy(warm);
    }
  });

  test('a client opening far more connections than its limit is slowed, not failed, and told why', async () => {
    const sb = await newSandbox(policy());
    try {
      const n = SANDBOX_CONNECTIONS * 8;
      // Each request on a connection of its own (no keep-alive), all started at once, through the
      // transparent TLS port. The name is resolved once: this is about connections, not the DNS stub.
      const script = [
        `const https = require('https');`,
        `let ok = 0, failed = [];`,
        `const one = (host) => new Promise((res) => https.get({ host, servername: 'registry.npmjs.org', headers: { host: 'registry.npmjs.org' }, path: '/dsec-fixture-001', agent: false }, (r) => { r.resume(); r.on('end', () => { if (r.statusCode === 200) ok++; else failed.push(r.statusCode); res(); }); }).on('error', (e) => { failed.push(e.code || e.message); res(); }));`,
        `require('dns').promises.lookup('registry.npmjs.org', { family: 4 }).then(({ address }) => Promise.all(Array.from({ length: ${n} }, () => one(address)))).then(() => { console.log(JSON.stringify({ ok, failed: failed.slice(0, 5) })); process.exit(failed.length ? 1 : 0); });`,
      ].join('\n');
      const r = await sb.exec(['node', '-e', script], { timeoutMs: 180_000 });
      assert.equal(r.exitCode, 0, `${r.stdout} ${r.stderr.slice(-1000)}`);
      assert.deepEqual(JSON.parse(r.stdout), { ok: n, failed: [] });
      const events = await waitForEvents(sb.id, 'egress.throttled');
      assert.equal(events[0]?.data?.limit, 'sandbox');
      assert.equal(events[0]?.data?.maxConnections, SANDBOX_CONNECTIONS);
      await connectionsSettle(sb);
    } finally {
      await destroy(sb);
    }
  });
});

/** GET /v1/events for a sandbox and kind, polled until there is one. */
async function waitForEvents(sandboxId: string, kind: string): Promise<Array<{ kind: string; data?: Record<string, unknown> }>> {
  let items: Array<{ kind: string; data?: Record<string, unknown> }> = [];
  await waitFor(`an ${kind} event`, async () => {
    const res = await fetch(`${platform.url}/v1/events?sandbox=${sandboxId}&kind=${kind}`, { headers: { authorization: `Bearer ${platform.adminKey}` } });
    assert.equal(res.status, 200);
    items = ((await res.json()) as { items: typeof items }).items;
    return items.length > 0;
  });
  return items;
}
