// The QEMU base's wait for a guest, without QEMU: it ends with the boot deadline, an abort or the
// process's exit, and leaves no listener on the caller's signal.
import assert from 'node:assert/strict';
import { mkdtemp, rm } from 'node:fs/promises';
import { getEventListeners } from 'node:events';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { DsecError } from '@dsec/protocol';
import { QemuSandboxes } from './sandboxes.js';
import type { QemuMachine, QemuPaths, QemuVm } from './sandboxes.js';

let dir: string;

/** A QEMU backend whose sockets nobody listens on (no QEMU is ever started). */
class Unanswered extends QemuSandboxes<QemuVm, QemuPaths> {
  readonly kind = 'microvm' as const;
  protected readonly agentPorts = 2;
  protected paths(id: string): QemuPaths {
    const d = path.join(dir, id);
    return { dir: d, run: d, record: `${d}/r`, claim: `${d}/c`, pid: `${d}/p`, log: `${d}/l`, paused: `${d}/x`, state: `${d}/s` };
  }
  protected agentSocket(id: string, port: number): string {
    return path.join(dir, `${id}.agent${port}`);
  }
  protected qmpSocket(id: string): string {
    return path.join(dir, `${id}.qmp`);
  }
  protected machine(): Promise<QemuMachine> {
    throw new Error('not started here');
  }
  protected adopted(): QemuVm {
    return { portsInUse: new Set() };
  }
  wait(id: string, exited: Promise<never>, signal?: AbortSignal): Promise<void> {
    return this.awaitGuest(id, this.adopted(), exited, signal);
  }
}

function backend(bootTimeoutMs: number): Unanswered {
  return new Unanswered({
    sandboxesDir: dir,
    // Neither is touched by the wait.
    cgroups: { create: unused, memory: unused, killAll: unused, remove: unused },
    idRanges: { release: unused, reconcile: unused },
    layers: { acquire: () => Promise.resolve(''), release: () => Promise.resolve() },
    events: () => undefined,
    qemu: 'qemu-system-x86_64',
    bootTimeoutMs,
  });
}

const unused = (): Promise<never> => Promise.reject(new Error('not used by the wait'));
const never = (): Promise<never> => new Promise<never>(() => undefined);

before(async () => {
  dir = await mkdtemp(path.join(os.tmpdir(), 'dsec-qemu-wait-'));
});
after(async () => {
  await rm(dir, { recursive: true, force: true });
});

describe('QemuSandboxes.awaitGuest', () => {
  test('ends at the boot deadline and removes its abort listener', async () => {
    const signal = new AbortController().signal;
    const t0 = Date.now();
    await assert.rejects(backend(300).wait('a', never(), signal), (err: unknown) => err instanceof DsecError && err.code === 'UNAVAILABLE');
    assert.ok(Date.now() - t0 < 20_000, 'it gave up after its deadline');
    assert.equal(getEventListeners(signal, 'abort').length, 0, 'no listener left on the caller signal');
  });

  test("ends at once on an abort of the caller's signal, with its reason, and stops retrying", async () => {
    const ac = new AbortController();
    const reason = new DsecError('CANCELLED', 'create aborted');
    setTimeout(() => ac.abort(reason), 100);
    const t0 = Date.now();
    await assert.rejects(backend(60_000).wait('b', never(), ac.signal), (err: unknown) => err === reason);
    assert.ok(Date.now() - t0 < 20_000, 'the abort ended the wait long before the deadline');
    assert.equal(getEventListeners(ac.signal, 'abort').length, 0);
  });

  test("ends at once when QEMU exits, with the exit's error", async () => {
    const signal = new AbortController().signal;
    const exit = new DsecError('BACKEND_FAILED', 'QEMU exited (1) while booting');
    const exited = new Promise<never>((_, reject) => setTimeout(() => reject(exit), 100));
    await assert.rejects(backend(60_000).wait('c', exited, signal), (err: unknown) => err === exit);
    assert.equal(getEventListeners(signal, 'abort').length, 0);
  });
});
