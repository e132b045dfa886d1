// End-to-end tests of the container hardening: user namespaces, the seccomp profile (and that a
// profile that cannot be applied fails the create), protected paths, the diff and integrity
// check, and what a sandbox cannot see of the platform. Real crun sandboxes on EROFS layers.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { createHash } from 'node:crypto';
import { access, lstat, mkdir, mkdtemp, readFile, readdir, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { after, before, describe, test } from 'node:test';
import { DENIED_IOCTLS, DENIED_SYSCALLS, ID_RANGE_SIZE, ID_RANGE_START, PTRACE_SYSCALLS, defaultSeccompProfile } from '@dsec/edge';
import type { Edge } from '@dsec/edge';
import { isDsecError } from '@dsec/protocol';
import type { RaisedEvent } from '@dsec/protocol';
import { DsecClient, DsecError, Sandbox } from '@dsec/sdk';
import { REPO_ROOT, parsed, startNode } from './helpers/node.js';
import type { TestNode } from './helpers/node.js';
import { startTestPlatform } from './helpers/platform.js';
import type { TestPlatform } from './helpers/platform.js';

const run = promisify(execFile);
const ID_CLAIMS = '/run/dsec/idmap';

let node: TestNode;
/** A node without user namespaces whose seccomp profile is broken for sandboxes labelled so. */
let plain: TestNode;
let scratch: string;
let probe: Buffer;

const sha256 = (s: string | Buffer): string => createHash('sha256').update(s).digest('hex');
const image = { base: 'busybox', workspace: 'ws-hardening' };

before(async () => {
  scratch = await mkdtemp(path.join(os.tmpdir(), 'dsec-scratch-'));
  node = await startNode();
  plain = await startNode({
    edge: {
      userNamespaces: false,
      seccompProfile: (spec) =>
        spec.labels?.profile === 'invalid'
          ? { ...defaultSeccompProfile(), defaultAction: 'SCMP_ACT_NO_SUCH_ACTION' }
          : defaultSeccompProfile({ allowPtrace: spec.security?.allowPtrace === true }),
    },
  });
  const ws = path.join(scratch, 'ws');
  await mkdir(path.join(ws, 'project/tests'), { recursive: true });
  await writeFile(path.join(ws, 'project/README'), 'readme\n');
  await writeFile(path.join(ws, 'project/tests/test.sh'), '#!/bin/sh\necho tests-pass\n', { mode: 0o755 });
  for (const n of [node, plain]) {
    await n.edge.layers.build({ type: 'busybox' }, { kind: 'base', name: 'busybox' });
    await n.edge.layers.build({ type: 'dir', path: ws }, { kind: 'workspace', name: 'ws-hardening' });
  }
  await run('gcc', ['-static', '-O1', '-o', path.join(scratch, 'probe'), path.join(REPO_ROOT, 'test/fixtures/seccomp-probe.c')]);
  probe = await readFile(path.join(scratch, 'probe'));
});

after(async () => {
  await node?.cleanup();
  await plain?.cleanup();
  await rm(scratch, { recursive: true, force: true });
});

/** Runs a shell command and returns its output (stdout + stderr). */
async function sh(edge: Edge, id: string, cmd: string): Promise<{ code: number | null; out: string }> {
  const r = await edge.exec(id, { cmd });
  return { code: r.exitCode, out: r.stdout + r.stderr };
}

/** Claims of id ranges under /run/dsec/idmap that name this home. */
async function claimsOf(home: string): Promise<string[]> {
  const out: string[] = [];
  for (const name of await readdir(ID_CLAIMS).catch(() => [] as string[])) {
    const text = await readFile(path.join(ID_CLAIMS, name), 'utf8').catch(() => '');
    if (text.split('\n')[0] === path.resolve(home)) out.push(text.split('\n')[1] ?? '');
  }
  return out;
}

/** Waits until `pick` finds an event among those raised so far (events come from a poll loop). */
async function eventually<T>(pick: () => T | undefined, what: string, limitMs = 10_000): Promise<T> {
  const deadline = Date.now() + limitMs;
  for (;;) {
    const found = pick();
    if (found !== undefined) return found;
    if (Date.now() > deadline) assert.fail(`no ${what} within ${limitMs} ms`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

describe('user namespaces', () => {
  test('root inside maps to a host uid range of the sandbox own; the upper directory is owned by it', async () => {
    const a = await node.edge.create({ image });
    const b = await node.edge.create({ image: { base: 'busybox' } });
    try {
      const range = node.edge.idRange(a.id);
      assert.ok(range && range.uid >= ID_RANGE_START && range.size === ID_RANGE_SIZE && range.gid === range.uid, JSON.stringify(range));
      const other = node.edge.idRange(b.id);
      assert.ok(other && Math.abs(other.uid - range.uid) >= ID_RANGE_SIZE, 'two sandboxes never share ids');

      const maps = await sh(node.edge, a.id, 'cat /proc/self/uid_map /proc/self/gid_map; id -u; stat -c %u:%g /etc/passwd /project/README');
      const fields = maps.out
        .trim()
        .split('\n')
        .map((l) => l.trim().split(/\s+/).join(' '));
      assert.deepEqual(fields, [`0 ${range.uid} ${ID_RANGE_SIZE}`, `0 ${range.gid} ${ID_RANGE_SIZE}`, '0', '0:0', '0:0'], 'layer files belong to root inside');

      assert.equal((await sh(node.edge, a.id, 'echo a > /root/by-root')).code, 0);
      const asUser = await node.edge.exec(a.id, { argv: ['sh', '-c', 'echo b > /tmp/by-user; id -u'], uid: 1000, gid: 1000 });
      assert.equal(asUser.stdout, '1000\n', asUser.stderr);
      await node.edge.writeFile(a.id, '/root/by-api', 'c');
      assert.equal((await node.edge.stat(a.id, '/root/by-api')).uid, 0, 'files written through the agent belong to root inside');

      const upper = node.edge.upperDir(a.id);
      assert.equal((await lstat(path.join(upper, 'root/by-root'))).uid, range.uid);
      assert.equal((await lstat(path.join(upper, 'root/by-api'))).uid, range.uid);
      const byUser = await lstat(path.join(upper, 'tmp/by-user'));
      assert.deepEqual([byUser.uid, byUser.gid], [range.uid + 1000, range.gid + 1000]);
      // A copied-up layer file keeps its (mapped) owner.
      assert.equal((await sh(node.edge, a.id, 'echo x >> /etc/passwd')).code, 0);
      assert.equal((await lstat(path.join(upper, 'etc/passwd'))).uid, range.uid);

      // On the host the sandbox's root is the range's first uid: its chronus runs as that uid.
      const owners: number[] = [];
      for (const pid of (await readdir('/proc')).filter((d) => /^\d+$/.test(d))) {
        const cmdline = await readFile(`/proc/${pid}/cmdline`, 'utf8').catch(() => '');
        if (!cmdline.startsWith('/.dsec/chronus\0')) continue;
        const status = await readFile(`/proc/${pid}/status`, 'utf8').catch(() => '');
        owners.push(Number(/^Uid:\s+(\d+)/m.exec(status)?.[1]));
      }
      assert.ok(owners.includes(range.uid), 'chronus runs as the range root on the host');

      assert.deepEqual((await claimsOf(node.home)).sort(), [a.id, b.id].sort(), 'each range is claimed host-wide in the name of its sandbox');
    } finally {
      await node.edge.destroy(a.id);
      await node.edge.destroy(b.id);
    }
    assert.deepEqual(await claimsOf(node.home), [], 'destroy releases the ranges');
  });

  test('a range survives an edge restart with its sandbox', async () => {
    const sb = await node.edge.create({ image: { base: 'busybox' } });
    try {
      const range = node.edge.idRange(sb.id);
      const edge = await node.restart();
      assert.deepEqual(edge.idRange(sb.id), range);
      assert.deepEqual(await claimsOf(node.home), [sb.id]);
      assert.equal((await sh(edge, sb.id, 'id -u')).out, '0\n');
    } finally {
      await node.edge.destroy(sb.id);
    }
    assert.deepEqual(await claimsOf(node.home), []);
  });

  test('a node can run without them (root inside is root on the host)', async () => {
    const sb = await plain.edge.create({ image: { base: 'busybox' } });
    try {
      assert.equal(plain.edge.idRange(sb.id), undefined);
      assert.deepEqual((await sh(plain.edge, sb.id, 'cat /proc/self/uid_map')).out.trim().split(/\s+/), ['0', '0', '4294967295']);
    } finally {
      await plain.edge.destroy(sb.id);
    }
  });
});

describe('seccomp', () => {
  /** Runs the probe in a sandbox: errno name per system call. */
  async function probeIn(edge: Edge, id: string): Promise<Map<string, string>> {
    await edge.writeFile(id, '/probe', probe, { mode: 0o755 });
    const r = await edge.exec(id, { argv: ['/probe'] });
    assert.equal(r.exitCode, 0, r.stderr);
    return new Map(
      r.stdout
        .trim()
        .split('\n')
        .map((l) => l.split(' ') as [string, string]),
    );
  }

  test('every listed system call and ioctl is refused; ptrace and process_vm_* only with security.allowPtrace', async () => {
    const strict = await node.edge.create({ image: { base: 'busybox' } });
    const debug = await node.edge.create({ image: { base: 'busybox' }, security: { allowPtrace: true } });
    try {
      const config = JSON.parse(await readFile(path.join(node.home, 'sandboxes', strict.id, 'config.json'), 'utf8')) as {
        linux: { seccomp: { flags: string[]; syscalls: Array<{ names: string[] }> } };
      };
      const denied = new Set(config.linux.seccomp.syscalls.flatMap((r) => r.names));
      for (const name of [
        'bpf',
        'io_uring_setup',
        'io_uring_enter',
        'io_uring_register',
        'userfaultfd',
        'perf_event_open',
        'keyctl',
        'add_key',
        'request_key',
        'unshare',
        'setns',
        'mount',
        'umount2',
        'pivot_root',
        'fsopen',
        'fsmount',
        'open_tree',
        'move_mount',
        'name_to_handle_at',
        'open_by_handle_at',
        'kexec_load',
        'kexec_file_load',
        'init_module',
        'finit_module',
        'delete_module',
        'ptrace',
        'process_vm_readv',
        'process_vm_writev',
        'reboot',
        'swapon',
        'swapoff',
        'acct',
        'iopl',
        'ioperm',
        'ioctl',
      ]) {
        assert.ok(denied.has(name), `${name} is in the profile`);
      }
      assert.deepEqual(config.linux.seccomp.flags, ['SECCOMP_FILTER_FLAG_LOG']);
      assert.ok(DENIED_IOCTLS.some((i) => i.name === 'XFS_IOC_SWAPEXT') && DENIED_IOCTLS.some((i) => i.name === 'TIOCSTI'));

      const seen = await probeIn(node.edge, strict.id);
      assert.ok(seen.size >= 40, `probe ran every call: ${[...seen.keys()].join(',')}`);
      for (const [call, errno] of seen) assert.equal(errno, call === 'clone3' ? 'ENOSYS' : 'EPERM', `${call} in the default profile`);
      assert.match((await sh(node.edge, strict.id, 'grep Seccomp: /proc/self/status')).out, /Seccomp:\s+2/);

      const relaxed = await probeIn(node.edge, debug.id);
      for (const [call, errno] of relaxed) {
        const allowed = (PTRACE_SYSCALLS as readonly string[]).includes(call);
        assert.equal(errno === 'ok', allowed, `${call} with allowPtrace: ${errno}`);
        if (!allowed) assert.equal(errno, call === 'clone3' ? 'ENOSYS' : 'EPERM', call);
      }
      assert.ok(DENIED_SYSCALLS.length > 50);
    } finally {
      await node.edge.destroy(strict.id);
      await node.edge.destroy(debug.id);
    }
  });

  test('a profile that cannot be applied fails the create and leaves nothing behind (fail closed)', async () => {
    await assert.rejects(
      plain.edge.create({ image: { base: 'busybox' }, labels: { profile: 'invalid' } }),
      (e: unknown) => isDsecError(e, 'BACKEND_FAILED') && /seccomp/.test(e.message),
    );
    assert.deepEqual(await plain.edge.list(), []);
    assert.deepEqual(await readdir(path.join(plain.home, 'sandboxes')), []);
    const fine = await plain.edge.create({ image: { base: 'busybox' } });
    await plain.edge.destroy(fine.id);
  });

  test('denials are raised as seccomp.denied events naming the system call', async (t) => {
    const logged = await readFile('/proc/sys/kernel/seccomp/actions_logged', 'utf8').catch(() => '');
    const kmsg = await access('/dev/kmsg').then(
      () => true,
      () => false,
    );
    if (!logged.split(/\s+/).includes('errno') || !kmsg) {
      t.skip('this kernel does not log seccomp errno actions to a readable /dev/kmsg');
      return;
    }
    const events: RaisedEvent[] = [];
    const off = node.edge.onEvent((ev) => events.push(ev));
    const sb = await node.edge.create({ image: { base: 'busybox' } });
    try {
      // The kernel rate-limits its log (10 lines per 5 s by default, for the whole host): try
      // again until one denial gets through.
      const denied = (): RaisedEvent | undefined => events.find((e) => e.kind === 'seccomp.denied' && e.sandboxId === sb.id);
      for (let i = 0; i < 15 && !denied(); i++) {
        assert.equal((await sh(node.edge, sb.id, 'unshare -m true')).code, 1);
        await eventually(denied, 'seccomp.denied event', 1000).catch(() => undefined);
      }
      const ev = await eventually(denied, 'seccomp.denied event');
      assert.equal(ev.data?.syscall, 'unshare');
      assert.equal(ev.data?.comm, 'unshare');
      assert.equal(ev.node, node.edge.nodeName);
    } finally {
      off();
      await node.edge.destroy(sb.id);
    }
  });
});

describe('protected paths', () => {
  test('read-only paths cannot be written, replaced or moved aside, not even by root', async () => {
    const sb = await node.edge.create({ image, protect: { readOnly: ['/project/tests', '/etc/passwd', '/opt/grader', '/project/tests/test.sh'] } });
    try {
      const refused: Array<[string, RegExp]> = [
        ['echo x >> /project/tests/test.sh', /Read-only file system/],
        ['touch /project/tests/new', /Read-only file system/],
        ['rm /project/tests/test.sh', /Read-only file system/],
        ['chmod 777 /project/tests/test.sh', /Read-only file system/],
        ['mv /project/tests /project/tests.bak', /busy/],
        ['mv /project /project.bak', /busy/],
        ['rm -rf /project/tests', /Read-only file system|busy/],
        ['echo root::0:0::/:/bin/sh > /etc/passwd', /Read-only file system/],
        ['mv /etc/passwd /etc/passwd.bak', /busy/],
        ['mv /etc /etc.bak', /busy/],
        ['touch /opt/grader/x', /Read-only file system/],
        ['mount -o remount,rw /project/tests', /denied|not permitted/],
        ['umount /project/tests', /not permitted|denied/],
        ['ln /project/tests/test.sh /root/hard-link', /cross-device/],
      ];
      for (const [cmd, why] of refused) {
        const r = await sh(node.edge, sb.id, cmd);
        assert.notEqual(r.code, 0, `${cmd} must fail`);
        assert.match(r.out, why, cmd);
      }
      await assert.rejects(node.edge.writeFile(sb.id, '/project/tests/x', 'y'), 'the files API is refused too');
      // Everything around them stays writable, and the tests still run unchanged.
      const ok = await sh(node.edge, sb.id, 'echo fine > /project/other && echo more >> /etc/group && /project/tests/test.sh && ls -A /opt/grader | wc -l');
      assert.deepEqual([ok.code, ok.out], [0, 'tests-pass\n0\n']);
      const inside = await node.edge.readFile(sb.id, '/project/tests/test.sh');
      assert.equal(inside.toString(), '#!/bin/sh\necho tests-pass\n');
    } finally {
      await node.edge.destroy(sb.id);
    }
  });

  test('protected paths are validated: 400 naming the field, no sandbox left behind', async () => {
    const bad: Array<[unknown, string]> = [
      [{ readOnly: ['relative'] }, 'protect.readOnly.0'],
      [{ readOnly: ['/a/../b'] }, 'protect.readOnly.0'],
      [{ readOnly: ['/ok', '/proc/sys'] }, 'protect.readOnly.1'],
      [{ watch: ['/'] }, 'protect.watch.0'],
      [{ watch: ['/a/'] }, 'protect.watch.0'],
      [{ readOnly: Array.from({ length: 33 }, (_, i) => `/p${i}`) }, 'protect.readOnly'],
      [{ readOnly: ['/x'], other: true }, 'protect.other'],
    ];
    for (const [protect, field] of bad) {
      await assert.rejects(
        async () => node.edge.create(parsed.sandbox({ image: { base: 'busybox' }, protect })),
        (e: unknown) => isDsecError(e, 'INVALID_ARGUMENT') && e.details.field === field,
        JSON.stringify(protect),
      );
    }
    // busybox's /bin/sh is a symlink: protecting it (or a path through it) would protect nothing.
    for (const p of ['/bin/sh', '/bin/sh/x']) {
      await assert.rejects(
        node.edge.create({ image: { base: 'busybox' }, protect: { readOnly: [p] } }),
        (e: unknown) => isDsecError(e, 'INVALID_ARGUMENT') && e.details.field === 'protect.readOnly' && /symbolic link/.test(e.message),
      );
    }
    assert.deepEqual(await node.edge.list(), []);
    assert.deepEqual(await readdir(path.join(node.home, 'sandboxes')), []);
    assert.deepEqual(await claimsOf(node.home), []);
  });

  test('changes under watched paths raise protected-path.write events', async () => {
    const events: RaisedEvent[] = [];
    const off = node.edge.onEvent((ev) => events.push(ev));
    const sb = await node.edge.create({ image, protect: { watch: ['/project/tests'] } });
    try {
      const writes = (p: string): RaisedEvent | undefined =>
        events.find((e) => e.kind === 'protected-path.write' && e.sandboxId === sb.id && e.data?.path === p);
      assert.equal((await sh(node.edge, sb.id, 'echo "exit 0" >> /project/tests/test.sh')).code, 0);
      const ev = await eventually(() => writes('/project/tests/test.sh'), 'event for test.sh');
      assert.equal(ev.data?.watched, '/project/tests');
      assert.ok(Array.isArray(ev.data?.ops) && (ev.data.ops as string[]).length > 0);
      assert.equal(typeof ev.data?.pid, 'number');
      assert.equal((await sh(node.edge, sb.id, 'echo x > /project/tests/conftest.py')).code, 0);
      await eventually(() => writes('/project/tests/conftest.py'), 'event for a new file');
      // A write elsewhere is not an event; moving the watched tree's parent away is.
      assert.equal((await sh(node.edge, sb.id, 'echo x > /project/notes && rm -rf /project')).code, 0);
      const gone = await eventually(() => writes('/project'), 'event for the parent');
      assert.equal(gone.data?.watched, '/project/tests');
      assert.equal(writes('/project/notes'), undefined);
    } finally {
      off();
      await node.edge.destroy(sb.id);
    }
  });

  test('read-only paths across an edge restart: a refusal made while no edge ran is raised once, a server that died meanwhile is restarted', async () => {
    const sb = await node.edge.create({ image, protect: { readOnly: ['/project/tests'] } });
    const log = path.join(node.home, 'sandboxes', sb.id, 'refused-writes.log');
    try {
      // Made by a process the sandbox keeps running while the edge restarts.
      await (await node.edge.spawn(sb.id, { argv: ['/bin/sh', '-c', 'sleep 1; touch /project/tests/while-down'] })).detach();
      const edge = await node.restart(async () => {
        for (let i = 0; i < 100 && !(await readFile(log, 'utf8')).includes('while-down'); i++) await new Promise((r) => setTimeout(r, 50));
        assert.match(await readFile(log, 'utf8'), /^create \/project\/tests\/while-down$/m);
        // Its server dies too (an edge stopped with its cgroup, say): the paths answer ENOTCONN until the new edge restarts it.
        process.kill(Number((await readFile(`${log}.pid`, 'utf8')).split(' ')[0]), 'SIGKILL');
      });
      const events: RaisedEvent[] = [];
      const off = edge.onEvent((ev) => events.push(ev));
      try {
        const refused = await eventually(
          () => events.find((e) => e.kind === 'protected-path.write' && e.sandboxId === sb.id && e.data?.path === '/project/tests/while-down'),
          'the refusal made while no edge ran',
        );
        assert.ok((refused.data?.ops as string[]).includes('create'));
        await eventually(() => events.find((e) => e.kind === 'protected-path.server-restarted' && e.sandboxId === sb.id), 'protected-path.server-restarted');
        assert.equal(events.filter((e) => e.kind === 'protected-path.write' && e.sandboxId === sb.id).length, 1);
        const r = await sh(edge, sb.id, 'cat /project/tests/test.sh >/dev/null && echo readable; touch /project/tests/test.sh 2>/dev/null || echo refused');
        assert.equal(r.out, 'readable\nrefused\n');
      } finally {
        off();
      }
    } finally {
      await node.edge.destroy(sb.id);
    }
  });
});

describe('diff and verify', () => {
  test('diff lists added, changed, deleted and replaced paths with content hashes', async () => {
    const sb = await node.edge.create({ image });
    try {
      const script = [
        'echo new > /root/new',
        'echo more >> /project/README',
        'touch /project/tests/test.sh',
        'rm /bin/ls',
        'rm -rf /tmp && mkdir /tmp && echo t > /tmp/t',
        'mkdir -p /work/a && echo w > /work/a/f && chown 1000:1000 /work/a/f',
        'ln -s /etc/shadow /root/link',
        'truncate -s 70M /root/sparse',
        'chmod 700 /etc',
      ].join(' && ');
      assert.equal((await sh(node.edge, sb.id, script)).code, 0);
      const all = await node.edge.diff(sb.id);
      assert.equal(all.nextCursor, null);
      assert.equal(all.frozen, false);
      const by = new Map(all.entries.map((e) => [e.path, e]));
      assert.deepEqual(
        [...by.keys()],
        [
          '/bin/ls',
          '/etc',
          '/project/README',
          '/project/tests/test.sh',
          '/root/link',
          '/root/new',
          '/root/sparse',
          '/tmp',
          '/tmp/t',
          '/work',
          '/work/a',
          '/work/a/f',
        ],
        'in walk order; the runtime mount points are not listed',
      );
      assert.deepEqual(by.get('/root/new'), {
        path: '/root/new',
        change: 'added',
        type: 'file',
        mode: 0o644,
        uid: 0,
        gid: 0,
        size: 4,
        sha256: sha256('new\n'),
      });
      assert.equal(by.get('/project/README')?.change, 'changed');
      assert.equal(by.get('/project/README')?.sha256, sha256('readme\nmore\n'));
      assert.equal(by.get('/project/README')?.contentChanged, true);
      assert.equal(by.get('/project/tests/test.sh')?.contentChanged, false, 'touch changes metadata only');
      assert.deepEqual(by.get('/bin/ls'), { path: '/bin/ls', change: 'deleted', type: 'symlink' });
      assert.equal(by.get('/tmp')?.change, 'replaced');
      assert.equal(by.get('/tmp/t')?.change, 'added');
      assert.deepEqual([by.get('/etc')?.change, by.get('/etc')?.mode], ['changed', 0o700]);
      assert.deepEqual([by.get('/work/a/f')?.uid, by.get('/work/a/f')?.gid], [1000, 1000], 'owners as the sandbox sees them');
      assert.equal(by.get('/root/link')?.linkTarget, '/etc/shadow');
      assert.equal(by.get('/root/link')?.sha256, undefined, 'a symlink is never followed');
      assert.match(by.get('/root/sparse')?.hashSkipped ?? '', /larger than/);

      // Pages of 5 cover the same entries in the same order.
      const paged: string[] = [];
      let cursor: string | undefined;
      do {
        const page = await node.edge.diff(sb.id, { limit: 5, ...(cursor ? { cursor } : {}) });
        assert.ok(page.entries.length <= 5);
        paged.push(...page.entries.map((e) => e.path));
        cursor = page.nextCursor ?? undefined;
      } while (cursor);
      assert.deepEqual(paged, [...by.keys()]);

      const some = await node.edge.diff(sb.id, { paths: ['/work', '/project/tests'], hash: false });
      assert.deepEqual(
        some.entries.map((e) => e.path),
        ['/project/tests/test.sh', '/work', '/work/a', '/work/a/f'],
      );
      assert.ok(some.entries.every((e) => e.sha256 === undefined));
      await assert.rejects(
        async () => node.edge.diff(sb.id, parsed.diff({ paths: ['relative'] })),
        (e: unknown) => isDsecError(e, 'INVALID_ARGUMENT') && e.details.field === 'paths.0',
      );
      await assert.rejects(
        async () => node.edge.diff(sb.id, parsed.diff({ limit: 0 })),
        (e: unknown) => isDsecError(e, 'INVALID_ARGUMENT') && e.details.field === 'limit',
      );
    } finally {
      await node.edge.destroy(sb.id);
    }
  });

  test('verify checks named paths against sha256 without following symlinks', async () => {
    const sb = await node.edge.create({ image });
    try {
      assert.equal(
        (
          await sh(
            node.edge,
            sb.id,
            'echo changed > /project/README && ln -s /project/tests/test.sh /root/t && rm -rf /project/tests && mkdir /project/tests && echo fake > /project/tests/test.sh',
          )
        ).code,
        0,
      );
      const res = await node.edge.verify(sb.id, {
        expected: {
          '/project/README': sha256('changed\n'),
          '/project/tests/test.sh': sha256('#!/bin/sh\necho tests-pass\n'),
          '/bin/busybox': sha256('not busybox'),
          '/root/t': sha256('#!/bin/sh\necho tests-pass\n'),
          '/no/such/file': sha256(''),
          '/etc': sha256(''),
        },
      });
      const by = new Map(res.results.map((r) => [r.path, r]));
      assert.equal(res.ok, false);
      assert.deepEqual([by.get('/project/README')?.ok, by.get('/project/README')?.source], [true, 'upper']);
      assert.deepEqual(
        [by.get('/project/tests/test.sh')?.ok, by.get('/project/tests/test.sh')?.reason, by.get('/project/tests/test.sh')?.actual],
        [false, 'mismatch', sha256('fake\n')],
      );
      assert.deepEqual([by.get('/bin/busybox')?.reason, by.get('/bin/busybox')?.source], ['mismatch', 'layers']);
      assert.equal(by.get('/root/t')?.reason, 'symlink-in-path');
      assert.equal(by.get('/no/such/file')?.reason, 'missing');
      assert.equal(by.get('/etc')?.reason, 'not-a-file');
      const good = await node.edge.verify(sb.id, { expected: { '/project/README': sha256('changed\n') } });
      assert.equal(good.ok, true);
      await assert.rejects(
        async () => node.edge.verify(sb.id, parsed.verify({ expected: { '/x': 'nothex' } })),
        (e: unknown) => isDsecError(e, 'INVALID_ARGUMENT') && e.details.field === 'expected./x',
      );
      await assert.rejects(
        async () => node.edge.verify(sb.id, parsed.verify({ expected: {} })),
        (e: unknown) => isDsecError(e, 'INVALID_ARGUMENT'),
      );
    } finally {
      await node.edge.destroy(sb.id);
    }
  });
});

describe('nothing of the platform inside', () => {
  test('no platform environment; chronus is read-only, its fds and memory unreachable; masked /proc, no cgroupfs, private /dev', async () => {
    const sb = await node.edge.create({ image: { base: 'busybox' }, env: { MINE: 'x' } });
    try {
      const env = (await node.edge.exec(sb.id, { argv: ['env'] })).stdout
        .trim()
        .split('\n')
        .map((l) => l.split('=')[0]);
      assert.deepEqual(env.sort(), ['HOME', 'MINE', 'PATH']);
      const checks: Array<[string, RegExp]> = [
        ['cat /proc/1/fd/3', /Permission denied/],
        ['cat /proc/1/environ', /Permission denied/],
        ['cat /proc/1/maps', /Permission denied/],
        ['echo x > /.dsec/chronus', /Read-only file system/],
        ['cp /bin/busybox /.dsec/chronus', /Read-only file system/],
        ['mount -o remount,rw /.dsec/chronus', /denied|not permitted/],
      ];
      for (const [cmd, why] of checks) {
        const r = await sh(node.edge, sb.id, cmd);
        assert.notEqual(r.code, 0, cmd);
        assert.match(r.out, why, cmd);
      }
      const seen = await sh(
        node.edge,
        sb.id,
        'wc -c < /proc/kpagecgroup; wc -c < /proc/kpageflags; wc -c < /proc/kpagecount; wc -c < /proc/keys; ls -A /sys/fs/cgroup | wc -l; find / -xdev -type s | wc -l; ls /dev',
      );
      const lines = seen.out.trim().split('\n');
      assert.deepEqual(
        lines.slice(0, 6).map((l) => l.trim()),
        ['0', '0', '0', '0', '0', '0'],
        'kpage files and keys are masked, no cgroupfs, no agent socket inside',
      );
      const dev = lines.slice(6);
      for (const d of dev)
        assert.ok(
          ['core', 'fd', 'full', 'mqueue', 'null', 'ptmx', 'pts', 'random', 'shm', 'stderr', 'stdin', 'stdout', 'tty', 'urandom', 'zero'].includes(d),
          `unexpected /dev/${d}`,
        );
      const caps = (await sh(node.edge, sb.id, 'grep CapEff /proc/self/status')).out.trim().split(/\s+/)[1] ?? '';
      const CAP_SYS_ADMIN = 21n;
      assert.equal((BigInt(`0x${caps}`) >> CAP_SYS_ADMIN) & 1n, 0n, 'no CAP_SYS_ADMIN');
    } finally {
      await node.edge.destroy(sb.id);
    }
  });

  test("replacing /bin/sh changes what the agent's own shell commands run, never what the platform runs", async () => {
    const sb = await node.edge.create({ image: { base: 'busybox' } });
    try {
      const replace = await node.edge.exec(sb.id, {
        argv: ['/bin/busybox', 'sh', '-c', 'rm /bin/sh && printf "#!/bin/busybox sh\\n/bin/busybox touch /pwned\\n" > /bin/sh && chmod 755 /bin/sh'],
      });
      assert.equal(replace.exitCode, 0, replace.stderr);
      // The platform's operations go through chronus's own system calls or the host.
      await node.edge.writeFile(sb.id, '/root/f', 'data');
      assert.equal((await node.edge.readFile(sb.id, '/root/f')).toString(), 'data');
      await node.edge.mkdir(sb.id, '/root/d');
      await node.edge.rename(sb.id, '/root/f', '/root/d/f');
      assert.deepEqual(
        (await node.edge.listDir(sb.id, '/root/d')).map((f) => f.name),
        ['f'],
      );
      await node.edge.remove(sb.id, '/root/d', { recursive: true });
      await node.edge.stats(sb.id);
      await node.edge.processes(sb.id);
      await node.edge.diff(sb.id);
      await node.edge.verify(sb.id, { expected: { '/bin/busybox': sha256('') } });
      const argv = await node.edge.exec(sb.id, { argv: ['/bin/busybox', 'test', '-e', '/pwned'] });
      assert.equal(argv.exitCode, 1, 'nothing the platform did ran the replaced /bin/sh');
      // `cmd` is a command line for the sandbox's own shell: the agent replaced it, so it runs.
      await node.edge.exec(sb.id, { cmd: 'true' });
      assert.equal((await node.edge.exec(sb.id, { argv: ['/bin/busybox', 'test', '-e', '/pwned'] })).exitCode, 0);
    } finally {
      await node.edge.destroy(sb.id);
    }
  });
});

describe('API and SDK', () => {
  let platform: TestPlatform | undefined;
  let client: DsecClient;

  before(async () => {
    platform = await startTestPlatform();
    client = new DsecClient({ apiUrl: platform.url, apiKey: platform.adminKey });
  });
  after(async () => {
    await platform?.close();
  });

  test('create takes protect and security; diff and verify are routes; bad input is a 400 naming the field', async () => {
    const sb = await Sandbox.create(
      { image: { base: 'busybox' }, protect: { readOnly: ['/grader'], watch: ['/etc'] }, security: { allowPtrace: true }, resources: { memoryMiB: 64 } },
      { client },
    );
    try {
      assert.deepEqual(sb.lastInfo?.protect, { readOnly: ['/grader'], watch: ['/etc'] });
      assert.deepEqual((await sb.info()).security, { allowPtrace: true });
      const w = await sb.exec('echo hi > /root/hello; touch /grader/x', {});
      assert.match(w.stderr, /Read-only file system/);
      const page = await sb.diff({ paths: ['/root'] });
      assert.deepEqual(
        page.entries.map((e) => [e.path, e.change, e.sha256]),
        [['/root/hello', 'added', sha256('hi\n')]],
      );
      const entries: string[] = [];
      for await (const e of sb.diffEntries({ limit: 1, hash: false })) entries.push(e.path);
      assert.ok(entries.includes('/root/hello') && entries.includes('/grader'), entries.join(','));
      const v = await sb.verify({ '/root/hello': sha256('hi\n') });
      assert.equal(v.ok, true);
      const raw = await fetch(`${platform!.url}/v1/sandboxes/${sb.id}/diff?path=relative`, { headers: { authorization: `Bearer ${platform!.adminKey}` } });
      assert.equal(raw.status, 400);
      assert.equal(((await raw.json()) as { error: { field: string } }).error.field, 'query.path.0');
    } finally {
      await sb.kill();
    }
    await assert.rejects(
      Sandbox.create({ image: { base: 'busybox' }, protect: { readOnly: ['/proc/x'] } }, { client }),
      (e: unknown) => e instanceof DsecError && e.code === 'INVALID_ARGUMENT' && e.details.field === 'protect.readOnly.0',
    );
  });

  test('dsec sandbox create --read-only, diff and verify', async () => {
    const env = { PATH: process.env.PATH ?? '', DSEC_API_URL: platform!.url, DSEC_API_KEY: platform!.adminKey, DSEC_HOME: path.join(scratch, 'no-home') };
    const dsec = (args: string[]): Promise<{ code: number; stdout: string }> =>
      run(process.execPath, [path.join(REPO_ROOT, 'packages/cli/dist/main.js'), ...args], { env }).then(
        (r) => ({ code: 0, stdout: r.stdout }),
        (e: unknown) => ({ code: (e as { code?: number }).code ?? -1, stdout: (e as { stdout?: string }).stdout ?? '' }),
      );
    const created = await dsec(['sandbox', 'create', '--base', 'busybox', '--read-only', '/grader', '--allow-ptrace', '--json']);
    assert.equal(created.code, 0);
    const info = JSON.parse(created.stdout) as { id: string; protect?: unknown; security?: unknown };
    try {
      assert.deepEqual([info.protect, info.security], [{ readOnly: ['/grader'] }, { allowPtrace: true }]);
      const sb = await Sandbox.connect(info.id, { client });
      await sb.files.write('/root/hello', 'hi\n');
      const diff = await dsec(['sandbox', 'diff', info.id, '--path', '/root', '--json']);
      assert.equal(diff.code, 0);
      assert.deepEqual(
        diff.stdout
          .trim()
          .split('\n')
          .map((l) => (JSON.parse(l) as { path: string; sha256?: string }).sha256),
        [sha256('hi\n')],
      );
      assert.equal((await dsec(['sandbox', 'verify', info.id, `/root/hello=${sha256('hi\n')}`])).code, 0);
      const bad = await dsec(['sandbox', 'verify', info.id, `/root/hello=${sha256('other')}`]);
      assert.equal(bad.code, 1);
      assert.match(bad.stdout, /FAIL\s+\/root\/hello\s+mismatch/);
    } finally {
      await Sandbox.kill(info.id, { client });
    }
  });
});
