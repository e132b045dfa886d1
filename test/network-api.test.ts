// Network policies through the API, the SDK and the CLI: create with a policy, replace, patch,
// apply to a labelled job, read the log; bad input is a 400 naming the entry. No traffic leaves
// the machine: names resolve only from the node's static map.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { DsecClient, Sandbox, isDsecError } from '@dsec/sdk';
import { REPO_ROOT } from './helpers/node.js';
import { startTestPlatform } from './helpers/platform.js';
import type { TestPlatform } from './helpers/platform.js';

const CLI = path.join(REPO_ROOT, 'packages/cli/dist/main.js');
let platform: TestPlatform;
let client: DsecClient;
const JOB = `job-${randomBytes(3).toString('hex')}`;

function dsec(args: string[]): Promise<{ code: number | null; stdout: string; stderr: string }> {
  const child = spawn(process.execPath, [CLI, ...args], {
    env: { PATH: process.env.PATH ?? '', DSEC_API_URL: platform.url, DSEC_API_KEY: platform.adminKey, DSEC_HOME: '/nonexistent' },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let stdout = '';
  let stderr = '';
  child.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
  child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
  return new Promise((resolve) => child.on('close', (code) => resolve({ code, stdout, stderr })));
}

async function raw(
  method: string,
  route: string,
  body?: unknown,
  key?: string,
): Promise<{ status: number; json: { error?: { code: string; field?: string; message: string } } & Record<string, unknown> }> {
  const res = await fetch(platform.url + route, {
    method,
    headers: { authorization: `Bearer ${key ?? platform.adminKey}`, 'content-type': 'application/json' },
    ...(body !== undefined ? { body: JSON.stringify(body) } : {}),
  });
  const text = await res.text();
  return { status: res.status, json: (text ? JSON.parse(text) : {}) as never };
}

before(async () => {
  platform = await startTestPlatform({ network: { hosts: { 'api.test': '127.0.0.2', 'pkg.test': '127.0.0.3' }, nameservers: [] } });
  client = new DsecClient({ apiUrl: platform.url, apiKey: platform.adminKey });
});

after(async () => {
  await platform?.close();
});

describe('network API', () => {
  test('create with a policy, read it back, replace and patch it, read the log', async () => {
    const sb = await Sandbox.create(
      { image: { base: 'busybox' }, network: { mode: 'allowlist', allow: [{ host: 'api.test', ports: [443] }], allowAddresses: ['127.0.0.2'] } },
      { client },
    );
    try {
      assert.equal(sb.lastInfo?.network.mode, 'allowlist');
      const n = await sb.network();
      assert.deepEqual(n.policy.allow, [{ host: 'api.test', ports: [443] }]);
      assert.ok(n.address && n.gateway);
      assert.equal((await sb.exec('nslookup api.test >/dev/null && ! nslookup pkg.test >/dev/null')).exitCode, 0);

      const patched = await sb.patchNetwork({ allow: { add: [{ host: 'pkg.test' }] }, allowAddresses: { add: ['127.0.0.3'] }, presets: { add: ['npm'] } });
      assert.deepEqual(patched.policy.presets, ['npm']);
      assert.equal((await sb.exec('nslookup pkg.test')).exitCode, 0, 'the patch is in force at once');
      assert.equal((await sb.info()).network.allow?.length, 2, 'the stored policy follows');

      const replaced = await sb.setNetwork({ mode: 'allowlist', presets: ['pypi'] });
      assert.deepEqual(replaced.policy, { mode: 'allowlist', presets: ['pypi'] });
      assert.notEqual((await sb.exec('nslookup api.test')).exitCode, 0);

      const log = await sb.networkLog({ limit: 50 });
      assert.ok(log.some((e) => e.via === 'dns' && e.host === 'api.test' && e.verdict === 'allowed'));
      assert.ok(log.some((e) => e.via === 'dns' && e.host === 'api.test' && e.verdict === 'denied'));
      assert.ok((await sb.network()).stats.denied >= 1);
    } finally {
      await sb.kill();
    }
  });

  test('a deny-domain rule is merged into new policies and kept through every later change', async () => {
    const rule = await raw('POST', '/v1/rules', { kind: 'deny-domain', domain: 'pkg.test' });
    assert.equal(rule.status, 201, JSON.stringify(rule.json));
    const sb = await Sandbox.create(
      { image: { base: 'busybox' }, network: { mode: 'allowlist', allow: [{ host: '*.test' }], allowAddresses: ['127.0.0.2', '127.0.0.3'] } },
      { client },
    );
    try {
      assert.deepEqual((await sb.network()).policy.deny, ['pkg.test']);
      assert.equal((await sb.exec('nslookup api.test >/dev/null && ! nslookup pkg.test >/dev/null')).exitCode, 0, 'the DNS stub refuses the denied name');
      // Neither a replacement nor a patch from the tenant drops it.
      assert.deepEqual((await sb.setNetwork({ mode: 'allowlist', allow: [{ host: 'pkg.test' }] })).policy.deny, ['pkg.test']);
      assert.deepEqual((await sb.patchNetwork({ mode: 'none' })).policy, { mode: 'none' });
      assert.deepEqual((await sb.patchNetwork({ allow: { add: [{ host: 'pkg.test' }] } })).policy.deny, ['pkg.test']);
      assert.notEqual((await sb.exec('nslookup pkg.test')).exitCode, 0);
    } finally {
      await sb.kill();
      assert.equal((await raw('DELETE', `/v1/rules/${String(rule.json.id)}`)).status, 204);
    }
  });

  test('bad policies are a 400 naming the entry; unknown sandboxes a 404', async () => {
    const bad = await raw('POST', '/v1/sandboxes', { image: { base: 'busybox' }, network: { mode: 'allowlist', presets: ['npm', 'nope'] } });
    assert.equal(bad.status, 400);
    assert.equal(bad.json.error?.field, 'network.presets.1');
    const sb = await Sandbox.create({ image: { base: 'busybox' } }, { client });
    try {
      for (const [body, field] of [
        [{ mode: 'allowlist', allow: [{ host: 'ok.test' }, { host: '-bad-.test' }] }, 'network.allow.1.host'],
        [{ mode: 'allowlist', allow: [{ host: 'ok.test', ports: [0] }] }, 'network.allow.0.ports.0'],
        [{ mode: 'allowlist', mirrors: { nope: {} } }, 'network.mirrors.nope'],
        [{ mode: 'allowlist', mirrors: { npm: { freeze: 'yesterday' } } }, 'network.mirrors.npm.freeze'],
      ] as const) {
        const r = await raw('PUT', `/v1/sandboxes/${sb.id}/network`, body);
        assert.equal(r.status, 400, JSON.stringify(body));
        assert.equal(r.json.error?.field, field, r.json.error?.message);
      }
      const p = await raw('PATCH', `/v1/sandboxes/${sb.id}/network`, { presets: { add: ['npm'], remove: ['x'] } });
      assert.equal(p.status, 400);
      assert.equal(p.json.error?.field, 'network.presets.remove.0');
      assert.deepEqual((await sb.network()).policy, { mode: 'none' });
      assert.equal((await raw('GET', '/v1/sandboxes/nope-0000000000000000/network')).status, 404);
      assert.equal((await raw('PUT', '/v1/sandboxes/nope-0000000000000000/network', { mode: 'none' })).status, 404);
      await assert.rejects(sb.setNetwork({ mode: 'allowlist', allow: [{ host: 'a b' }] }), (e: unknown) => isDsecError(e, 'INVALID_ARGUMENT'));
    } finally {
      await sb.kill();
    }
  });

  test('network:apply changes every sandbox of a job, and only those', async () => {
    const a = await Sandbox.create({ image: { base: 'busybox' }, labels: { job: JOB, stage: '1' } }, { client });
    const b = await Sandbox.create(
      { image: { base: 'busybox' }, labels: { job: JOB }, network: { mode: 'allowlist', allow: [{ host: 'api.test' }], allowAddresses: ['127.0.0.2'] } },
      { client },
    );
    const other = await Sandbox.create({ image: { base: 'busybox' }, labels: { job: `${JOB}-other` } }, { client });
    try {
      const res = await client.applyNetwork({
        selector: { labels: { job: JOB } },
        patch: { allow: { add: [{ host: 'pkg.test' }] }, allowAddresses: { add: ['127.0.0.3'] } },
      });
      assert.equal(res.matched, 2);
      assert.deepEqual(res.failed, []);
      assert.deepEqual(res.applied.map((x) => x.id).sort(), [a.id, b.id].sort());
      // a was `none`: the patch put it on the network.
      assert.equal((await a.exec('nslookup pkg.test >/dev/null && ! nslookup api.test >/dev/null')).exitCode, 0);
      assert.equal((await b.exec('nslookup pkg.test >/dev/null && nslookup api.test >/dev/null')).exitCode, 0);
      assert.deepEqual((await other.network()).policy, { mode: 'none' });

      // The next stage closes the whole job.
      const closed = await client.applyNetwork({ selector: { labels: { job: JOB } }, policy: { mode: 'none' } });
      assert.equal(closed.applied.length, 2);
      assert.equal((await a.exec('ip -o link | wc -l')).stdout.trim(), '1');
      assert.equal((await b.info()).network.mode, 'none');

      const noLabels = await raw('POST', '/v1/network:apply', { selector: { labels: {} }, policy: { mode: 'none' } });
      assert.equal(noLabels.status, 400);
      assert.equal(noLabels.json.error?.field, 'selector.labels');
      const both = await raw('POST', '/v1/network:apply', { selector: { labels: { job: JOB } } });
      assert.equal(both.status, 400);
      assert.equal(both.json.error?.field, 'policy');
    } finally {
      await a.kill();
      await b.kill();
      await other.kill();
    }
  });

  test('the CLI creates with --allow and changes policies with dsec network', async () => {
    const created = await dsec(['sandbox', 'create', '--base', 'busybox', '--allow', 'api.test:443,8443', '--allow-address', '127.0.0.2']);
    assert.equal(created.code, 0, created.stderr);
    const id = created.stdout.trim();
    try {
      const got = await dsec(['network', 'get', id, '--json']);
      assert.deepEqual(JSON.parse(got.stdout).policy.allow, [{ host: 'api.test', ports: [443, 8443] }]);
      const patched = await dsec(['network', 'patch', id, '--add-preset', 'pypi', '--deny', 'api.test']);
      assert.equal(patched.code, 0, patched.stderr);
      assert.match(patched.stdout, /presets:\s+pypi/);
      assert.match(patched.stdout, /allow:\s+-/);
      const bad = await dsec(['network', 'set', id, '--preset', 'left-pad']);
      assert.equal(bad.code, 1);
      assert.match(bad.stderr, /INVALID_ARGUMENT: network\.presets\.0: unknown preset "left-pad"/);
      const log = await dsec(['network', 'log', id]);
      assert.equal(log.code, 0, log.stderr);
      assert.match(log.stdout, /^TIME\s+VIA/);
      const off = await dsec(['network', 'set', id, '--none', '--json']);
      assert.deepEqual(JSON.parse(off.stdout).policy, { mode: 'none' });
    } finally {
      await dsec(['sandbox', 'rm', id]);
    }
  });
});

describe("a tenant's policy cannot reach the node or its neighbours", () => {
  test('loopback, link-local, private and other special destinations are 400 naming the entry, on create, replace, patch and apply; the root project keeps them', async () => {
    const project = await raw('POST', '/v1/projects', { name: `tenant-${randomBytes(3).toString('hex')}` });
    assert.equal(project.status, 201, JSON.stringify(project.json));
    const key = await raw('POST', '/v1/keys', { name: 'tenant-admin', role: 'admin', project: project.json.id });
    assert.equal(key.status, 201, JSON.stringify(key.json));
    const tenant = key.json.key as string;
    const base = { image: { base: 'busybox' }, resources: { memoryMiB: 64, diskMiB: 16 } };
    const refusedCreates: Array<[object, string, RegExp]> = [
      [{ allowAddresses: ['127.0.0.0/8'] }, 'network.allowAddresses.0', /loopback/],
      [{ allowAddresses: ['93.184.216.0/24', '169.254.169.254'] }, 'network.allowAddresses.1', /link-local/],
      [{ allowAddresses: ['10.0.0.0/8'] }, 'network.allowAddresses.0', /private/],
      [{ allowAddresses: ['172.16.0.0/12'] }, 'network.allowAddresses.0', /private/],
      [{ allowAddresses: ['192.168.1.0/24'] }, 'network.allowAddresses.0', /private/],
      [{ allowAddresses: ['100.64.0.0/10'] }, 'network.allowAddresses.0', /shared/],
      [{ allowAddresses: ['169.0.0.0/8'] }, 'network.allowAddresses.0', /link-local/],
      [{ allowAddresses: ['224.0.0.0/8'] }, 'network.allowAddresses.0', /multicast/],
      [{ allowAddresses: ['10.213.0.0/16'] }, 'network.allowAddresses.0', /private/],
      [{ allow: [{ host: 'api.test' }, { host: '127.0.0.1' }] }, 'network.allow.1.host', /loopback/],
      [{ allow: [{ host: '169.254.169.254', ports: [80] }] }, 'network.allow.0.host', /link-local/],
      [{ allow: [{ host: 'localhost' }] }, 'network.allow.0.host', /the node itself/],
      [{ allow: [{ host: '*.localhost' }] }, 'network.allow.0.host', /the node itself/],
    ];
    for (const [extra, field, message] of refusedCreates) {
      const r = await raw('POST', '/v1/sandboxes', { ...base, network: { mode: 'allowlist', ...extra } }, tenant);
      assert.equal(r.status, 400, `${JSON.stringify(extra)}: ${JSON.stringify(r.json)}`);
      assert.equal(r.json.error?.field, field);
      assert.match(r.json.error?.message ?? '', message);
      assert.match(r.json.error?.message ?? '', /allowedPrivateRanges/);
    }
    // Spellings the policy schema does not take at all are refused before that (as not an address).
    for (const host of ['0x7f.1', '2130706433', '127.1', '::1', '[::ffff:127.0.0.1]']) {
      const r = await raw('POST', '/v1/sandboxes', { ...base, network: { mode: 'allowlist', allow: [{ host }] } }, tenant);
      assert.equal(r.status, 400, host);
      assert.equal(r.json.error?.field, 'network.allow.0.host', host);
    }
    const batch = await raw(
      'POST',
      '/v1/sandboxes:batch',
      { spec: { ...base, network: { mode: 'allowlist', allowAddresses: ['127.0.0.2'] } }, count: 2 },
      tenant,
    );
    assert.equal(batch.status, 400, JSON.stringify(batch.json));
    assert.equal(batch.json.error?.field, 'spec.network.allowAddresses.0');
    const listed = await raw('GET', '/v1/sandboxes', undefined, tenant);
    assert.deepEqual(listed.json.items, [], 'nothing was created');

    // A tenant sandbox with an ordinary policy; changes naming special destinations are refused.
    const created = await raw(
      'POST',
      '/v1/sandboxes',
      { ...base, network: { mode: 'allowlist', allow: [{ host: 'api.test' }], allowAddresses: ['93.184.216.0/24'] } },
      tenant,
    );
    assert.equal(created.status, 201, JSON.stringify(created.json));
    const id = created.json.id as string;
    try {
      const put = await raw('PUT', `/v1/sandboxes/${id}/network`, { mode: 'allowlist', allow: [{ host: 'api.test' }], allowAddresses: ['127.0.0.2'] }, tenant);
      assert.equal(put.status, 400);
      assert.equal(put.json.error?.field, 'network.allowAddresses.0');
      const patch = await raw('PATCH', `/v1/sandboxes/${id}/network`, { allowAddresses: { add: ['8.8.8.0/24', '192.168.0.0/16'] } }, tenant);
      assert.equal(patch.status, 400);
      assert.equal(patch.json.error?.field, 'network.allowAddresses.add.1');
      const patchHost = await raw('PATCH', `/v1/sandboxes/${id}/network`, { allow: { add: [{ host: '10.0.0.1' }] } }, tenant);
      assert.equal(patchHost.json.error?.field, 'network.allow.add.0.host');
      const apply = await raw('POST', '/v1/network:apply', { selector: { labels: { any: 'x' } }, patch: { allowAddresses: { add: ['127.0.0.0/8'] } } }, tenant);
      assert.equal(apply.status, 400);
      assert.equal(apply.json.error?.field, 'patch.allowAddresses.add.0');
      const applyPolicy = await raw(
        'POST',
        '/v1/network:apply',
        { selector: { labels: { any: 'x' } }, policy: { mode: 'allowlist', allow: [{ host: '127.0.0.1' }] } },
        tenant,
      );
      assert.equal(applyPolicy.json.error?.field, 'policy.allow.0.host');
      const now = await raw('GET', `/v1/sandboxes/${id}/network`, undefined, tenant);
      assert.deepEqual((now.json.policy as { allowAddresses?: string[] }).allowAddresses, ['93.184.216.0/24'], 'the policy in force is unchanged');
      const publicPatch = await raw('PATCH', `/v1/sandboxes/${id}/network`, { allowAddresses: { add: ['8.8.8.0/24'] } }, tenant);
      assert.equal(publicPatch.status, 200, JSON.stringify(publicPatch.json));
    } finally {
      await raw('DELETE', `/v1/sandboxes/${id}`, undefined, tenant);
    }

    // The root project (the operator's own) may still name loopback ranges for its sandboxes.
    const rootPut = await raw('POST', '/v1/sandboxes', {
      ...base,
      network: { mode: 'allowlist', allow: [{ host: 'api.test' }], allowAddresses: ['127.0.0.2'] },
    });
    assert.equal(rootPut.status, 201, JSON.stringify(rootPut.json));
    await raw('DELETE', `/v1/sandboxes/${rootPut.json.id as string}`);
  });
});
