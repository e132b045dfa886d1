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
): Promise<{ status: number; json: { error?: { code: string; field?: string; message: string } } & Record<string, unknown> }> {
  const res = await fetch(platform.url + route, {
    method,
    headers: { authorization: `Bearer ${platform.adminKey}`, 'content-type': 'application/json' },
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
