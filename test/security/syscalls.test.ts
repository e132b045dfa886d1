// Adversarial suite: the kernel's attack surface as seen from inside a container sandbox, the
// /proc and /sys files that reach the host kernel, and the in-sandbox agent (chronus, PID 1).
// Every attack runs from inside a real sandbox; every test ends by checking that nothing outside
// it changed (host files and settings, a bystander sandbox, a fresh sandbox still works).
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import path from 'node:path';
import { promisify } from 'node:util';
import { after, afterEach, before, describe, test } from 'node:test';
import { KIT, expectEvent, probe, probes, resultsByProbe, startSecurityNode } from './fixture.js';
import type { SecurityNode } from './fixture.js';

const run = promisify(execFile);

let sec: SecurityNode;
/** The sandbox the attacks in this file run in. */
let attacker: string;

before(async () => {
  sec = await startSecurityNode();
  attacker = await sec.sandbox();
});

after(async () => {
  await sec?.cleanup();
});

afterEach(async () => {
  await sec.verifyContained();
});

/**
 * Attacks that are one system call each: what the kit tries, the errno it must get, and the
 * system calls whose refusal by the seccomp filter must be raised as `seccomp.denied` events
 * (refusals for want of a capability are not seccomp's and raise none).
 */
const SYSCALL_ATTACKS: Array<{ what: string; expect: Record<string, string>; seccomp: string[] }> = [
  {
    what: 'open_by_handle_at with a hand-made handle of inode 2 (and name_to_handle_at to get a real one) fails with EPERM',
    expect: { open_by_handle_at: 'EPERM', name_to_handle_at: 'EPERM' },
    seccomp: ['open_by_handle_at', 'name_to_handle_at'],
  },
  { what: 'io_uring_setup fails with EPERM', expect: { io_uring: 'EPERM' }, seccomp: ['io_uring_setup'] },
  { what: 'bpf: BPF_PROG_LOAD of a valid socket filter and BPF_MAP_CREATE fail with EPERM', expect: { bpf: 'EPERM', 'bpf-map': 'EPERM' }, seccomp: ['bpf'] },
  { what: 'userfaultfd fails with EPERM', expect: { userfaultfd: 'EPERM' }, seccomp: ['userfaultfd'] },
  { what: 'perf_event_open of a software counter on itself fails with EPERM', expect: { perf_event_open: 'EPERM' }, seccomp: ['perf_event_open'] },
  {
    what: 'a user namespace cannot be made: unshare(CLONE_NEWUSER) and clone(CLONE_NEWUSER) fail with EPERM, clone3 with ENOSYS; nor any other namespace',
    expect: {
      'unshare-user': 'EPERM',
      'clone-newuser': 'EPERM',
      'clone3-newuser': 'ENOSYS',
      'unshare-mount': 'EPERM',
      'unshare-net': 'EPERM',
      'unshare-pid': 'EPERM',
      'clone-newns': 'EPERM',
      setns: 'EACCES',
    },
    // clone3 is refused for every program (ENOSYS, so that libc falls back to clone) and is not
    // raised: the clone that follows is what a namespace attempt is refused and raised on.
    seccomp: ['unshare', 'clone'],
  },
  {
    what: 'mount fails: mount(2) of tmpfs and proc, and the new mount API (fsopen, open_tree), with EPERM',
    expect: { 'mount-tmpfs': 'EPERM', 'mount-proc': 'EPERM', fsopen: 'EPERM', open_tree: 'EPERM' },
    seccomp: ['mount', 'fsopen', 'open_tree'],
  },
  { what: 'keyrings: keyctl and add_key fail with EPERM', expect: { keyctl: 'EPERM', add_key: 'EPERM' }, seccomp: ['keyctl', 'add_key'] },
  {
    what: 'PID 1 (the agent) cannot be traced: PTRACE_ATTACH (to it or to anything), process_vm_readv and pidfd_getfd of its descriptors fail with EPERM',
    expect: { 'ptrace-attach-1': 'EPERM', 'ptrace-child': 'EPERM', 'process_vm_readv-1': 'EPERM', 'pidfd_getfd-1': 'EPERM' },
    seccomp: ['ptrace', 'process_vm_readv', 'pidfd_getfd'],
  },
  {
    what: 'kernel modules, kexec, reboot, swapon, iopl and the kernel log fail with EPERM',
    expect: { init_module: 'EPERM', kexec_load: 'EPERM', reboot: 'EPERM', swapon: 'EPERM', iopl: 'EPERM', syslog: 'EPERM' },
    seccomp: ['init_module', 'kexec_load', 'reboot', 'swapon', 'iopl'],
  },
  {
    what: 'raw and packet sockets fail with EPERM (no CAP_NET_RAW); a block device node cannot be made (EPERM)',
    expect: { 'socket-raw': 'EPERM', 'socket-packet': 'EPERM', 'mknod-block': 'EPERM' },
    seccomp: [],
  },
  { what: 'TIOCSTI (typing into the terminal of another process) fails with EPERM', expect: { 'ioctl-tiocsti': 'EPERM' }, seccomp: ['ioctl'] },
  {
    what: "XFS_IOC_SWAPEXT (swapping two files' extents past access control) fails with EPERM",
    expect: { 'xfs-swapext': 'EPERM' },
    seccomp: ['ioctl'],
  },
];

describe('system calls', () => {
  for (const attack of SYSCALL_ATTACKS) {
    test(attack.what, async () => {
      const r = await sec.kit(attacker, ['syscall', ...Object.keys(attack.expect)]);
      assert.equal(r.exitCode, 0, r.stderr);
      assert.deepEqual(resultsByProbe(r), attack.expect);
    });
  }

  test('every system call the filter refuses is raised as a seccomp.denied event naming it (records read from the audit netlink group, not the rate-limited kernel log)', async (t) => {
    const id = await sec.sandbox();
    try {
      const r = await sec.kit(id, ['syscall', ...SYSCALL_ATTACKS.flatMap((a) => Object.keys(a.expect))]);
      assert.equal(r.exitCode, 0, r.stderr);
      for (const syscall of new Set(SYSCALL_ATTACKS.flatMap((a) => a.seccomp))) await expectEvent(t, sec.events, 'seccomp.denied', id, { syscall });
    } finally {
      await sec.edge.destroy(id);
    }
  });

  test('ordinary threads raise no seccomp.denied (clone3 is refused with ENOSYS so that libc falls back to clone: not an attack)', async (t) => {
    const id = await sec.sandbox();
    try {
      const r = await sec.kit(id, ['threads', '3']);
      assert.equal(probe(r, 'threads').result, 'OK');
      // A real denial after the threads: once its event is in, the threads' records were read.
      await sec.kit(id, ['syscall', 'bpf']);
      await expectEvent(t, sec.events, 'seccomp.denied', id, { syscall: 'bpf' });
      assert.deepEqual(
        sec.events.events.filter((e) => e.sandboxId === id && e.kind === 'seccomp.denied' && e.data?.syscall === 'clone3'),
        [],
      );
    } finally {
      await sec.edge.destroy(id);
    }
  });

  test('a denial cannot be hidden in noise: after 200 refused keyctl calls, one bpf call is still raised', async (t) => {
    const id = await sec.sandbox();
    try {
      const r = await sec.sh(id, `for i in $(seq 200); do ${KIT} syscall keyctl >/dev/null; done; ${KIT} syscall bpf`);
      assert.equal(probe(r, 'bpf').result, 'EPERM');
      await expectEvent(t, sec.events, 'seccomp.denied', id, { syscall: 'bpf' });
    } finally {
      await sec.edge.destroy(id);
    }
  });

  test('with ptrace allowed for debuggers (security.allowPtrace), PID 1 still cannot be traced or robbed of its descriptors (EPERM: the agent is not dumpable)', async () => {
    const id = await sec.sandbox({ security: { allowPtrace: true } });
    try {
      const r = await sec.kit(id, ['syscall', 'ptrace-child', 'ptrace-attach-1', 'process_vm_readv-1', 'pidfd_getfd-1']);
      // The control: ptrace itself works here (a debugger can attach to its own child).
      assert.deepEqual(resultsByProbe(r), { 'ptrace-child': 'OK', 'ptrace-attach-1': 'EPERM', 'process_vm_readv-1': 'EPERM', 'pidfd_getfd-1': 'EPERM' });
      const mem = await sec.kit(id, ['read', '/proc/1/mem']);
      assert.equal(probe(mem, 'read').result, 'EACCES');
    } finally {
      await sec.edge.destroy(id);
    }
  });

  test('the cgroup v1 release_agent escape: mounting a cgroup hierarchy fails with EPERM and /sys/fs/cgroup is an empty read-only mount', async () => {
    const r = await sec.kit(attacker, ['syscall', 'mount-cgroup']);
    assert.equal(probe(r, 'mount-cgroup').result, 'EPERM');
    const ls = await sec.sh(attacker, `ls -A /sys/fs/cgroup | wc -l; ${KIT} write /sys/fs/cgroup/release_agent /tmp/x; ${KIT} opendir /sys/fs/cgroup/memory`);
    assert.equal(ls.stdout.split('\n')[0], '0', 'no cgroup hierarchy is visible');
    assert.match(probe(ls, 'write').result ?? '', /^(ENOENT|EROFS|EACCES)$/);
    assert.equal(probe(ls, 'opendir').result, 'ENOENT');
  });
});

describe('/proc and /sys', () => {
  test('writing /proc/sysrq-trigger does nothing: it is absent or masked, and the kernel log gets no sysrq line', async () => {
    const sysrqLines = async (): Promise<number> => (await run('dmesg')).stdout.split('\n').filter((l) => /sysrq/i.test(l)).length;
    const before = await sysrqLines();
    // 'h' only prints help to the kernel log: harmless if the defence failed, and visible.
    const r = await sec.sh(attacker, `${KIT} write /proc/sysrq-trigger h; stat -c '%F %t:%T' /proc/sysrq-trigger 2>/dev/null || echo absent`);
    const w = probe(r, 'write');
    const kind = r.stdout.trim().split('\n').pop();
    if (w.result === 'OK') assert.equal(kind, 'character special file 1:3', 'a write that succeeds lands in /dev/null');
    else assert.match(w.result ?? '', /^(ENOENT|EACCES|EROFS|EPERM)$/);
    // The ring buffer may drop old lines meanwhile, never add a sysrq one.
    assert.ok((await sysrqLines()) <= before, 'no sysrq line was logged');
  });

  // With a user namespace the sandbox's root is an unprivileged host uid, so the open fails with
  // EACCES before the read-only mount answers EROFS; either is a refusal.
  test('/proc/sys is read-only: writing kernel.core_pattern, vm.drop_caches and kernel.hostname fails with EROFS or EACCES (host values unchanged)', async () => {
    const files = ['/proc/sys/kernel/core_pattern', '/proc/sys/vm/drop_caches', '/proc/sys/kernel/hostname'];
    const r = await sec.sh(attacker, files.map((f) => `${KIT} write ${f} '|/tmp/pwn'`).join('; '));
    assert.deepEqual(
      probes(r).map((p) => p.path),
      files,
    );
    for (const p of probes(r)) assert.match(p.result ?? '', /^(EROFS|EACCES)$/, `${String(p.path)}: ${p.result}`);
  });

  test('/sys is read-only: uevent_helper and other kernel knobs fail with EROFS or EACCES', async () => {
    const files = ['/sys/kernel/uevent_helper', '/sys/kernel/mm/transparent_hugepage/enabled', '/sys/power/state'];
    const r = await sec.sh(attacker, files.map((f) => `${KIT} write ${f} x`).join('; '));
    assert.equal(probes(r).length, files.length, r.stdout);
    for (const p of probes(r)) assert.match(p.result ?? '', /^(EROFS|EACCES|ENOENT)$/, `${String(p.path)}: ${p.result}`);
    assert.ok(
      probes(r).some((p) => p.result !== 'ENOENT'),
      r.stdout,
    );
  });

  test('/proc/kcore, /proc/keys, /proc/timer_list and the kpage* files read nothing (absent or masked with /dev/null)', async () => {
    const files = ['/proc/kcore', '/proc/keys', '/proc/timer_list', '/proc/kpagecgroup', '/proc/kpageflags', '/proc/kpagecount', '/proc/sched_debug'];
    const r = await sec.sh(attacker, files.map((f) => `${KIT} read ${f}`).join('; '));
    const got = probes(r);
    assert.equal(got.length, files.length, r.stdout);
    for (const p of got) {
      const nothing = p.result === 'ENOENT' || (p.result === 'OK' && p.bytes === 0);
      assert.ok(nothing, `${JSON.stringify(p.path ?? '')} gave ${JSON.stringify(p)}`);
    }
  });
});

describe('descriptors and the agent', () => {
  test("a command inherits only fds 0, 1 and 2 (/dev/null and two pipes); the agent's fds are not readable through /proc/1/fd", async () => {
    const r = await sec.kit(attacker, ['fds']);
    const fds = probes(r).map((p) => [p.fd, String(p.target).replace(/\d+/, 'N')]);
    assert.deepEqual(fds, [
      [0, '/dev/null'],
      [1, 'pipe:[N]'],
      [2, 'pipe:[N]'],
    ]);
    const agent = await sec.sh(
      attacker,
      `for f in /proc/1/fd/*; do readlink $f >/dev/null 2>&1 && echo readable $f; done; ${KIT} read /proc/1/fd/3; ${KIT} read /proc/1/environ; ${KIT} read /proc/1/mem`,
    );
    assert.doesNotMatch(agent.stdout, /readable/);
    assert.deepEqual(
      probes(agent).map((p) => p.result),
      ['EACCES', 'EACCES', 'EACCES'],
    );
  });

  test("chronus's socket cannot be reached: no socket file inside, none in /proc/net/unix, its host path does not exist inside", async () => {
    const hostSocket = path.join(sec.node.home, 'sandboxes', attacker, 'agent.sock');
    const r = await sec.sh(
      attacker,
      `find / -xdev -type s 2>/dev/null; echo sockets-end; tail -n +2 /proc/net/unix | wc -l; ${KIT} unix ${hostSocket}; ${KIT} unix @chronus`,
    );
    const [sockets, unixCount] = r.stdout.split('sockets-end\n');
    assert.equal(sockets, '', 'no unix socket file in the sandbox');
    assert.equal(unixCount?.split('\n')[0], '0', 'no unix socket in the sandbox network namespace');
    assert.deepEqual(
      probes(r).map((p) => p.result),
      ['ENOENT', 'ECONNREFUSED'],
    );
  });

  test('forged agent frames on stdout are output: the real exit code is reported and the bytes come back verbatim', async () => {
    const att = await sec.edge.spawn(attacker, { cmd: `${KIT} forge-exit-frame; exit 3` });
    const chunks: Uint8Array[] = [];
    att.onOutput((ev) => {
      if (ev.kind === 'data' && ev.stream === 'stdout') chunks.push(ev.data);
    });
    const exit = await att.exited;
    assert.equal(exit.exitCode, 3);
    const out = Buffer.concat(chunks);
    assert.equal(out.length, 26);
    assert.equal(out.readUInt16LE(4), 0x92, 'the EXIT frame header came back as data');
    const ping = await sec.sh(attacker, 'echo alive');
    assert.equal(ping.stdout, 'alive\n');
  });

  test('signals to PID 1 from inside (SIGKILL, SIGSTOP, SIGTERM, SIGHUP) do not stop the agent', async () => {
    const r = await sec.sh(attacker, 'kill -KILL 1; kill -STOP 1; kill -TERM 1; kill -HUP 1; sleep 0.3; grep State /proc/1/status');
    assert.equal(r.exitCode, 0, r.stderr);
    // Sleeping or, on a busy machine, caught running: anything but stopped (T) or gone.
    assert.match(r.stdout, /State:\s+[RS]/, 'PID 1 is still running, not stopped');
    const again = await sec.sh(attacker, 'echo still-served');
    assert.equal(again.stdout, 'still-served\n');
  });
});
