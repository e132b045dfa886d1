import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, test } from 'node:test';
import { DsecError } from '@dsec/protocol';
import type { RaisedEvent } from '@dsec/protocol';
import { MAX_RESTARTS_IN_FLIGHT, MAX_SERVER_RESTARTS_EVER, RESTART_RETRY_MS, SecurityMonitor } from './security-monitor.js';

const dir = mkdtempSync(path.join(os.tmpdir(), 'dsec-monitor-'));
after(() => rmSync(dir, { recursive: true, force: true }));
/** An empty refusal log (the monitor reads each sandbox's). */
let logs = 0;
const log = (): string => {
  const file = path.join(dir, `${++logs}.log`);
  writeFileSync(file, '');
  return file;
};

/** A monitor on a clock the test moves, and the events it raised. */
function monitor(): { m: SecurityMonitor; events: RaisedEvent[]; clock: { t: number } } {
  const events: RaisedEvent[] = [];
  const clock = { t: 1_000_000 };
  const m = new SecurityMonitor({
    raise: (ev) => events.push(ev),
    sandboxOfIdBase: () => undefined,
    cgroupParent: 'dsec-test',
    kernelLog: false,
    now: () => clock.t,
  });
  after(() => m.close());
  return { m, events, clock };
}

/** A protected-path server whose restarts the test settles one by one. */
class Server {
  alive = false;
  readonly pending: Array<{ resolve: () => void; reject: (err: Error) => void }> = [];
  tries = 0;
  readonly serving = (): boolean => this.alive;
  readonly restart = (): Promise<void> => {
    this.tries++;
    return new Promise((resolve, reject) =>
      this.pending.push({
        resolve: () => {
          this.alive = true;
          resolve();
        },
        reject,
      }),
    );
  };
}

/** Lets the settled restarts' callbacks run. */
const settle = (): Promise<void> => new Promise((resolve) => setImmediate(resolve));

const kinds = (events: RaisedEvent[], id: string): string[] => events.filter((e) => e.sandboxId === id).map((e) => e.kind);

test('at most MAX_RESTARTS_IN_FLIGHT restarts run at once; one settled lets the next start', async () => {
  const { m, events, clock } = monitor();
  const servers = Array.from({ length: 10 }, () => new Server());
  servers.forEach((s, i) => m.followRefusals(`sb-${i}`, log(), false, s.serving, s.restart));
  clock.t += 60_000; // past the grace of adopted sandboxes
  const started = (): number => servers.reduce((n, s) => n + s.tries, 0);
  for (let k = 0; k < 5; k++) m.poll();
  assert.equal(started(), MAX_RESTARTS_IN_FLIGHT);
  servers
    .find((s) => s.pending.length > 0)
    ?.pending.shift()
    ?.resolve();
  await settle();
  m.poll();
  assert.equal(started(), MAX_RESTARTS_IN_FLIGHT + 1);
  while (servers.some((s) => s.pending.length > 0)) {
    for (const s of servers) s.pending.shift()?.resolve();
    await settle();
    m.poll();
  }
  assert.deepEqual(
    servers.map((s) => s.tries),
    servers.map(() => 1),
  );
  assert.equal(events.filter((e) => e.kind === 'protected-path.server-restarted').length, servers.length);
  assert.equal(events.filter((e) => e.kind === 'protected-path.server-gone').length, 0);
});

test('a restart that failed is tried again after a wait that doubles; a refused one is final', async () => {
  const { m, events, clock } = monitor();
  const flaky = new Server();
  const refused = new Server();
  m.followRefusals('flaky', log(), true, flaky.serving, flaky.restart);
  m.followRefusals('refused', log(), true, refused.serving, refused.restart);
  m.poll();
  assert.deepEqual([flaky.tries, refused.tries], [1, 1]);
  flaky.pending.shift()?.reject(new DsecError('BACKEND_FAILED', 'dsec-launch --serve: cannot start a launch (errno 11)'));
  refused.pending.shift()?.reject(new DsecError('CONFLICT', '/project/tests is served still'));
  await settle();
  assert.deepEqual(kinds(events, 'refused'), ['protected-path.server-gone']);
  assert.match(events[0]?.message ?? '', /refused: \/project\/tests is served still/);
  clock.t += RESTART_RETRY_MS - 1;
  m.poll();
  assert.equal(flaky.tries, 1, 'not before its wait');
  clock.t += 1;
  m.poll();
  assert.equal(flaky.tries, 2);
  flaky.pending.shift()?.reject(new DsecError('BACKEND_FAILED', 'exit 137'));
  await settle();
  clock.t += RESTART_RETRY_MS;
  m.poll();
  assert.equal(flaky.tries, 2, 'the second wait is twice the first');
  clock.t += RESTART_RETRY_MS;
  m.poll();
  assert.equal(flaky.tries, 3);
  flaky.pending.shift()?.resolve();
  await settle();
  clock.t += 10 * RESTART_RETRY_MS;
  m.poll();
  assert.deepEqual(kinds(events, 'flaky'), ['protected-path.server-restarted']);
  assert.equal(refused.tries, 1, 'a refusal is not retried');
  assert.deepEqual(kinds(events, 'refused'), ['protected-path.server-gone']);
});

test('a server that keeps dying slower than the window allows is restarted MAX_SERVER_RESTARTS_EVER times, then raised gone', async () => {
  const { m, events, clock } = monitor();
  const s = new Server();
  m.followRefusals('sb', log(), true, s.serving, s.restart);
  for (let death = 1; death <= MAX_SERVER_RESTARTS_EVER + 3; death++) {
    clock.t += 30_000; // two deaths a minute: within the window's budget
    s.alive = false;
    m.poll();
    s.pending.shift()?.resolve();
    await settle();
  }
  assert.equal(s.tries, MAX_SERVER_RESTARTS_EVER);
  const raised = kinds(events, 'sb');
  assert.equal(raised.filter((k) => k === 'protected-path.server-restarted').length, MAX_SERVER_RESTARTS_EVER);
  assert.deepEqual(raised.slice(MAX_SERVER_RESTARTS_EVER), ['protected-path.server-gone']);
  assert.match(events.at(-1)?.message ?? '', new RegExp(`restarted ${MAX_SERVER_RESTARTS_EVER} times in all`));
});
