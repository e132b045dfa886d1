// Adversarial suite: function-call sandboxes (issue 13). Each pre-created call sandbox runs in a
// user namespace of its own, root inside being an unprivileged host uid range, over a read-only
// root that is the runtime's layers idmapped to that range; it learns no host path from its
// mountinfo; and the container suite's system-call attacks get nowhere from a call either.
import assert from 'node:assert/strict';
import { readdir, readFile, stat } from 'node:fs/promises';
import os from 'node:os';
import { setTimeout as sleep } from 'node:timers/promises';
import { after, afterEach, before, describe, test } from 'node:test';
import { ID_RANGE_SIZE, ID_RANGE_START } from '@dsec/edge';
import type { CallResult } from '@dsec/protocol';
import { REPO_ROOT, parsed } from '../helpers/node.js';
import { KIT, KIT_IMAGE, mountinfoHostPathLines, newCanary, probes, startSecurityNode } from './fixture.js';
import type { SecurityNode } from './fixture.js';

let sec: SecurityNode;

before(async () => {
  sec = await startSecurityNode();
});

after(async () => {
  await sec?.cleanup();
});

afterEach(async () => {
  await sec.verifyContained();
});

function call(req: Record<string, unknown>): Promise<CallResult> {
  return sec.edge.calls.run(parsed.call({ image: KIT_IMAGE, timeoutMs: 30_000, ...req }));
}

/** The host pid of the process whose command line holds `marker`, waited for up to `ms`. */
async function hostProcessWith(marker: string, ms: number): Promise<number> {
  const until = Date.now() + ms;
  while (Date.now() < until) {
    for (const name of await readdir('/proc')) {
      if (!/^\d+$/.test(name)) continue;
      const cmdline = await readFile(`/proc/${name}/cmdline`, 'utf8').catch(() => '');
      if (cmdline.split('\0').includes(marker)) return Number(name);
    }
    await sleep(50);
  }
  throw new Error(`no host process with ${marker} in its command line within ${ms} ms`);
}

/**
 * From the host: the host uid of the call's shell (found by `marker` in its argv) and of the
 * file it wrote to its /tmp, read through /proc/PID/root; then lets the call end (SIGUSR1).
 */
async function lookFromHost(marker: string): Promise<{ uid: number; fileUid: number | undefined }> {
  const pid = await hostProcessWith(marker, 20_000);
  try {
    const uid = Number(/^Uid:\s+(\d+)/m.exec(await readFile(`/proc/${pid}/status`, 'utf8'))?.[1]);
    let fileUid: number | undefined;
    for (let i = 0; i < 100 && fileUid === undefined; i++) {
      fileUid = await stat(`/proc/${pid}/root/tmp/${marker}`).then(
        (s) => s.uid,
        () => undefined,
      );
      if (fileUid === undefined) await sleep(50);
    }
    return { uid, fileUid };
  } finally {
    process.kill(pid, 'SIGUSR1');
  }
}

/** Numbers of the single line of a uid_map or gid_map. */
function mapLine(text: string): number[] {
  return text.trim().split(/\s+/).map(Number);
}

describe('function-call sandboxes', () => {
  test('a call runs in a user namespace of its own: its ids map onto an unprivileged host range, the layers are idmapped to it, and a file it writes to /tmp belongs to that range on the host', async () => {
    // main: uid_map was the identity (0 0 4294967295) and the file's owner host uid 65534,
    // the same "nobody" for every call on the host.
    const marker = newCanary();
    const script = [
      'cat /proc/self/uid_map /proc/self/gid_map',
      'grep -E "^(Uid|CapEff):" /proc/self/status',
      'ls -ln /bin/busybox',
      'echo hi > /tmp/$0',
      // Wait until the host has looked (it sends SIGUSR1: as host root it cannot even create a
      // file in the call's /tmp, whose owner ids it has no mapping for).
      "trap 'exit 0' USR1",
      'i=0; while [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done; exit 3',
    ].join('; ');
    const pending = call({ argv: ['sh', '-c', script, marker] });
    const host = await lookFromHost(marker).catch((err: unknown) => (err instanceof Error ? err : new Error(String(err))));
    const r = await pending;
    if (host instanceof Error) throw host;
    assert.equal(r.exitCode, 0, r.stderr);
    const [uidMap, gidMap, ...rest] = r.stdout.split('\n');
    const [inside, base, size] = mapLine(uidMap ?? '');
    assert.equal(inside, 0, `uid_map: ${uidMap}`);
    assert.ok(base !== undefined && base >= ID_RANGE_START, `uid 0 of the call is an unprivileged host uid: ${uidMap}`);
    assert.equal(size, ID_RANGE_SIZE, `uid_map: ${uidMap}`);
    assert.deepEqual(mapLine(gidMap ?? ''), [0, base, ID_RANGE_SIZE], `gid_map: ${gidMap}`);
    assert.match(rest.join('\n'), /^Uid:\s+65534\s/m, 'the call runs as nobody inside');
    assert.match(rest.join('\n'), /^CapEff:\s+0+$/m, 'with no capabilities');
    // The runtime's files are root's inside (the layers are idmapped), not the overflow id.
    assert.match(rest.find((l) => l.includes('/bin/busybox')) ?? '', /^\S+\s+\d+\s+0\s+0\s/, `layer files owned by root inside: ${r.stdout}`);
    assert.equal(host.uid, base + 65534, "on the host the call runs as its range's nobody");
    assert.equal(host.fileUid, base + 65534, 'its file in /tmp belongs to its range on the host');
  });

  test('two calls never share host ids', async () => {
    const [a, b] = await Promise.all([call({ code: 'cat /proc/self/uid_map' }), call({ code: 'cat /proc/self/uid_map' })]);
    const baseA = mapLine(a?.stdout ?? '')[1];
    const baseB = mapLine(b?.stdout ?? '')[1];
    assert.ok(baseA !== undefined && baseA >= ID_RANGE_START, a?.stdout);
    assert.ok(baseB !== undefined && baseB >= ID_RANGE_START, b?.stdout);
    assert.notEqual(baseA, baseB, 'each call sandbox has a range of its own');
  });

  test("the container suite's system-call attacks are all refused from a call", async () => {
    const r = await call({ argv: [KIT, 'syscall'] });
    const results = probes(r);
    assert.ok(results.length >= 30, `every probe ran: ${r.stdout}${r.stderr}`);
    const worked = results.filter((p) => p.result === 'OK').map((p) => p.probe);
    assert.deepEqual(worked, [], `attacks that worked from a call: ${r.stdout}`);
  });

  test('mountinfo names no host path: the root is a read-only overlay of descriptor paths marked with the node, the agent bound from a tmpfs of its own', async () => {
    // main: lowerdir= listed the layer store's host paths under the node's home, and the root's
    // mount point its host path.
    const r = await call({ code: 'cat /proc/self/mountinfo' });
    assert.equal(r.exitCode, 0, r.stderr);
    assert.match(r.stdout, / \/ ro,[^ ]* - overlay dsec-[0-9a-f]{16} [^ ]*lowerdir=\/proc\/self\/fd\/\d+:/, `the root overlay:\n${r.stdout}`);
    assert.match(r.stdout, / \/chronus \/\.dsec\/chronus ro,[^ ]* - tmpfs dsec-agent /, `the agent's bind:\n${r.stdout}`);
    const leaks = mountinfoHostPathLines(r.stdout, [sec.node.home, REPO_ROOT, '/run/dsec', os.tmpdir() + '/dsec-']);
    assert.deepEqual(leaks, [], `mountinfo shows host paths:\n${r.stdout}`);
  });
});
