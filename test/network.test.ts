// End-to-end tests of sandbox networking: per-sandbox links, the node's nftables table, the DNS
// stub, the egress log and events, live policy changes, restarts and cleanup. Every upstream
// here is started by the test, on loopback or inside a network namespace the test creates.
import assert from 'node:assert/strict';
import { execFile, spawn } from 'node:child_process';
import type { ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import dgram from 'node:dgram';
import { mkdir, mkdtemp, readdir, rm, writeFile, access } from 'node:fs/promises';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { after, before, describe, test } from 'node:test';
import { isDsecError } from '@dsec/protocol';
import type { NetworkPolicy, RaisedEvent } from '@dsec/protocol';
import type { EgressLogEntry } from '@dsec/edge';
import { startNode } from './helpers/node.js';
import type { TestNode } from './helpers/node.js';

const run = promisify(execFile);

/** Names the node resolves without asking anyone (no query ever leaves the machine). */
const HOSTS = { 'api.test': '127.0.0.2', 'cdn.assets.test': '127.0.0.3', 'rebind.test': '127.0.0.1', 'other.test': '127.0.0.4' };

let node: TestNode;
let scratch: string;
const events: RaisedEvent[] = [];

/** A network namespace of the test's own, reachable from the host, with servers in it. */
interface Upstream {
  name: string;
  address: string;
  hostAddress: string;
  procs: ChildProcess[];
  /** Datagrams the UDP server inside received. */
  udpSeen(): Promise<number>;
  close(): Promise<void>;
}

let upstream: Upstream;

async function startUpstream(dir: string): Promise<Upstream> {
  const tag = randomBytes(3).toString('hex');
  const name = `dsec-test-${tag}`;
  const hostIf = `dtu${tag}`;
  const octet = 1 + (parseInt(tag, 16) % 250);
  const hostAddress = `10.214.${octet}.1`;
  const address = `10.214.${octet}.2`;
  await run('ip', ['netns', 'add', name]);
  const procs: ChildProcess[] = [];
  const close = async (): Promise<void> => {
    for (const p of procs) p.kill('SIGKILL');
    await run('ip', ['netns', 'del', name]).catch(() => undefined);
    await run('ip', ['link', 'del', hostIf]).catch(() => undefined);
  };
  try {
    await run('ip', ['link', 'add', hostIf, 'type', 'veth', 'peer', 'name', 'eth0', 'netns', name]);
    await run('ip', ['addr', 'add', `${hostAddress}/30`, 'dev', hostIf]);
    await run('ip', ['link', 'set', hostIf, 'up']);
    for (const args of [['addr', 'add', `${address}/30`, 'dev', 'eth0'], ['link', 'set', 'lo', 'up'], ['link', 'set', 'eth0', 'up'], ['route', 'add', 'default', 'via', hostAddress]]) {
      await run('ip', ['-n', name, ...args]);
    }
    const www = path.join(dir, 'www');
    await mkdir(www, { recursive: true });
    await writeFile(path.join(www, 'ok.txt'), 'upstream-ok\n');
    for (const port of ['80', '9000']) procs.push(spawn('ip', ['netns', 'exec', name, 'busybox', 'httpd', '-f', '-p', port, '-h', www], { stdio: 'ignore' }));
    // A UDP "resolver" that counts what reaches it and answers each datagram with one byte.
    const counter = path.join(dir, 'udp-count');
    const script = `const d=require('node:dgram').createSocket('udp4');let n=0;d.on('message',(m,r)=>{n++;require('node:fs').writeFileSync(${JSON.stringify(counter)},String(n));d.send(Buffer.from('x'),r.port,r.address)});d.bind(53,'${address}')`;
    procs.push(spawn('ip', ['netns', 'exec', name, process.execPath, '-e', script], { stdio: 'ignore' }));
    const { readFile } = await import('node:fs/promises');
    // Wait for the servers, checking from the host (the positive control of the bypass tests).
    await waitFor(async () => (await httpGet(address, 9000, '/ok.txt').catch(() => '')) === 'upstream-ok\n', 'upstream httpd');
    await waitFor(async () => (await udpProbe(address, 53)) === true, 'upstream udp');
    await writeFile(counter, '0');
    return { name, address, hostAddress, procs, close, udpSeen: async () => Number(await readFile(counter, 'utf8').catch(() => '0')) };
  } catch (err) {
    await close();
    throw err;
  }
}

function httpGet(host: string, port: number, p: string): Promise<string> {
  return new Promise((resolve, reject) => {
    const sock = net.connect({ host, port, timeout: 2000 }, () => sock.write(`GET ${p} HTTP/1.0\r\nHost: ${host}\r\n\r\n`));
    let data = '';
    sock.on('data', (d) => (data += d.toString()));
    sock.on('end', () => resolve(data.split('\r\n\r\n').slice(1).join('\r\n\r\n')));
    sock.on('timeout', () => sock.destroy(new Error('timeout')));
    sock.on('error', reject);
  });
}

function udpProbe(host: string, port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const s = dgram.createSocket('udp4');
    const done = (ok: boolean): void => {
      s.close();
      resolve(ok);
    };
    const timer = setTimeout(() => done(false), 500);
    s.on('message', () => {
      clearTimeout(timer);
      done(true);
    });
    s.send(Buffer.from('probe'), port, host);
  });
}

async function waitFor(check: () => Promise<boolean> | boolean, what: string, timeoutMs = 8000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    if (await check()) return;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

async function sh(id: string, cmd: string): Promise<{ code: number | null; out: string }> {
  const r = await node.edge.exec(id, { cmd, timeoutMs: 30_000 });
  return { code: r.exitCode, out: r.stdout + r.stderr };
}

const allowlist = (extra: Partial<NetworkPolicy> = {}): NetworkPolicy => ({ mode: 'allowlist', allow: [{ host: 'api.test' }, { host: '*.assets.test' }, { host: 'rebind.test' }], allowAddresses: ['127.0.0.2', '127.0.0.3'], ...extra });

function logHas(id: string, pred: (e: EgressLogEntry) => boolean): boolean {
  return node.edge.networkLog(id).some(pred);
}

async function nftTables(): Promise<string> {
  return (await run('nft', ['list', 'tables'])).stdout;
}

before(async () => {
  node = await startNode({ network: { hosts: HOSTS, nameservers: [] } });
  node.edge.onEvent((ev) => events.push(ev));
  scratch = await mkdtemp(path.join(os.tmpdir(), 'dsec-scratch-'));
  await node.edge.layers.build({ type: 'busybox' }, { kind: 'base', name: 'busybox' });
  upstream = await startUpstream(scratch);
});

after(async () => {
  await upstream?.close();
  await node?.cleanup();
  await rm(scratch, { recursive: true, force: true });
});

const image = { base: 'busybox' };

describe('sandbox networks', () => {
  test('a sandbox without a policy has loopback only, and the node sets up nothing for it', async () => {
    const sb = await node.edge.create({ image });
    try {
      const r = await sh(sb.id, 'ip -o link | cut -d: -f2; ip route');
      assert.equal(r.out.trim(), 'lo');
      assert.deepEqual(node.edge.networkInfo(sb.id).policy, { mode: 'none' });
      assert.ok(!(await nftTables()).includes(node.edge.network.table), 'no table before a networked sandbox');
    } finally {
      await node.edge.destroy(sb.id);
    }
  });

  test('an allowlist sandbox gets a link, resolv.conf, and DNS answers for allowed names only', async () => {
    const sb = await node.edge.create({ image, network: allowlist() });
    try {
      const info = node.edge.networkInfo(sb.id);
      assert.ok(info.address && info.gateway);
      const links = await sh(sb.id, 'ip -o -4 addr show eth0; ip route; cat /etc/resolv.conf; ip -6 addr show eth0 | grep -c inet6');
      assert.match(links.out, new RegExp(`inet ${info.address.replace(/\./g, '\\.')} peer ${info.gateway.replace(/\./g, '\\.')}/32`));
      assert.match(links.out, new RegExp(`default via ${info.gateway}`));
      assert.match(links.out, new RegExp(`nameserver ${info.gateway}`));
      assert.match(links.out, /\n0\n$/, 'no IPv6 address');
      assert.ok((await nftTables()).includes(node.edge.network.table));

      // Allowed names resolve to the gateway (the proxy resolves the real address itself).
      const ok = await sh(sb.id, 'nslookup api.test; nslookup cdn.assets.test');
      assert.equal(ok.code, 0, ok.out);
      assert.equal((ok.out.match(new RegExp(`Address: ${info.gateway}\\b`, 'g')) ?? []).length, 2, ok.out);
      // A wildcard does not cover its own suffix; unknown names and rebinding are NXDOMAIN.
      for (const name of ['assets.test', 'other.test', 'rebind.test', 'unknown.invalid']) {
        const r = await sh(sb.id, `nslookup ${name}`);
        assert.notEqual(r.code, 0, `${name}: ${r.out}`);
        assert.match(r.out, /NXDOMAIN/, name);
      }
      const aaaa = await sh(sb.id, 'nslookup -type=aaaa api.test');
      assert.doesNotMatch(aaaa.out, /Address: [0-9a-f:]+:/, 'no IPv6 answers');
      // DNS over TCP answers the same.
      assert.ok(logHas(sb.id, (e) => e.via === 'dns' && e.host === 'api.test' && e.verdict === 'allowed' && e.rule === 'allow:api.test'));
      assert.ok(logHas(sb.id, (e) => e.via === 'dns' && e.host === 'rebind.test' && e.verdict === 'denied' && e.address === '127.0.0.1'));
      assert.ok(logHas(sb.id, (e) => e.via === 'dns' && e.host === 'other.test' && e.verdict === 'denied'));
      assert.ok(events.some((e) => e.kind === 'egress.denied' && e.sandboxId === sb.id && (e.data as { host?: string }).host === 'other.test'));
    } finally {
      await node.edge.destroy(sb.id);
    }
  });

  test('the kernel drops and logs every way around the gateway: host services, other ports, UDP elsewhere, other sandboxes, other hosts, IPv6, ICMP', async () => {
    const a = await node.edge.create({ image, network: allowlist() });
    const b = await node.edge.create({ image, network: allowlist() });
    // Services on the host, listening on every address (so on the gateway address too).
    const seen: string[] = [];
    const tcp = net.createServer((s) => {
      seen.push('tcp');
      s.destroy();
    });
    await new Promise<void>((r) => tcp.listen(0, '0.0.0.0', r));
    const tcpPort = (tcp.address() as net.AddressInfo).port;
    const udp = dgram.createSocket('udp4');
    udp.on('message', () => seen.push('udp'));
    await new Promise<void>((r) => udp.bind(0, '0.0.0.0', r));
    const udpPort = udp.address().port;
    try {
      const gw = node.edge.networkInfo(a.id).gateway as string;
      const bAddr = node.edge.networkInfo(b.id).address as string;
      // Controls: the host reaches both of its own services on the gateway address.
      await new Promise<void>((resolve, reject) => net.connect(tcpPort, gw, resolve).on('error', reject));
      assert.equal(seen.shift(), 'tcp');
      const bListens = await node.edge.spawn(b.id, { cmd: 'nc -l -p 8080 > /tmp/got' });

      const attempts: Array<[string, string, (e: EgressLogEntry) => boolean]> = [
        ['host service on the gateway', `nc -w 1 ${gw} ${tcpPort} </dev/null`, (e) => e.host === gw && e.port === tcpPort && e.protocol === 'tcp'],
        ['gateway ssh port', `nc -w 1 ${gw} 22 </dev/null`, (e) => e.host === gw && e.port === 22],
        ['UDP to a host port', `echo hi | tftp -p -l /etc/hostname -r x ${gw} ${udpPort}`, (e) => e.host === gw && e.port === udpPort && e.protocol === 'udp'],
        ['another sandbox', `echo secret | nc -w 1 ${bAddr} 8080`, (e) => e.host === bAddr && e.port === 8080],
        ['a host by IP, another port', `printf 'GET /ok.txt HTTP/1.0\\r\\n\\r\\n' | nc -w 1 ${upstream.address} 9000`, (e) => e.host === upstream.address && e.port === 9000],
        ['another resolver', `nslookup api.test ${upstream.address}`, (e) => e.host === upstream.address && e.port === 53 && e.protocol === 'udp'],
      ];
      for (const [what, cmd, match] of attempts) {
        const r = await sh(a.id, `timeout 5 sh -c '${cmd.replace(/'/g, `'\\''`)}'`);
        assert.notEqual(r.code, 0, `${what} must fail: ${r.out}`);
        assert.doesNotMatch(r.out, /upstream-ok/, what);
        await waitFor(() => logHas(a.id, (e) => e.via === 'kernel' && e.verdict === 'denied' && match(e)), `kernel log of: ${what}`);
      }
      assert.deepEqual(seen, [], 'no host service saw the sandbox');
      assert.equal(await upstream.udpSeen(), 0, 'the other resolver saw nothing');
      assert.equal((await sh(b.id, 'cat /tmp/got')).out, '', 'the other sandbox got nothing');
      await bListens.kill('SIGKILL');

      // IPv6 has no address or route; ICMP needs a raw socket the sandbox does not have.
      const v6 = await sh(a.id, 'nc -w 1 2001:db8::1 80 </dev/null || nc -w 1 fd00::2 443 </dev/null || echo blocked');
      assert.match(v6.out, /blocked$/m, v6.out);
      assert.notEqual((await sh(a.id, `ping -c 1 -W 1 ${gw}`)).code, 0);

      // Many denied ports in a short time: a port scan.
      await sh(a.id, `for p in $(seq 2000 2015); do nc -w 1 ${gw} $p </dev/null & done; wait`);
      await waitFor(() => events.some((e) => e.kind === 'egress.port-scan' && e.sandboxId === a.id), 'port-scan event');
      const denied = events.find((e) => e.kind === 'egress.denied' && e.sandboxId === a.id && (e.data as { via?: string }).via === 'kernel');
      assert.ok(denied, 'kernel denials become events');
      assert.ok(node.edge.networkInfo(a.id).stats.denied >= attempts.length);
    } finally {
      tcp.close();
      udp.close();
      await node.edge.destroy(a.id);
      await node.edge.destroy(b.id);
    }
  });

  test('live changes: none -> allowlist -> patch -> none on a running sandbox', async () => {
    const sb = await node.edge.create({ image });
    try {
      assert.equal((await sh(sb.id, 'ip -o link | wc -l')).out.trim(), '1');
      const on = await node.edge.setNetwork(sb.id, { mode: 'allowlist', allow: [{ host: 'api.test' }], allowAddresses: ['127.0.0.2'] });
      assert.equal(on.policy.mode, 'allowlist');
      const r1 = await sh(sb.id, 'cat /etc/resolv.conf; nslookup api.test && ! nslookup cdn.assets.test');
      assert.equal(r1.code, 0, r1.out);

      const patched = await node.edge.patchNetwork(sb.id, { allow: { add: [{ host: '*.assets.test', ports: [443] }], remove: ['api.test'] }, allowAddresses: { add: ['127.0.0.3'] } });
      assert.deepEqual(patched.policy.allow, [{ host: '*.assets.test', ports: [443] }]);
      const r2 = await sh(sb.id, 'nslookup cdn.assets.test && ! nslookup api.test');
      assert.equal(r2.code, 0, r2.out);
      assert.equal(node.edge.info(sb.id).spec.network?.mode, 'allowlist');

      const off = await node.edge.setNetwork(sb.id, { mode: 'none' });
      assert.deepEqual(off.policy, { mode: 'none' });
      assert.equal(off.address, undefined);
      assert.equal((await sh(sb.id, 'ip -o link | wc -l')).out.trim(), '1', 'the link is gone');
      const links = await readdir('/sys/class/net');
      assert.equal(links.filter((l) => l.startsWith(node.edge.network.ifPrefix) && !/-g[wp]$/.test(l)).length, 0);
    } finally {
      await node.edge.destroy(sb.id);
    }
  });

  test('bad policies are a 400 naming the entry, and leave the old policy in force', async () => {
    const sb = await node.edge.create({ image, network: allowlist() });
    try {
      const bad: Array<[unknown, string, RegExp]> = [
        [{ mode: 'allowlist', allow: [{ host: 'ok.test' }, { host: 'bad..name' }] }, 'network.allow.1.host', /bad\.\.name/],
        [{ mode: 'allowlist', presets: ['npm', 'left-pad'] }, 'network.presets.1', /unknown preset "left-pad"/],
        [{ mode: 'allowlist', allow: [{ host: 'api.test', ports: [443, 70000] }] }, 'network.allow.0.ports.1', /port out of range/],
        [{ mode: 'allowlist', allow: [{ host: '*' }] }, 'network.allow.0.host', /wildcard/],
        [{ mode: 'allowlist', allowAddresses: ['0.0.0.0/0'] }, 'network.allowAddresses.0', /wider than/],
        [{ mode: 'none', allow: [{ host: 'api.test' }] }, 'network.allow', /mode none/],
        [{ mode: 'open' }, 'network.mode', /./],
      ];
      for (const [policy, field, msg] of bad) {
        await assert.rejects(node.edge.setNetwork(sb.id, policy), (e: unknown) => isDsecError(e, 'INVALID_ARGUMENT') && e.details.field === field && msg.test(e.message), JSON.stringify(policy));
      }
      await assert.rejects(node.edge.patchNetwork(sb.id, { presets: { add: ['nope'] } }), (e: unknown) => isDsecError(e, 'INVALID_ARGUMENT') && e.details.field === 'network.presets.add.0');
      await assert.rejects(node.edge.create({ image, network: { mode: 'allowlist', allow: [{ host: 'a b' }] } }), (e: unknown) => isDsecError(e, 'INVALID_ARGUMENT') && e.details.field === 'network.allow.0.host');
      assert.deepEqual(node.edge.networkInfo(sb.id).policy.allow?.map((r) => r.host), ['api.test', '*.assets.test', 'rebind.test']);

      // A change that fails half-way (its policy cannot be saved) leaves the old one in force.
      const saved = path.join(node.home, 'net', `${sb.id}.json.tmp`);
      await mkdir(saved);
      try {
        await assert.rejects(node.edge.patchNetwork(sb.id, { allow: { add: [{ host: 'other.test' }] }, allowAddresses: { add: ['127.0.0.4'] } }));
        assert.equal((await sh(sb.id, 'nslookup other.test')).code === 0, false, 'the new rule is not in force');
        assert.equal((await sh(sb.id, 'nslookup api.test')).code, 0, 'the old rules still are');
        await assert.rejects(node.edge.setNetwork(sb.id, { mode: 'none' }));
        assert.equal((await sh(sb.id, 'nslookup api.test')).code, 0, 'still networked after a failed switch-off');
      } finally {
        await rm(saved, { recursive: true, force: true });
      }
      // And a sandbox that cannot be put on the network stays off it.
      const off = await node.edge.create({ image });
      try {
        await mkdir(path.join(node.home, 'net', `${off.id}.json.tmp`), { recursive: true });
        await assert.rejects(node.edge.setNetwork(off.id, allowlist()));
        assert.equal((await sh(off.id, 'ip -o link | wc -l')).out.trim(), '1', 'no link was left behind');
        assert.deepEqual(node.edge.networkInfo(off.id).policy, { mode: 'none' });
      } finally {
        await rm(path.join(node.home, 'net', `${off.id}.json.tmp`), { recursive: true, force: true });
        await node.edge.destroy(off.id);
      }
    } finally {
      await node.edge.destroy(sb.id);
    }
  });

  test('an edge restart keeps every policy in force and changeable', async () => {
    const sb = await node.edge.create({ image, network: allowlist() });
    const later = await node.edge.create({ image });
    await node.edge.setNetwork(later.id, { mode: 'allowlist', allow: [{ host: 'cdn.assets.test' }], allowAddresses: ['127.0.0.3'] });
    try {
      const edge = await node.restart();
      edge.onEvent((ev) => events.push(ev));
      assert.equal((await sh(sb.id, 'nslookup api.test')).code, 0);
      assert.notEqual((await sh(later.id, 'nslookup api.test')).code, 0);
      assert.equal((await sh(later.id, 'nslookup cdn.assets.test')).code, 0);
      await edge.patchNetwork(later.id, { allow: { add: [{ host: 'api.test' }] }, allowAddresses: { add: ['127.0.0.2'] } });
      assert.equal((await sh(later.id, 'nslookup api.test')).code, 0);
      // Kernel denials are still seen after the restart.
      const gw = edge.networkInfo(sb.id).gateway as string;
      await sh(sb.id, `nc -w 1 ${gw} 23 </dev/null`);
      await waitFor(() => logHas(sb.id, (e) => e.via === 'kernel' && e.port === 23), 'kernel log after restart');
    } finally {
      await node.edge.destroy(sb.id);
      await node.edge.destroy(later.id);
    }
  });

  test('shutdown removes the table, every link and the address claim', async () => {
    const other = await startNode({ network: { hosts: HOSTS, nameservers: [] } });
    let cleaned = false;
    try {
      await other.edge.layers.build({ type: 'busybox' }, { kind: 'base', name: 'busybox' });
      const sb = await other.edge.create({ image, network: allowlist() });
      const gw = other.edge.networkInfo(sb.id).gateway as string;
      assert.notEqual(gw, node.edge.networkInfo((await node.edge.create({ image, network: allowlist() })).id).gateway, 'two homes get different slices');
      const prefix = other.edge.network.ifPrefix;
      const table = other.edge.network.table;
      assert.ok((await readdir('/sys/class/net')).some((l) => l.startsWith(prefix)));
      await other.cleanup();
      cleaned = true;
      assert.deepEqual((await readdir('/sys/class/net')).filter((l) => l.startsWith(prefix)), []);
      assert.ok(!(await nftTables()).includes(table));
      const claims = await readdir('/run/dsec-net').catch(() => [] as string[]);
      for (const c of claims) {
        const owner = await import('node:fs/promises').then((fs) => fs.readFile(path.join('/run/dsec-net', c, 'home'), 'utf8')).catch(() => '');
        assert.notEqual(owner, other.home);
      }
      await access(other.home).then(
        () => assert.fail('home removed'),
        () => undefined,
      );
    } finally {
      if (!cleaned) await other.cleanup();
      for (const s of node.edge.list()) await node.edge.destroy(s.id);
    }
  });
});
