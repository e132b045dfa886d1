import assert from 'node:assert/strict';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { DEFAULT_DSEC_ADDR, DEFAULT_DSEC_HOME } from '@dsec/protocol';
import { ConfigError, loadConfig, platformOptions, replicaOptions } from './config.js';
import { upCalls } from './commands/up.js';

let dir: string;
before(async () => {
  dir = await mkdtemp(path.join(os.tmpdir(), 'dsec-config-'));
});
after(async () => {
  await rm(dir, { recursive: true, force: true });
});

async function file(name: string, value: unknown): Promise<string> {
  const p = path.join(dir, name);
  await writeFile(p, typeof value === 'string' ? value : JSON.stringify(value));
  return p;
}

/** The ConfigError message of a load that must fail. */
async function refusal(sources: Parameters<typeof loadConfig>[0]): Promise<string> {
  const err = await loadConfig(sources).then(
    () => undefined,
    (e: unknown) => e,
  );
  assert.ok(err instanceof ConfigError, `refused with a ConfigError, got ${String(err)}`);
  return err.message;
}

describe('operator configuration: precedence', () => {
  test('nothing configured: the defaults', async () => {
    const { config, sources } = await loadConfig({ env: {} });
    assert.equal(config.home, DEFAULT_DSEC_HOME);
    assert.equal(config.addr, DEFAULT_DSEC_ADDR);
    assert.deepEqual(config.node, {});
    assert.deepEqual(sources, []);
    assert.deepEqual(platformOptions(config), { home: DEFAULT_DSEC_HOME, addr: DEFAULT_DSEC_ADDR });
  });

  test('flags > environment > file > defaults, key by key', async () => {
    const cfg = await file('layers.json', {
      home: '/srv/from-file',
      addr: '127.0.0.1:1111',
      node: { zramSwapMiB: 256, userNamespaces: false, network: { pool: '10.200.0.0/16', nameservers: ['192.0.2.1'], hosts: { 'git.internal': '192.0.2.7' } } },
      trajectory: { maxSteps: 5 },
    });
    const { config, sources } = await loadConfig({
      env: { DSEC_CONFIG: cfg, DSEC_HOME: '/srv/from-env', DSEC_ADDR: '127.0.0.1:2222', DSEC_USERNS: '1', DSEC_NAMESERVERS: '192.0.2.2, 192.0.2.3' },
      flags: { addr: '127.0.0.1:3333', nameserver: ['192.0.2.4'] },
    });
    assert.equal(config.home, '/srv/from-env', 'the environment wins over the file');
    assert.equal(config.addr, '127.0.0.1:3333', 'a flag wins over the environment and the file');
    assert.equal(config.node.userNamespaces, true, 'DSEC_USERNS=1 wins over the file');
    assert.equal(config.node.zramSwapMiB, 256, 'what only the file sets is kept');
    assert.deepEqual(
      config.node.network,
      { pool: '10.200.0.0/16', nameservers: ['192.0.2.4'], hosts: { 'git.internal': '192.0.2.7' } },
      'objects merge key by key; a list is replaced whole',
    );
    assert.deepEqual(sources, [cfg, '$DSEC_HOME', '$DSEC_ADDR', '$DSEC_USERNS', '$DSEC_NAMESERVERS', '--addr', '--nameserver']);
    assert.deepEqual(platformOptions(config), {
      home: '/srv/from-env',
      addr: '127.0.0.1:3333',
      userNamespaces: true,
      zramSwapMiB: 256,
      network: { pool: '10.200.0.0/16', nameservers: ['192.0.2.4'], hosts: { 'git.internal': '192.0.2.7' } },
      trajectory: { maxSteps: 5 },
    });
  });

  test('--config wins over $DSEC_CONFIG; --no-userns over the environment', async () => {
    const a = await file('a.json', { home: '/srv/a' });
    const b = await file('b.json', { home: '/srv/b' });
    const { config } = await loadConfig({ env: { DSEC_CONFIG: a, DSEC_USERNS: 'true' }, flags: { config: b, userns: false } });
    assert.equal(config.home, '/srv/b');
    assert.equal(config.node.userNamespaces, false);
  });

  test('an empty variable counts as unset', async () => {
    const { config } = await loadConfig({ env: { DSEC_HOME: '', DSEC_ZRAM_SWAP_MIB: '' } });
    assert.equal(config.home, DEFAULT_DSEC_HOME);
    assert.equal(config.node.zramSwapMiB, undefined);
  });

  test('every setting of the file reaches the platform options', async () => {
    const cfg = await file('all.json', {
      node: {
        agentBinary: '/opt/chronus',
        network: { slicePrefix: 24, proxyLimits: { maxConnections: 8 }, mirrors: { origins: ['http://mirror.internal:4873'] } },
      },
      placement: { cpuOvercommit: 4, memoryOvercommit: 1, sampleK: 3 },
      watcher: { intervalMs: 500, gcIntervalMs: 10_000, orphanGraceMs: 0 },
      events: { heartbeatMs: 1000, auditRetention: { maxRows: 10, maxAgeMs: 60_000 } },
    });
    const opts = platformOptions((await loadConfig({ env: {}, flags: { config: cfg } })).config);
    assert.equal(opts.agentBinary, '/opt/chronus');
    assert.deepEqual(opts.network, { slicePrefix: 24, proxyLimits: { maxConnections: 8 }, mirrors: { origins: ['http://mirror.internal:4873'] } });
    assert.deepEqual(opts.placement, { cpuOvercommit: 4, memoryOvercommit: 1, sampleK: 3 });
    assert.equal(opts.watchIntervalMs, 500);
    assert.equal(opts.gcIntervalMs, 10_000);
    assert.equal(opts.orphanGraceMs, 0, 'a grace of 0 (destroyed at first sight) is kept, not taken for unset');
    assert.deepEqual(opts.watch, { heartbeatMs: 1000, auditRetention: { maxRows: 10, maxAgeMs: 60_000 } });
  });

  test("dsec up --no-prebuild wins over the file's node.calls.prebuild", async () => {
    const cfg = await file('prebuild.json', { node: { calls: { runtimeCache: '/tmp/rt', prebuild: ['python', 'gcc'] } } });
    const opts = platformOptions((await loadConfig({ env: {}, flags: { config: cfg } })).config);
    assert.deepEqual(upCalls(opts.calls, false), { runtimeCache: '/tmp/rt', prebuild: [] });
    assert.deepEqual(upCalls(opts.calls, true), { runtimeCache: '/tmp/rt', prebuild: ['python', 'gcc'] });
    assert.deepEqual(upCalls(undefined, true).prebuild, ['python', 'node', 'gcc', 'go', 'java']);
    assert.deepEqual(upCalls(undefined, false).prebuild, []);
  });
});

describe('operator configuration: refusal names the key and its source', () => {
  test('a bad value in the file', async () => {
    const cfg = await file('bad-pool.json', { node: { network: { pool: '10.0.0.0/33' } } });
    assert.equal(await refusal({ env: {}, flags: { config: cfg } }), `config: node.network.pool: not a CIDR (in ${cfg})`);
  });

  test('an unknown key in the file (a typo is not ignored)', async () => {
    const cfg = await file('typo.json', { node: { zramSwapMib: 64 } });
    assert.equal(await refusal({ env: {}, flags: { config: cfg } }), `config: node.zramSwapMib: unknown key (in ${cfg})`);
  });

  test('a bad variable', async () => {
    assert.equal(await refusal({ env: { DSEC_ZRAM_SWAP_MIB: 'lots' } }), 'config: node.zramSwapMiB: not a non-negative integer (from $DSEC_ZRAM_SWAP_MIB)');
    assert.equal(await refusal({ env: { DSEC_USERNS: 'maybe' } }), 'config: node.userNamespaces: not true or false (from $DSEC_USERNS)');
    assert.equal(
      await refusal({ env: { DSEC_NAMESERVERS: '192.0.2.1,resolver' } }),
      'config: node.network.nameservers.1: not an IPv4 address (from $DSEC_NAMESERVERS)',
    );
  });

  test("the operator's egress settings (issue 14): read from variables, refused when malformed", async () => {
    const { config } = await loadConfig({
      env: { DSEC_UPSTREAM_PROXY: 'http://u:p@proxy.corp:3128', DSEC_CA_CERTIFICATES: '/etc/corp/ca.pem,/etc/corp/ca2.pem' },
    });
    assert.equal(config.node.network?.upstreamProxy, 'http://u:p@proxy.corp:3128');
    assert.deepEqual(config.node.network?.caCertificates, ['/etc/corp/ca.pem', '/etc/corp/ca2.pem']);
    assert.equal(
      await refusal({ env: { DSEC_UPSTREAM_PROXY: 'https://proxy.corp' } }),
      'config: node.network.upstreamProxy: not a URL (from $DSEC_UPSTREAM_PROXY)',
    );
    assert.equal(
      await refusal({ env: { DSEC_UPSTREAM_PROXY: 'http://proxy.corp:3128/path' } }),
      'config: node.network.upstreamProxy: a proxy URL has no path (from $DSEC_UPSTREAM_PROXY)',
    );
  });

  test("the operator's special ranges: flag, variable, and a bad range named with its source", async () => {
    const { config } = await loadConfig({ env: { DSEC_ALLOWED_PRIVATE_RANGES: '10.20.0.0/16, 100.100.0.0/16' } });
    assert.deepEqual(config.node.network?.allowedPrivateRanges, ['10.20.0.0/16', '100.100.0.0/16']);
    const flagged = await loadConfig({ env: { DSEC_ALLOWED_PRIVATE_RANGES: '10.20.0.0/16' }, flags: { allowPrivateRange: ['192.168.7.0/24'] } });
    assert.deepEqual(flagged.config.node.network?.allowedPrivateRanges, ['192.168.7.0/24']);
    assert.equal(
      await refusal({ env: {}, flags: { allowPrivateRange: ['0x7f.1/8'] } }),
      'config: node.network.allowedPrivateRanges.0: "0x7f.1/8": not an IPv4 address or a.b.c.d/n range (from --allow-private-range)',
    );
  });

  test('a bad flag', async () => {
    assert.equal(await refusal({ env: {}, flags: { addr: 'localhost' } }), 'config: addr: not host:port (from --addr)');
    assert.equal(await refusal({ env: {}, flags: { addr: '127.0.0.1:70000' } }), 'config: addr: port above 65535 (from --addr)');
  });

  test('a bad value is refused even when a later source would replace it', async () => {
    const cfg = await file('shadowed.json', { addr: 'nope' });
    assert.match(await refusal({ env: {}, flags: { config: cfg, addr: '127.0.0.1:0' } }), /^config: addr: not host:port \(in /);
  });

  test('a file that is missing, not JSON, or not an object', async () => {
    assert.match(await refusal({ env: {}, flags: { config: path.join(dir, 'missing.json') } }), /^config: cannot read .*missing\.json: ENOENT$/);
    assert.match(await refusal({ env: {}, flags: { config: await file('broken.json', '{"home": ') } }), /^config: .*broken\.json is not JSON: /);
    assert.match(await refusal({ env: {}, flags: { config: await file('list.json', []) } }), /must hold a JSON object$/);
  });
});

describe('the state store and proxies (dsec apiserver)', () => {
  test('db and trusted proxies from variables and flags reach the replica', async () => {
    const { config } = await loadConfig({
      env: { DSEC_DB: 'postgres://dsec@db.internal:5432/dsec', DSEC_TRUSTED_PROXIES: '10.0.0.0/8, ::1' },
      flags: { addr: '0.0.0.0:7878' },
    });
    const opts = replicaOptions(config);
    assert.equal(opts.db, 'postgres://dsec@db.internal:5432/dsec');
    assert.deepEqual(opts.trustedProxies, ['10.0.0.0/8', '::1']);
    assert.equal(opts.addr, '0.0.0.0:7878');
    assert.equal('agentBinary' in opts || 'network' in opts, false, 'a replica takes no node settings');
    assert.equal(platformOptions(config).db, opts.db, 'dsec up --db shares the store');
  });

  test('a replica without a database, a bad URL and a bad proxy are refused', async () => {
    const { config } = await loadConfig({ env: {} });
    assert.throws(() => replicaOptions(config), /db: dsec apiserver needs/);
    assert.equal(await refusal({ env: {}, flags: { db: 'mysql://x' } }), 'config: db: not a postgres:// URL (from --db)');
    assert.match(await refusal({ env: { DSEC_TRUSTED_PROXIES: 'proxy.local' } }), /^config: trustedProxies\.0: .* \(from \$DSEC_TRUSTED_PROXIES\)$/);
  });
});

describe('operator configuration: tenant limits', () => {
  test('file, DSEC_LIMIT_* and --limit, with precedence; a bad value names its key and source', async () => {
    const f = await file('limits.json', { limits: { execsPerTenant: 10, callsPerTenant: 4 } });
    const { config } = await loadConfig({
      env: { DSEC_LIMIT_EXECS_PER_TENANT: '20', DSEC_LIMIT_KEYS_PER_TENANT: '7' },
      flags: { config: f, limit: ['execsPerTenant=30'] },
    });
    assert.deepEqual(config.limits, { execsPerTenant: 30, callsPerTenant: 4, keysPerTenant: 7 });
    assert.deepEqual(platformOptions(config).limits, { execsPerTenant: 30, callsPerTenant: 4, keysPerTenant: 7 });
    assert.match(await refusal({ env: { DSEC_LIMIT_EXECS_PER_TENANT: 'many' } }), /limits\.execsPerTenant: .*DSEC_LIMIT_EXECS_PER_TENANT/);
    assert.match(await refusal({ env: {}, flags: { limit: ['execsPerTennant=3'] } }), /limits\.execsPerTennant: unknown key \(from --limit\)/);
    assert.match(await refusal({ env: {}, flags: { limit: ['execsPerTenant'] } }), /not name=value/);
  });
});
