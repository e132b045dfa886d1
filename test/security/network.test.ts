// Adversarial suite: the network under the default policy (`none`: a network namespace with
// loopback only). Port scans of the host's loopback, its addresses, its gateway and other
// sandboxes; UDP and DNS egress; the host's abstract unix sockets. Allowlist policies and the
// egress proxy have their own tests (see docs/security.md).
//
// Traffic rule: every connection here is aimed at loopback, or is tried only after the test has
// checked that the sandbox has no route at all, so that nothing can leave the machine even if a
// defence were missing.
import assert from 'node:assert/strict';
import { readFile } from 'node:fs/promises';
import net from 'node:net';
import os from 'node:os';
import { randomBytes } from 'node:crypto';
import { after, afterEach, before, describe, test } from 'node:test';
import { KIT, probe, probes, startSecurityNode } from './fixture.js';
import type { SecurityNode } from './fixture.js';

let sec: SecurityNode;
let attacker: string;
/** Listeners on the host's loopback, counting the connections they get. */
const hostListeners: Array<{ host: string; port: number; server: net.Server; connections: number }> = [];
let abstractServer: net.Server;
let abstractName: string;
let abstractConnections = 0;

async function listen(host: string): Promise<void> {
  const entry = { host, port: 0, server: net.createServer(), connections: 0 };
  entry.server.on('connection', (s) => {
    entry.connections++;
    s.destroy();
  });
  await new Promise<void>((resolve, reject) => {
    entry.server.once('error', reject);
    entry.server.listen(0, host, () => resolve());
  });
  entry.port = (entry.server.address() as net.AddressInfo).port;
  hostListeners.push(entry);
}

before(async () => {
  sec = await startSecurityNode();
  attacker = await sec.sandbox();
  await listen('127.0.0.1');
  await listen('::1');
  abstractName = `dsec-attack-${randomBytes(6).toString('hex')}`;
  abstractServer = net.createServer((s) => {
    abstractConnections++;
    s.destroy();
  });
  await new Promise<void>((resolve) => abstractServer.listen(`\0${abstractName}`, resolve));
});

after(async () => {
  for (const l of hostListeners) l.server.close();
  abstractServer?.close();
  await sec?.cleanup();
});

afterEach(async () => {
  await sec.verifyContained();
});

/** The host's own addresses, its default gateway and its DNS servers: where answers could come from. */
async function hostTargets(): Promise<string[]> {
  const targets = new Set<string>();
  for (const addrs of Object.values(os.networkInterfaces())) {
    for (const a of addrs ?? []) if (!a.internal && !a.address.startsWith('fe80')) targets.add(a.address);
  }
  for (const line of (await readFile('/proc/net/route', 'utf8')).split('\n').slice(1)) {
    const [, dest, gw] = line.split('\t');
    if (dest === '00000000' && gw && gw !== '00000000') targets.add(Buffer.from(gw, 'hex').reverse().join('.'));
  }
  const resolv = await readFile('/etc/resolv.conf', 'utf8').catch(() => '');
  for (const m of resolv.matchAll(/^nameserver\s+(\S+)/gm)) if (m[1] && !m[1].startsWith('127.') && m[1] !== '::1') targets.add(m[1]);
  return [...targets];
}

/** Asserts the precondition of every egress attempt below: loopback is the only interface and no route exists. */
async function assertNoRoute(id: string): Promise<void> {
  const r = await sec.sh(
    id,
    'ls /sys/class/net; echo --; ip -4 route show table all | grep -v "^local\\|^broadcast"; echo --; ip -6 route show table all | grep -v "^local\\|^multicast\\|^anycast\\|^::1 \\|^fe80"',
  );
  assert.equal(r.stdout, 'lo\n--\n--\n', `the sandbox's network must be loopback only:\n${r.stdout}`);
}

describe('network, default policy (none)', () => {
  test('the sandbox has loopback only: one interface, no route to anywhere', async () => {
    await assertNoRoute(attacker);
  });

  test("the host's loopback services cannot be reached: TCP to the host's 127.0.0.1 and ::1 listeners is refused (the sandbox's loopback is its own) and they see no connection", async () => {
    const r = await sec.sh(attacker, hostListeners.map((l) => `${KIT} ports ${l.host} ${l.port} ${l.port} 1000`).join('; '));
    assert.deepEqual(
      probes(r).map((p) => [p.probe, p.host, p.result]),
      hostListeners.map((l) => ['port-scan', l.host, 'ECONNREFUSED']),
    );
    assert.deepEqual(
      hostListeners.map((l) => l.connections),
      hostListeners.map(() => 0),
    );
  });

  test("a port scan of the sandbox's own loopback (ports 1-1024) finds nothing listening: the agent listens on no port", async () => {
    const r = await sec.kit(attacker, ['ports', '127.0.0.1', '1', '1024', '1000']);
    assert.deepEqual(
      probes(r).map((p) => [p.probe, p.result, p.ports]),
      [['port-scan', 'ECONNREFUSED', 1024]],
    );
  });

  test("the host's abstract unix sockets cannot be reached (ECONNREFUSED: they belong to the host's network namespace)", async () => {
    const r = await sec.kit(attacker, ['unix', `@${abstractName}`]);
    assert.equal(probe(r, 'unix').result, 'ECONNREFUSED');
    assert.equal(abstractConnections, 0);
  });

  test("a port scan of the host's addresses, its gateway and DNS server fails with ENETUNREACH on every port", async () => {
    await assertNoRoute(attacker);
    const targets = await hostTargets();
    assert.ok(targets.length > 0, 'the host has addresses to scan');
    const r = await sec.sh(attacker, targets.map((h) => `${KIT} ports ${h} 1 1024 1000`).join('; '));
    assert.deepEqual(
      probes(r).map((p) => [p.probe, p.host, p.result, p.ports]),
      targets.map((h) => ['port-scan', h, 'ENETUNREACH', 1024]),
    );
  });

  test("other sandboxes cannot be reached: a listener on another sandbox's loopback is not on the attacker's, and gets no connection", async () => {
    const victim = await sec.sandbox();
    try {
      const listener = await sec.edge.spawn(victim, { cmd: 'nc -l -p 8000 && echo connected' });
      await listener.detach();
      const seen = await sec.sh(victim, 'for i in $(seq 50); do netstat -ltn | grep -q ":8000 " && break; sleep 0.05; done; netstat -ltn | grep -c ":8000 "');
      assert.equal(seen.stdout.trim(), '1', 'the victim listens');
      const r = await sec.kit(attacker, ['ports', '127.0.0.1', '8000', '8000', '1000']);
      assert.equal(probe(r, 'port-scan').result, 'ECONNREFUSED');
      const still = await sec.sh(victim, 'netstat -ltn | grep -c ":8000 "');
      assert.equal(still.stdout.trim(), '1', 'the victim never got the connection');
    } finally {
      await sec.edge.destroy(victim);
    }
  });

  test("UDP and DNS egress fail: a DNS query to the host's nameserver and the gateway fails with ENETUNREACH, and name resolution fails", async () => {
    await assertNoRoute(attacker);
    const targets = await hostTargets();
    const r = await sec.sh(
      attacker,
      `${targets.map((h) => `${KIT} udp ${h} 53`).join('; ')}; nslookup example.com ${targets[0]} >/dev/null 2>&1 && echo resolved || echo unresolved; wget -q -T 2 -O - http://example.com/ >/dev/null 2>&1 && echo fetched || echo unfetched`,
    );
    assert.deepEqual(
      probes(r).map((p) => [p.host, p.result]),
      targets.map((h) => [h, 'ENETUNREACH']),
    );
    assert.match(r.stdout, /unresolved\nunfetched\n$/);
  });
});
