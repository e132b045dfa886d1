// End-to-end tests of sandbox networking: per-sandbox links, the node's nftables table, the DNS
// stub, the egress log and events, live policy changes, restarts and cleanup. Every upstream
// here is started by the test, on loopback or inside a network namespace the test creates.
import assert from 'node:assert/strict';
import { execFile, spawn } from 'node:child_process';
import type { ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import dgram from 'node:dgram';
import { mkdir, mkdtemp, readdir, rm, writeFile, access } from 'node:fs/promises';
import http from 'node:http';
import net from 'node:net';
import tls from 'node:tls';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { after, before, describe, test } from 'node:test';
import { makeCertificate, makeNamespaceLink, removeNamespaceLink } from '@dsec/edge';
import { isDsecError } from '@dsec/protocol';
import type { NetworkPolicy, RaisedEvent } from '@dsec/protocol';
import type { EgressLogEntry } from '@dsec/protocol';
import { parsed, patchNetwork, startNode } from './helpers/node.js';
import type { TestNode } from './helpers/node.js';

const run = promisify(execFile);

/** Loopback addresses of this run's upstreams (a /24 of 127/8 of its own, so runs do not collide). */
const NET = `127.${1 + ((randomBytes(1)[0] ?? 0) % 250)}.${randomBytes(1)[0] ?? 0}`;
const API = `${NET}.2`;
const CDN = `${NET}.3`;
const OTHER = `${NET}.4`;
const REGISTRY = `${NET}.5`;
/** Names the node resolves without asking anyone (no query ever leaves the machine). */
const HOSTS = { 'api.test': API, 'cdn.assets.test': CDN, 'other.test': OTHER, 'rebind.test': '127.0.0.1' };

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
let altDns: Awaited<ReturnType<typeof startAlternatingDns>>;

async function startUpstream(dir: string): Promise<Upstream> {
  const tag = randomBytes(3).toString('hex');
  const name = `dsec-test-${tag}`;
  const hostIf = `dtu${tag}`;
  const octet = 1 + (parseInt(tag, 16) % 250);
  const hostAddress = `10.214.${octet}.1`;
  const address = `10.214.${octet}.2`;
  const link = { ns: name, hostIf, hostAddress, address };
  await makeNamespaceLink(link, { defaultRoute: true });
  const procs: ChildProcess[] = [];
  const close = async (): Promise<void> => {
    for (const p of procs) p.kill('SIGKILL');
    await removeNamespaceLink(link);
  };
  try {
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
    await waitFor(async () => await udpProbe(address, 53), 'upstream udp');
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

/**
 * A resolver on loopback that answers A questions for `name` from `answers` in turn, with TTL 0
 * (so nobody caches), and NXDOMAIN for anything else: DNS rebinding, as an attacker runs it.
 */
/** `asked()`: every query it received, for any name. */
async function startAlternatingDns(name: string, answers: string[]): Promise<{ port: number; asked: () => number; close: () => Promise<void> }> {
  const sock = dgram.createSocket('udp4');
  let n = 0;
  let queries = 0;
  sock.on('message', (msg, rinfo) => {
    queries++;
    if (msg.length < 17) return;
    let off = 12;
    const labels: string[] = [];
    while (off < msg.length && msg[off] !== 0) {
      const len = msg[off] as number;
      labels.push(msg.subarray(off + 1, off + 1 + len).toString('latin1'));
      off += len + 1;
    }
    const question = msg.subarray(12, off + 5);
    const header = Buffer.from(msg.subarray(0, 12));
    const wanted = labels.join('.').toLowerCase() === name && msg.readUInt16BE(off + 1) === 1;
    header.writeUInt16BE(0x8180 | (wanted ? 0 : 3), 2);
    header.writeUInt16BE(1, 4);
    header.writeUInt16BE(wanted ? 1 : 0, 6);
    header.writeUInt32BE(0, 8);
    const parts = [header, question];
    if (wanted) {
      const ip = answers[n++ % answers.length] as string;
      parts.push(Buffer.from([0xc0, 0x0c, 0, 1, 0, 1, 0, 0, 0, 0, 0, 4, ...ip.split('.').map(Number)]));
    }
    sock.send(Buffer.concat(parts), rinfo.port, rinfo.address);
  });
  await new Promise<void>((resolve) => sock.bind(0, '127.0.0.1', resolve));
  return { port: sock.address().port, asked: () => queries, close: () => new Promise<void>((resolve) => sock.close(() => resolve())) };
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

const allowlist = (extra: Partial<NetworkPolicy> = {}): NetworkPolicy => ({
  mode: 'allowlist',
  allow: [{ host: 'api.test' }, { host: '*.assets.test' }, { host: 'rebind.test' }],
  allowAddresses: [API, CDN],
  ...extra,
});

async function logHas(id: string, pred: (e: EgressLogEntry) => boolean): Promise<boolean> {
  return (await node.edge.networkLog(id)).some(pred);
}

async function nftTables(): Promise<string> {
  return (await run('nft', ['list', 'tables'])).stdout;
}

/** The loopback upstreams the proxy dials, and what each of them saw. */
interface Servers {
  /** SNI names the TLS upstream was asked for. */
  sni: string[];
  /** Open connections of the echo upstream (for CONNECT tunnels). */
  echo: Set<net.Socket>;
  /** Requests that reached a service on the host's own loopback (must stay empty). */
  hostHits: string[];
  hostServicePort: number;
  registryOrigin: string;
  close(): Promise<void>;
}

let servers: Servers;

async function listen(server: net.Server, port: number, host: string): Promise<number> {
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, host, () => resolve());
  });
  return (server.address() as net.AddressInfo).port;
}

/** A day-granular npm packument: 1.0.0 from 2020, 2.0.0 from 2025. */
function packument(origin: string): object {
  const v = (version: string) => ({ name: 'left-pad', version, dist: { tarball: `${origin}/left-pad/-/left-pad-${version}.tgz`, shasum: '0'.repeat(40) } });
  return {
    name: 'left-pad',
    'dist-tags': { latest: '2.0.0' },
    versions: { '1.0.0': v('1.0.0'), '2.0.0': v('2.0.0') },
    time: {
      created: '2020-01-01T00:00:00.000Z',
      modified: '2025-06-01T00:00:00.000Z',
      '1.0.0': '2020-01-01T00:00:00.000Z',
      '2.0.0': '2025-06-01T00:00:00.000Z',
    },
  };
}

async function startServers(): Promise<Servers> {
  const all: net.Server[] = [];
  const echo = new Set<net.Socket>();
  const sni: string[] = [];
  const hostHits: string[] = [];
  const hello: http.RequestListener = (req, res) => res.end(`hello ${req.headers.host} ${req.url}\n`);
  all.push(http.createServer(hello), http.createServer(hello));
  await listen(all[0] as net.Server, 80, API);
  await listen(all[1] as net.Server, 80, OTHER);
  const echoServer = net.createServer((s) => {
    echo.add(s);
    s.on('close', () => echo.delete(s));
    s.on('error', () => undefined);
    s.pipe(s);
  });
  all.push(echoServer);
  await listen(echoServer, 8080, API);
  const { key, cert } = await makeCertificate('api.test');
  const tlsServer = tls.createServer(
    {
      key,
      cert,
      SNICallback: (name, cb) => {
        sni.push(name);
        cb(null, undefined);
      },
    },
    (s) => s.end('hello-tls\n'),
  );
  tlsServer.on('tlsClientError', () => undefined);
  all.push(tlsServer);
  await listen(tlsServer, 443, API);
  const hostService = http.createServer((req, res) => {
    hostHits.push(`${req.headers.host} ${req.url}`);
    res.end('host service\n');
  });
  all.push(hostService);
  const hostServicePort = await listen(hostService, 0, '127.0.0.1');
  const registry = http.createServer((req, res) => {
    if (req.url === '/left-pad') return res.end(JSON.stringify(packument(registryOrigin)));
    res.statusCode = 404;
    res.end('{}');
  });
  all.push(registry);
  const registryOrigin = `http://${REGISTRY}:${await listen(registry, 0, REGISTRY)}`;
  return {
    sni,
    echo,
    hostHits,
    hostServicePort,
    registryOrigin,
    async close() {
      for (const s of echo) s.destroy();
      await Promise.all(all.map((srv) => new Promise((r) => srv.close(r))));
    },
  };
}

before(async () => {
  scratch = await mkdtemp(path.join(os.tmpdir(), 'dsec-scratch-'));
  servers = await startServers();
  upstream = await startUpstream(scratch);
  // alt.test answers in turn with the upstream's address and with the node's own loopback.
  altDns = await startAlternatingDns('alt.test', [upstream.address, '127.0.0.1']);
  node = await startNode({
    network: {
      hosts: HOSTS,
      nameservers: [`127.0.0.1:${altDns.port}`],
      mirrors: { origins: [servers.registryOrigin] },
      // The operator's setting: the upstream's private address may be reached by allowed names.
      allowedPrivateRanges: [`${upstream.address}/32`],
    },
  });
  node.edge.onEvent((ev) => events.push(ev));
  await node.edge.layers.build({ type: 'busybox' }, { kind: 'base', name: 'busybox' });
});

after(async () => {
  await altDns?.close();
  await upstream?.close();
  await servers?.close();
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
      assert.deepEqual((await node.edge.networkInfo(sb.id)).policy, { mode: 'none' });
      assert.ok(!(await nftTables()).includes(node.edge.network.table), 'no table before a networked sandbox');
    } finally {
      await node.edge.destroy(sb.id);
    }
  });

  test('an allowlist sandbox gets a link, resolv.conf, and DNS answers for allowed names only', async () => {
    const sb = await node.edge.create({ image, network: allowlist() });
    try {
      const info = await node.edge.networkInfo(sb.id);
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
      assert.ok(await logHas(sb.id, (e) => e.via === 'dns' && e.host === 'api.test' && e.verdict === 'allowed' && e.rule === 'allow:api.test'));
      assert.ok(await logHas(sb.id, (e) => e.via === 'dns' && e.host === 'rebind.test' && e.verdict === 'denied' && e.address === '127.0.0.1'));
      assert.ok(await logHas(sb.id, (e) => e.via === 'dns' && e.host === 'other.test' && e.verdict === 'denied'));
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
      const gw = (await node.edge.networkInfo(a.id)).gateway as string;
      const bAddr = (await node.edge.networkInfo(b.id)).address as string;
      // Controls: the host reaches both of its own services on the gateway address.
      await new Promise<void>((resolve, reject) => net.connect(tcpPort, gw, resolve).on('error', reject));
      assert.equal(seen.shift(), 'tcp');
      const bListens = await node.edge.spawn(b.id, { cmd: 'nc -l -p 8080 > /tmp/got' });

      const attempts: Array<[string, string, (e: EgressLogEntry) => boolean]> = [
        ['host service on the gateway', `nc -w 1 ${gw} ${tcpPort} </dev/null`, (e) => e.host === gw && e.port === tcpPort && e.protocol === 'tcp'],
        ['gateway ssh port', `nc -w 1 ${gw} 22 </dev/null`, (e) => e.host === gw && e.port === 22],
        ['UDP to a host port', `echo hi | tftp -p -l /etc/hostname -r x ${gw} ${udpPort}`, (e) => e.host === gw && e.port === udpPort && e.protocol === 'udp'],
        ['another sandbox', `echo secret | nc -w 1 ${bAddr} 8080`, (e) => e.host === bAddr && e.port === 8080],
        [
          'a host by IP, another port',
          `printf 'GET /ok.txt HTTP/1.0\\r\\n\\r\\n' | nc -w 1 ${upstream.address} 9000`,
          (e) => e.host === upstream.address && e.port === 9000,
        ],
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
      assert.ok((await node.edge.networkInfo(a.id)).stats.denied >= attempts.length);
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
      const on = await node.edge.setNetwork(sb.id, { mode: 'allowlist', allow: [{ host: 'api.test' }], allowAddresses: [API] });
      assert.equal(on.policy.mode, 'allowlist');
      const r1 = await sh(sb.id, 'cat /etc/resolv.conf; nslookup api.test && ! nslookup cdn.assets.test');
      assert.equal(r1.code, 0, r1.out);

      const patched = await patchNetwork(node.edge, sb.id, {
        allow: { add: [{ host: '*.assets.test', ports: [443] }], remove: ['api.test'] },
        allowAddresses: { add: [CDN] },
      });
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
        await assert.rejects(
          async () => node.edge.setNetwork(sb.id, parsed.network(policy)),
          (e: unknown) => isDsecError(e, 'INVALID_ARGUMENT') && e.details.field === field && msg.test(e.message),
          JSON.stringify(policy),
        );
      }
      await assert.rejects(
        async () => patchNetwork(node.edge, sb.id, { presets: { add: ['nope'] } }),
        (e: unknown) => isDsecError(e, 'INVALID_ARGUMENT') && e.details.field === 'network.presets.add.0',
      );
      await assert.rejects(
        async () => node.edge.create(parsed.sandbox({ image, network: { mode: 'allowlist', allow: [{ host: 'a b' }] } })),
        (e: unknown) => isDsecError(e, 'INVALID_ARGUMENT') && e.details.field === 'network.allow.0.host',
      );
      assert.deepEqual(
        (await node.edge.networkInfo(sb.id)).policy.allow?.map((r) => r.host),
        ['api.test', '*.assets.test', 'rebind.test'],
      );

      // A change that fails half-way (its policy cannot be saved) leaves the old one in force.
      const saved = path.join(node.home, 'net', `${sb.id}.json.tmp`);
      await mkdir(saved);
      try {
        await assert.rejects(async () => patchNetwork(node.edge, sb.id, { allow: { add: [{ host: 'other.test' }] }, allowAddresses: { add: [OTHER] } }));
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
        assert.deepEqual((await node.edge.networkInfo(off.id)).policy, { mode: 'none' });
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
    await node.edge.setNetwork(later.id, { mode: 'allowlist', allow: [{ host: 'cdn.assets.test' }], allowAddresses: [CDN] });
    try {
      const edge = await node.restart();
      edge.onEvent((ev) => events.push(ev));
      assert.equal((await sh(sb.id, 'nslookup api.test')).code, 0);
      assert.notEqual((await sh(later.id, 'nslookup api.test')).code, 0);
      assert.equal((await sh(later.id, 'nslookup cdn.assets.test')).code, 0);
      await patchNetwork(edge, later.id, { allow: { add: [{ host: 'api.test' }] }, allowAddresses: { add: [API] } });
      assert.equal((await sh(later.id, 'nslookup api.test')).code, 0);
      // Kernel denials are still seen after the restart.
      const gw = (await edge.networkInfo(sb.id)).gateway as string;
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
      const gw = (await other.edge.networkInfo(sb.id)).gateway as string;
      assert.notEqual(
        gw,
        (await node.edge.networkInfo((await node.edge.create({ image, network: allowlist() })).id)).gateway,
        'two homes get different slices',
      );
      const prefix = other.edge.network.ifPrefix;
      const table = other.edge.network.table;
      assert.ok((await readdir('/sys/class/net')).some((l) => l.startsWith(prefix)));
      await other.cleanup();
      cleaned = true;
      assert.deepEqual(
        (await readdir('/sys/class/net')).filter((l) => l.startsWith(prefix)),
        [],
      );
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
      for (const s of await node.edge.list()) await node.edge.destroy(s.id);
    }
  });
});

/** A TLS 1.2 ClientHello (what a client sends first), with `sni` as its server_name when given. */
function clientHello(sni?: string): Buffer {
  const u8 = (n: number): Buffer => Buffer.from([n]);
  const u16 = (n: number): Buffer => Buffer.from([n >> 8, n & 255]);
  const u24 = (n: number): Buffer => Buffer.from([n >> 16, (n >> 8) & 255, n & 255]);
  const ext = (type: number, body: Buffer): Buffer => Buffer.concat([u16(type), u16(body.length), body]);
  const list16 = (items: number[]): Buffer => Buffer.concat([u16(items.length * 2), ...items.map(u16)]);
  const exts: Buffer[] = [];
  if (sni !== undefined) {
    const name = Buffer.from(sni);
    exts.push(ext(0x0000, Buffer.concat([u16(name.length + 3), u8(0), u16(name.length), name])));
  }
  exts.push(ext(0x000a, list16([0x001d, 0x0017, 0x0018])));
  exts.push(ext(0x000b, Buffer.from([1, 0])));
  exts.push(ext(0x000d, list16([0x0403, 0x0804, 0x0401, 0x0503, 0x0805, 0x0501])));
  const extensions = Buffer.concat(exts);
  const body = Buffer.concat([
    u16(0x0303),
    randomBytes(32),
    u8(0),
    list16([0xc02b, 0xc02f, 0xc02c, 0xc030, 0x009c, 0x002f]),
    u8(1),
    u8(0),
    u16(extensions.length),
    extensions,
  ]);
  const handshake = Buffer.concat([u8(1), u24(body.length), body]);
  return Buffer.concat([u8(0x16), u16(0x0301), u16(handshake.length), handshake]);
}

/** An HTTP request line and headers, as a printf format for the sandbox's shell. */
const req = (target: string, host: string): string => `${target} HTTP/1.1\\r\\nHost: ${host}\\r\\nConnection: close\\r\\n\\r\\n`;
/** Sends `request` to host:port with nc, keeping the write side open while the answer comes. */
const ncSend = (request: string, host: string, port: number | string, holdS = 1): string => `(printf '${request}'; sleep ${holdS}) | nc -w 3 ${host} ${port}`;

describe('sandbox networks through the egress proxy', () => {
  const policy = (): NetworkPolicy => ({
    mode: 'allowlist',
    allow: [
      { host: 'api.test', ports: [80, 443, 8080] },
      { host: 'rebind.test', ports: [servers.hostServicePort] },
    ],
    allowAddresses: [API],
  });

  test('an allowed name works through explicit and transparent proxying (HTTP and TLS by SNI); a denied one fails', async () => {
    const sb = await node.edge.create({ image, network: policy() });
    try {
      const gw = (await node.edge.networkInfo(sb.id)).gateway as string;
      const env = await sh(sb.id, 'echo $HTTP_PROXY');
      assert.equal(env.out.trim(), `http://${gw}:3128`);

      const explicit = await sh(sb.id, ncSend(req('GET http://api.test/x', 'api.test'), gw, 3128));
      assert.match(explicit.out, /^HTTP\/1\.1 200/);
      assert.match(explicit.out, /hello api\.test \/x/);
      const tunnel = await sh(
        sb.id,
        `(printf 'CONNECT api.test:8080 HTTP/1.1\\r\\nHost: api.test:8080\\r\\n\\r\\n'; sleep 0.5; printf 'ping-through-tunnel'; sleep 1) | nc -w 3 ${gw} 3128`,
      );
      assert.match(tunnel.out, /^HTTP\/1\.1 200/);
      assert.match(tunnel.out, /ping-through-tunnel/);
      assert.match((await sh(sb.id, ncSend(req('GET http://other.test/', 'other.test'), gw, 3128))).out, /^HTTP\/1\.1 403/);
      assert.match((await sh(sb.id, `(printf 'CONNECT api.test:22 HTTP/1.1\\r\\n\\r\\n'; sleep 1) | nc -w 3 ${gw} 3128`)).out, /^HTTP\/1\.1 403/);

      // Transparent: a program that ignores HTTP_PROXY (--noproxy) still goes through the proxy,
      // whatever address it dials; the Host header decides.
      const direct = await sh(sb.id, ncSend(req('GET /y', 'api.test'), 'api.test', 80));
      assert.match(direct.out, /hello api\.test \/y/);
      const anyAddress = await sh(sb.id, ncSend(req('GET /z', 'api.test'), upstream.address, 80));
      assert.match(anyAddress.out, /hello api\.test \/z/, 'a connection to another address on port 80 is intercepted');
      assert.match((await sh(sb.id, ncSend(req('GET /', 'other.test'), upstream.address, 80))).out, /^HTTP\/1\.1 403/);
      assert.equal(await httpGet(upstream.address, 80, '/ok.txt'), 'upstream-ok\n', 'the address dialled was never reached: its server is there');

      // TLS by SNI, not terminated: the upstream answers the sandbox's ClientHello itself.
      await node.edge.writeFile(sb.id, '/tmp/hello-api', clientHello('api.test'));
      await node.edge.writeFile(sb.id, '/tmp/hello-other', clientHello('other.test'));
      await node.edge.writeFile(sb.id, '/tmp/hello-none', clientHello());
      const first = (file: string): string => `(cat ${file}; sleep 1) | nc -w 3 ${upstream.address} 443 | head -c 3 | od -An -tx1`;
      assert.equal((await sh(sb.id, first('/tmp/hello-api'))).out.trim(), '16 03 03', 'a ServerHello from the upstream');
      assert.ok(servers.sni.includes('api.test'));
      assert.equal((await sh(sb.id, first('/tmp/hello-other'))).out.trim().slice(0, 2), '15', 'a TLS alert from the proxy');
      assert.equal((await sh(sb.id, first('/tmp/hello-none'))).out.trim().slice(0, 2), '15', 'no SNI: refused');
      assert.ok(!servers.sni.includes('other.test'));

      const info = await node.edge.networkInfo(sb.id);
      assert.ok(info.stats.bytesIn > 0 && info.stats.bytesOut > 0, JSON.stringify(info.stats));
      for (const via of ['http', 'connect', 'transparent-http', 'transparent-tls']) {
        assert.ok(await logHas(sb.id, (e) => e.via === via && e.verdict === 'allowed' && e.host === 'api.test'), `${via} allowed`);
        assert.ok(await logHas(sb.id, (e) => e.via === via && e.verdict === 'denied'), `${via} denied`);
      }
    } finally {
      await node.edge.destroy(sb.id);
    }
  });

  test("IP literals, DNS rebinding to 127.0.0.1 and the host's loopback services are refused", async () => {
    const sb = await node.edge.create({ image, network: policy() });
    try {
      const gw = (await node.edge.networkInfo(sb.id)).gateway as string;
      const port = servers.hostServicePort;
      const refused: Array<[string, string]> = [
        ['explicit GET to an IP literal', ncSend(req(`GET http://127.0.0.1:${port}/`, `127.0.0.1:${port}`), gw, 3128)],
        ['CONNECT to an IP literal', `(printf 'CONNECT 127.0.0.1:${port} HTTP/1.1\\r\\n\\r\\n'; sleep 1) | nc -w 3 ${gw} 3128`],
        ['CONNECT to the gateway', `(printf 'CONNECT ${gw}:53 HTTP/1.1\\r\\n\\r\\n'; sleep 1) | nc -w 3 ${gw} 3128`],
        ['an IP literal in Host', ncSend(req('GET /', `127.0.0.1:${port}`), gw, 80)],
        ['a numeric shorthand in Host', ncSend(req('GET /', `2130706433:${port}`), gw, 80)],
        ['a hex shorthand in Host', ncSend(req('GET /', `0x7f.1:${port}`), gw, 80)],
        ['a short dotted form in Host', ncSend(req('GET /', `127.1:${port}`), gw, 80)],
        ['IPv6 loopback in Host', ncSend(req('GET /', `[::1]:${port}`), gw, 80)],
        ...[
          '0x7f.1',
          '127.1',
          '0177.0.0.1',
          '2130706433',
          '[::1]',
          '[::ffff:127.0.0.1]',
          '[::ffff:7f00:1]',
          '[64:ff9b::7f00:1]',
          '[fe80::1]',
          '[fc00::1]',
          '169.254.169.254',
          '[::ffff:169.254.169.254]',
          '10.213.0.1',
        ].map((h): [string, string] => [`explicit GET to ${h}`, ncSend(req(`GET http://${h}:${port}/`, `${h}:${port}`), gw, 3128)]),
        ...['[::ffff:127.0.0.1]', '0x7f.1', '[64:ff9b::7f00:1]'].map((h): [string, string] => [
          `CONNECT to ${h}`,
          `(printf 'CONNECT ${h}:${port} HTTP/1.1\\r\\n\\r\\n'; sleep 1) | nc -w 3 ${gw} 3128`,
        ]),
        ['a name rebinding to 127.0.0.1', ncSend(req(`GET http://rebind.test:${port}/`, `rebind.test:${port}`), gw, 3128)],
      ];
      // All at once (each holds its connection ~1 s), then each answer checked.
      const script = refused.map(([, cmd], i) => `(${cmd}) > /tmp/refused-${i} 2>&1 &`).join('\n') + '\nwait';
      await sh(sb.id, script);
      for (const [i, [what]] of refused.entries()) assert.match((await sh(sb.id, `cat /tmp/refused-${i}`)).out, /^HTTP\/1\.1 40[03]/, what);
      await node.edge.writeFile(sb.id, '/tmp/hello-ip', clientHello('127.0.0.1'));
      assert.equal((await sh(sb.id, `(cat /tmp/hello-ip; sleep 1) | nc -w 3 ${gw} 443 | head -c 1 | od -An -tx1`)).out.trim(), '15', 'an IP literal in SNI');
      assert.deepEqual(servers.hostHits, [], 'the host service saw nothing');
      assert.ok(await logHas(sb.id, (e) => e.host === 'rebind.test' && e.verdict === 'denied' && /restricted-address/.test(e.reason ?? '')));
      assert.ok(await logHas(sb.id, (e) => e.host === '127.0.0.1' && e.verdict === 'denied' && /ip-literal/.test(e.reason ?? '')));
      // Every spelling is logged as the address it means, with its class.
      assert.ok(await logHas(sb.id, (e) => e.host === '169.254.169.254' && /ip-literal: a link-local/.test(e.reason ?? '')));
      assert.ok(await logHas(sb.id, (e) => e.host === '::1' && /ip-literal: a loopback IPv6/.test(e.reason ?? '')));
    } finally {
      await node.edge.destroy(sb.id);
    }
  });

  test('a policy patch on a running sandbox applies to new connections and closes open ones it denies', async () => {
    const sb = await node.edge.create({ image, network: policy() });
    try {
      const gw = (await node.edge.networkInfo(sb.id)).gateway as string;
      const before = servers.echo.size;
      const held = await node.edge.spawn(sb.id, { cmd: `(printf 'CONNECT api.test:8080 HTTP/1.1\\r\\n\\r\\n'; sleep 60) | nc ${gw} 3128` });
      await waitFor(() => servers.echo.size > before, 'the tunnel to open');
      assert.match((await sh(sb.id, ncSend(req('GET http://other.test/', 'other.test'), gw, 3128))).out, /^HTTP\/1\.1 403/);

      const t0 = Date.now();
      await patchNetwork(node.edge, sb.id, { allow: { remove: ['api.test'], add: [{ host: 'other.test' }] }, allowAddresses: { add: [OTHER] } });
      await waitFor(() => servers.echo.size === before, 'the tunnel to close', 5000);
      // The sandbox's side of the tunnel ended too (its nc exited), long before its 60 s input.
      await waitFor(async () => (await sh(sb.id, 'ps -o comm | grep -cx nc')).out.trim() === '0', 'nc to exit', 5000);
      assert.ok(Date.now() - t0 < 10_000);
      await held.kill('SIGKILL');
      assert.match((await sh(sb.id, ncSend(req('GET http://other.test/now', 'other.test'), gw, 3128))).out, /hello other\.test \/now/);
      assert.match((await sh(sb.id, ncSend(req('GET http://api.test/', 'api.test'), gw, 3128))).out, /^HTTP\/1\.1 403/);
      assert.ok(await logHas(sb.id, (e) => e.host === 'api.test' && e.port === 8080 && /policy-changed/.test(e.reason ?? '')));
    } finally {
      await node.edge.destroy(sb.id);
    }
  });

  test('a name whose answers alternate between an allowed address and 127.0.0.1 (no cache: TTL 0) never reaches the node', async () => {
    const port = servers.hostServicePort;
    // The upstream serves on the same port as the node's own service, so only the address decides.
    const www = path.join(scratch, 'www');
    upstream.procs.push(spawn('ip', ['netns', 'exec', upstream.name, 'busybox', 'httpd', '-f', '-p', String(port), '-h', www], { stdio: 'ignore' }));
    await waitFor(async () => (await httpGet(upstream.address, port, '/ok.txt').catch(() => '')) === 'upstream-ok\n', 'upstream httpd on the host port');
    const sb = await node.edge.create({ image, network: { mode: 'allowlist', allow: [{ host: 'alt.test', ports: [port] }] } });
    try {
      const gw = (await node.edge.networkInfo(sb.id)).gateway as string;
      const asked = altDns.asked();
      const script = Array.from(
        { length: 8 },
        (_, i) => `${ncSend(req(`GET http://alt.test:${port}/ok.txt`, `alt.test:${port}`), gw, 3128, 2)} > /tmp/alt-${i} 2>&1`,
      ).join('\n');
      await sh(sb.id, script);
      const outs = await Promise.all(Array.from({ length: 8 }, async (_, i) => (await sh(sb.id, `cat /tmp/alt-${i}`)).out));
      assert.ok(altDns.asked() - asked >= 8, 'every connection looked the name up again');
      const reached = outs.filter((o) => /^HTTP\/1\.[01] 200/.test(o) && o.includes('upstream-ok')).length;
      const refused = outs.filter((o) => /^HTTP\/1\.1 403/.test(o) && /restricted-address/.test(o)).length;
      assert.ok(reached >= 1 && refused >= 1 && reached + refused === 8, outs.join('\n---\n'));
      assert.deepEqual(servers.hostHits, [], "the node's own service saw nothing");
      assert.ok(await logHas(sb.id, (e) => e.host === 'alt.test' && e.verdict === 'allowed' && e.address === upstream.address));
      assert.ok(await logHas(sb.id, (e) => e.host === 'alt.test' && e.verdict === 'denied' && /restricted-address/.test(e.reason ?? '')));
    } finally {
      await node.edge.destroy(sb.id);
    }
  });

  test('the DNS stub refuses names that are no host names before any policy check or lookup', async () => {
    const sb = await node.edge.create({ image, network: { mode: 'allowlist', allow: [{ host: '*.test' }] } });
    try {
      const gw = (await node.edge.networkInfo(sb.id)).gateway as string;
      const asked = altDns.asked();
      /** A DNS query over TCP (length-prefixed) for raw labels. */
      const framed = (labels: string[]): Buffer => {
        const q = Buffer.concat([
          Buffer.from([0xab, 0xcd, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]),
          ...labels.map((l) => Buffer.concat([Buffer.from([Buffer.byteLength(l, 'latin1')]), Buffer.from(l, 'latin1')])),
          Buffer.from([0, 0, 1, 0, 1]),
        ]);
        return Buffer.concat([Buffer.from([q.length >> 8, q.length & 255]), q]);
      };
      const bad = [['alt\0x', 'test'], ['alt.test', 'test'], ['a\\046b', 'test'], ['x'.repeat(63), 'al_t', 'test'], ['2130706433']];
      for (const [i, labels] of bad.entries()) await node.edge.writeFile(sb.id, `/tmp/q-${i}`, framed(labels));
      for (const i of bad.keys()) {
        // The answer's flags end in rcode 5 (REFUSED): bytes 2-3 of the TCP frame are the id, 4-5 the flags.
        const out = (await sh(sb.id, `(cat /tmp/q-${i}; sleep 1) | nc -w 3 ${gw} 53 | od -An -tx1 | head -1`)).out.trim().split(/\s+/);
        assert.equal(out[5], '85', `${JSON.stringify(bad[i])}: ${out.join(' ')}`);
      }
      assert.notEqual((await sh(sb.id, 'nslookup al_t.test')).code, 0);
      assert.equal(altDns.asked(), asked, 'no lookup left the node');
      const log = (await node.edge.networkLog(sb.id)).filter((e) => e.via === 'dns');
      assert.ok(log.length >= bad.length + 1 && log.every((e) => e.verdict === 'denied' && /^bad-name: /.test(e.reason ?? '')), JSON.stringify(log));
      assert.ok(
        log.some((e) => e.host === 'alt\\u0000x.test'),
        'a NUL is logged escaped',
      );
    } finally {
      await node.edge.destroy(sb.id);
    }
  });

  test('an unfrozen mirror refuses paths that would leave its upstream (the SSRF to loopback on main), and logs them as denials', async () => {
    const sb = await node.edge.create({ image, network: { mode: 'allowlist', presets: ['npm'], mirrors: { npm: { upstream: servers.registryOrigin } } } });
    try {
      const gw = (await node.edge.networkInfo(sb.id)).gateway as string;
      const target = `127.0.0.1:${servers.hostServicePort}`;
      const paths = [
        `///${target}/secret`,
        `//${target}/secret`,
        `/%2f%2f${target}/secret`,
        `/-//${target}/secret`,
        `/http:%2f%2f${target}%2fsecret`,
        `/user@${target}/secret`,
        '/left-pad/..%2f..%2fsecret',
      ];
      // printf reads % as a conversion: the paths' escapes go as %%.
      const script =
        paths
          .map((p, i) => `${ncSend(req(`GET http://registry.npmjs.org${p.replace(/%/g, '%%')}`, 'registry.npmjs.org'), gw, 3128)} > /tmp/m-${i} 2>&1 &`)
          .join('\n') + '\nwait';
      await sh(sb.id, script);
      for (const [i, p] of paths.entries()) assert.match((await sh(sb.id, `cat /tmp/m-${i}`)).out, /^HTTP\/1\.1 403/, p);
      assert.deepEqual(servers.hostHits, [], 'nothing was fetched from loopback');
      const denials = (await node.edge.networkLog(sb.id)).filter((e) => e.via === 'mirror' && e.verdict === 'denied' && /^mirror-path/.test(e.reason ?? ''));
      assert.equal(denials.length, paths.length);
      const ok = await sh(sb.id, ncSend(req('GET http://registry.npmjs.org/left-pad', 'registry.npmjs.org'), gw, 3128, 2));
      assert.match(ok.out, /^HTTP\/1\.1 200/, 'a real package path is still served');
    } finally {
      await node.edge.destroy(sb.id);
    }
  });

  test('a frozen npm mirror hides a version newer than its cutoff (local fake registry)', async () => {
    const sb = await node.edge.create({
      image,
      network: { mode: 'allowlist', presets: ['npm'], mirrors: { npm: { upstream: servers.registryOrigin, freeze: '2023-01-01' } } },
    });
    try {
      const gw = (await node.edge.networkInfo(sb.id)).gateway as string;
      assert.equal((await sh(sb.id, 'echo $npm_config_registry')).out.trim(), 'http://registry.npmjs.org/');
      const r = await sh(sb.id, ncSend(req('GET http://registry.npmjs.org/left-pad', 'registry.npmjs.org'), gw, 3128, 2));
      assert.match(r.out, /^HTTP\/1\.1 200/, r.out);
      const body = JSON.parse(r.out.slice(r.out.indexOf('\r\n\r\n') + 4)) as { versions: Record<string, unknown>; 'dist-tags': Record<string, string> };
      assert.deepEqual(Object.keys(body.versions), ['1.0.0']);
      assert.equal(body['dist-tags'].latest, '1.0.0');
      // Transparent HTTP to the registry name is served by the mirror too; TLS to it is refused.
      const t = await sh(sb.id, ncSend(req('GET /left-pad', 'registry.npmjs.org'), 'registry.npmjs.org', 80, 2));
      assert.doesNotMatch(t.out, /2\.0\.0/);
      await node.edge.writeFile(sb.id, '/tmp/hello-npm', clientHello('registry.npmjs.org'));
      assert.equal((await sh(sb.id, `(cat /tmp/hello-npm; sleep 1) | nc -w 3 ${gw} 443 | head -c 1 | od -An -tx1`)).out.trim(), '15');
    } finally {
      await node.edge.destroy(sb.id);
    }
  });
});
