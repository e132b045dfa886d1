// Unit tests of the sandbox monitor (no root): counters and host processes are fakes of the
// backend facets; what is checked is which events are raised and what an exit is judged.
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import type { RaisedEvent, SandboxSpec } from '@dsec/protocol';
import type { CounterFacet, SandboxCounters } from './backend.js';
import type { AgentExit } from './chronus/client.js';
import { SandboxMonitor } from './sandbox-monitor.js';

const SPEC: SandboxSpec = { image: { base: 'busybox' }, resources: { memoryMiB: 64, pids: 32 } };

function exit(over: Partial<AgentExit>): AgentExit {
  return {
    proc: 1,
    pid: 7,
    exitCode: null,
    signal: 'SIGKILL',
    timedOut: false,
    durationMs: 5,
    cpuUserMs: 0,
    cpuSysMs: 0,
    peakMemoryKiB: 0,
    stdoutBytes: 0,
    stderrBytes: 0,
    ...over,
  };
}

function setup(start: SandboxCounters): { monitor: SandboxMonitor; counters: SandboxCounters; events: RaisedEvent[]; running: Set<string> } {
  const counters = { ...start };
  const facet: CounterFacet = { read: async () => ({ ...counters }), readNow: () => ({ ...counters }) };
  const events: RaisedEvent[] = [];
  const running = new Set(['sb']);
  const monitor = new SandboxMonitor({ raise: (ev) => events.push(ev), isRunning: (id) => running.has(id), runningSessions: async () => new Set() });
  monitor.add('sb', { counters: facet }, () => SPEC);
  return { monitor, counters, events, running };
}

describe('sandbox monitor', () => {
  test('an OOM kill since a process started is its verdict, raised at once naming it; counts from before are not news', () => {
    const { monitor, counters, events } = setup({ oomKills: 3, pidsLimitHits: 1 });
    monitor.spawned('sb', 1, monitor.oomBaseline('sb'));
    monitor.spawned('sb', 2, monitor.oomBaseline('sb'));
    assert.equal(monitor.judge('sb', exit({ proc: 2 })).oomKilled, false, 'no kill since it started');
    counters.oomKills = 4;
    const info = monitor.judge('sb', exit({ proc: 1, pid: 7 }));
    assert.equal(info.oomKilled, true);
    assert.equal(info.signal, 'SIGKILL');
    assert.equal(events.length, 1);
    assert.equal(events[0]?.kind, 'oom.kill');
    assert.deepEqual(events[0]?.data, { count: 1, total: 4, memoryMiB: 64, proc: 1, pid: 7 });
    monitor.judge('sb', exit({ proc: 1 }));
    assert.equal(events.length, 1, 'each kill is told once');
  });

  test('not an OOM kill: a timeout, another signal, a process it did not see start, a backend without counters', () => {
    const { monitor, counters } = setup({ oomKills: 0, pidsLimitHits: 0 });
    monitor.spawned('sb', 1, 0);
    counters.oomKills = 1;
    assert.equal(monitor.judge('sb', exit({ proc: 1, timedOut: true })).oomKilled, false);
    assert.equal(monitor.judge('sb', exit({ proc: 1, signal: 'SIGTERM' })).oomKilled, false);
    assert.equal(monitor.judge('sb', exit({ proc: 9 })).oomKilled, false);
    assert.equal(monitor.judge('sb', exit({ proc: 1, signal: null, exitCode: 137 })).oomKilled, true, 'a shell reports its child SIGKILL as 137');
    const bare = new SandboxMonitor({ raise: () => undefined, isRunning: () => true, runningSessions: async () => new Set() });
    bare.add('vm', {}, () => SPEC);
    bare.spawned('vm', 1, bare.oomBaseline('vm'));
    assert.equal(bare.judge('vm', exit({ proc: 1 })).oomKilled, false);
  });

  test('the scan raises refused forks of running sandboxes only', async () => {
    const { monitor, counters, events, running } = setup({ oomKills: 0, pidsLimitHits: 0 });
    running.delete('sb');
    counters.pidsLimitHits = 2;
    monitor.start(5);
    await new Promise((r) => setTimeout(r, 30));
    assert.equal(events.length, 0, 'a paused sandbox is not read');
    running.add('sb');
    for (let i = 0; i < 50 && events.length === 0; i++) await new Promise((r) => setTimeout(r, 10));
    monitor.close();
    assert.equal(events[0]?.kind, 'pids.limit-hit');
    assert.deepEqual(events[0]?.data, { count: 2, total: 2, pidsLimit: 32 });
  });
});
