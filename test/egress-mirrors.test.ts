// The PyPI and Debian mirrors end to end: a Debian sandbox with Python and pip installs from a
// local PEP 691 index through the pypi mirror (a wheel that needs an sdist built in the sandbox),
// cold then warm (the warm install never reaches the index), and through a frozen mirror (the
// release uploaded after the cutoff is invisible and its file refused); `apt-get install` of
// generated packages from a local Debian repository through the debian mirror, the Release
// signed with a key this test makes (apt checks it in the sandbox: the mirror changes nothing).
// After each install the sandbox's proxied connections are back at zero. The repositories are
// local: the node's mirrors fetch them on loopback (node.network.mirrors.origins); nothing here
// reaches the public network.
//
// The image: a Debian base (ca-certificates, python3, python3-pip) built once with the project's
// Debian builder into the cache layer store (DSEC_TEST_CACHE, default /var/tmp/dsec-test-cache).
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { mkdir, mkdtemp, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { ROOT_PROJECT_ID } from '@dsec/apiserver';
import { buildDeb, LayerStore, makeRepoKey, startStaticRepo, writeDebianRepo, writePypiIndex } from '@dsec/edge';
import type { RepoKey, StaticRepo } from '@dsec/edge';
import type { LayerInfo, NetworkPolicy } from '@dsec/protocol';
import { DsecClient, Sandbox } from '@dsec/sdk';
import { startTestPlatform } from './helpers/platform.js';
import type { TestPlatform } from './helpers/platform.js';

const CACHE_DIR = process.env.DSEC_TEST_CACHE ?? '/var/tmp/dsec-test-cache';
const BASE_PACKAGES = ['ca-certificates', 'python3', 'python3-pip'];
const BASE_NAME = `egress-mirrors-${createHash('sha256').update(BASE_PACKAGES.join(',')).digest('hex').slice(0, 12)}`;
const SUITE = 'dsec';
const FREEZE = '2024-06-01';
/** pip inside the sandbox: system Python (PEP 668 waived), no cache, setuptools from the image for the sdist. */
const PIP = [
  'python3',
  '-m',
  'pip',
  'install',
  '--no-cache-dir',
  '--no-build-isolation',
  '--break-system-packages',
  '--root-user-action=ignore',
  '--disable-pip-version-check',
];
/** apt reading only the test's source. */
const APT_SOURCE = '/etc/apt/sources.list.d/dsec-test.list';
const APT_OPTS = ['-o', `Dir::Etc::sourcelist=${APT_SOURCE}`, '-o', 'Dir::Etc::sourceparts=-', '-o', 'APT::Get::List-Cleanup=0'];

let platform: TestPlatform;
let client: DsecClient;
let scratch: string;
let pypi: StaticRepo;
let debian: StaticRepo;
let key: RepoKey | undefined;
const sandboxes: Sandbox[] = [];

async function cachedBase(): Promise<{ info: LayerInfo; blobDir: string }> {
  const root = path.join(CACHE_DIR, 'layers');
  await mkdir(root, { recursive: true });
  const store = new LayerStore({ root, unmountLingerMs: 0 });
  await store.init();
  try {
    let info = await store.resolve(BASE_NAME).catch(() => undefined);
    if (!info) {
      console.log(`building the test's Debian base (${BASE_PACKAGES.join(', ')}) into ${root}: minutes, once`);
      info = await store.build({ type: 'debian', packages: BASE_PACKAGES }, { kind: 'base', name: BASE_NAME, onProgress: (m) => console.log(m) });
    }
    return { info, blobDir: path.join(root, 'blobs', info.digest.replace(/^sha256:/, '')) };
  } finally {
    await store.close();
  }
}

async function newSandbox(net: NetworkPolicy): Promise<Sandbox> {
  const sb = await Sandbox.create({ image: { base: BASE_NAME }, resources: { cpu: 2, memoryMiB: 1024 }, network: net }, { client });
  sandboxes.push(sb);
  return sb;
}

async function destroy(sb: Sandbox): Promise<void> {
  await sb.kill().catch(() => undefined);
  sandboxes.splice(sandboxes.indexOf(sb), 1);
}

/** The sandbox's open proxied connections go back to zero (within 15 s). */
async function connectionsSettle(sb: Sandbox): Promise<void> {
  const until = Date.now() + 15_000;
  while ((await sb.network()).stats.connections !== 0) {
    if (Date.now() > until) assert.fail('open connections not back at zero within 15 s');
    await new Promise((r) => setTimeout(r, 200));
  }
}

async function exec(sb: Sandbox, cmd: string[], what: string): Promise<string> {
  const r = await sb.exec(cmd, { timeoutMs: 120_000 });
  assert.equal(r.exitCode, 0, `${what}: ${r.stdout.slice(-1500)} ${r.stderr.slice(-1500)}`);
  return r.stdout;
}

describe('PyPI and Debian mirrors (Debian image, pip, apt)', { timeout: 900_000 }, () => {
  before(async () => {
    scratch = await mkdtemp(path.join(os.tmpdir(), 'dsec-mirrors-'));
    const base = await cachedBase();
    await writePypiIndex(path.join(scratch, 'pypi'), [
      { name: 'dsec-alpha', version: '1.0', kind: 'wheel', uploadTime: '2023-01-01T00:00:00Z', requires: ['dsec-beta>=1'] },
      { name: 'dsec-beta', version: '1.0', kind: 'sdist', uploadTime: '2023-02-01T00:00:00Z' },
      { name: 'dsec-gamma', version: '1.0', kind: 'wheel', uploadTime: '2023-03-01T00:00:00Z' },
      { name: 'dsec-gamma', version: '2.0', kind: 'wheel', uploadTime: '2025-03-01T00:00:00Z' },
    ]);
    key = await makeRepoKey(scratch);
    const debs = path.join(scratch, 'debs');
    await mkdir(debs);
    await writeDebianRepo(
      path.join(scratch, 'deb'),
      [
        await buildDeb(debs, { name: 'dsec-hello', version: '1.0', depends: ['dsec-lib (>= 1.0)'] }),
        // `~` and `+` in a version: apt asks for the pool file with them percent-encoded.
        await buildDeb(debs, { name: 'dsec-lib', version: '1.0+dsec~1' }),
      ],
      { suite: SUITE, key },
    );
    pypi = await startStaticRepo(path.join(scratch, 'pypi'));
    debian = await startStaticRepo(path.join(scratch, 'deb'));
    platform = await startTestPlatform({ network: { nameservers: [], mirrors: { origins: [pypi.url, debian.url] } } }, [base.blobDir]);
    const stored = await platform.platform.edge.layers.resolve(base.info.digest);
    await platform.platform.edge.layers.tag(stored.digest, BASE_NAME);
    await platform.platform.services.layers.register(ROOT_PROJECT_ID, stored, BASE_NAME);
    client = new DsecClient({ apiUrl: platform.url, apiKey: platform.adminKey });
  });

  after(async () => {
    for (const sb of [...sandboxes]) await sb.kill().catch(() => undefined);
    await platform?.close();
    await pypi?.close();
    await debian?.close();
    await key?.close();
    if (scratch) await rm(scratch, { recursive: true, force: true });
  });

  test('pip install through the pypi mirror, cold then warm (the warm one never reaches the index)', async () => {
    for (const round of ['cold', 'warm']) {
      const sb = await newSandbox({ mode: 'allowlist', mirrors: { pypi: { upstream: pypi.url } } });
      try {
        pypi.resetCounters();
        await exec(sb, [...PIP, 'dsec-alpha'], `pip install (${round})`);
        const out = await exec(sb, ['python3', '-c', 'import dsec_alpha, dsec_beta; print(dsec_alpha.VALUE, "/", dsec_beta.VALUE)'], 'import');
        assert.equal(out.trim(), 'dsec-alpha 1.0 / dsec-beta 1.0');
        if (round === 'cold') assert.ok(pypi.requests >= 4, `the cold mirror fetched ${pypi.requests} pages and files`);
        else assert.equal(pypi.requests, 0, 'everything came from the mirror cache');
        await connectionsSettle(sb);
      } finally {
        await destroy(sb);
      }
    }
  });

  test('a frozen pypi mirror hides the release uploaded after its cutoff', async () => {
    const sb = await newSandbox({ mode: 'allowlist', mirrors: { pypi: { upstream: pypi.url, freeze: FREEZE } } });
    try {
      await exec(sb, [...PIP, 'dsec-gamma'], 'pip install (frozen)');
      assert.equal((await exec(sb, ['python3', '-c', 'import dsec_gamma; print(dsec_gamma.VALUE)'], 'import')).trim(), 'dsec-gamma 1.0');
      // The later file, asked for by name, is refused, and the log says why.
      const fetchLater = `import urllib.request, urllib.error
try:
    urllib.request.urlopen('http://pypi.org/packages/dsec_gamma-2.0-py3-none-any.whl', timeout=30)
    print('served')
except urllib.error.HTTPError as e:
    print(e.code)`;
      assert.equal((await exec(sb, ['python3', '-c', fetchLater], 'fetch')).trim(), '404');
      const denied = (await sb.network.log({ limit: 1000 })).filter((e) => e.verdict === 'denied');
      assert.ok(
        denied.some((e) => e.reason?.startsWith('mirror-hidden') && e.reason.includes('dsec_gamma-2.0')),
        JSON.stringify(denied),
      );
      await connectionsSettle(sb);
    } finally {
      await destroy(sb);
    }
  });

  test('apt-get install through the debian mirror from a local repository (its signed Release checked in the sandbox)', async (t) => {
    const sb = await newSandbox({ mode: 'allowlist', mirrors: { debian: { upstream: debian.url } } });
    try {
      let options = '[trusted=yes]';
      if (key) {
        await sb.files.write('/etc/apt/keyrings/dsec-test.gpg', key.keyring);
        options = '[signed-by=/etc/apt/keyrings/dsec-test.gpg]';
      } else {
        t.diagnostic('gpg is not installed on this host: the repository is unsigned and trusted=yes');
      }
      await sb.files.write(APT_SOURCE, `deb ${options} http://deb.debian.org/debian ${SUITE} main\n`);
      await exec(sb, ['apt-get', ...APT_OPTS, 'update'], 'apt-get update');
      await exec(sb, ['apt-get', ...APT_OPTS, 'install', '-y', '--no-install-recommends', 'dsec-hello'], 'apt-get install');
      assert.equal((await exec(sb, ['dsec-hello'], 'dsec-hello')).trim(), 'dsec-hello 1.0');
      // The node's apt setting for the mirror: an unfrozen one keeps apt's Valid-Until check.
      const conf = (await sb.files.read('/etc/apt/apt.conf.d/99dsec-mirror')).toString();
      assert.match(conf, /dsec/);
      assert.doesNotMatch(conf, /Check-Valid-Until/);
      assert.ok(debian.requests >= 3, `the mirror fetched ${debian.requests} files from the repository`);
      assert.deepEqual(
        (await sb.network.log({ limit: 1000 })).filter((e) => e.verdict === 'denied').map((e) => `${e.host} ${e.reason}`),
        [],
      );
      await connectionsSettle(sb);
    } finally {
      await destroy(sb);
    }
  });
});
