// Unit tests of the node's bound on a stopped agent (no root): a real chronus runs unprivileged
// on a socket pair and is stopped with SIGSTOP, as a guest's ptrace attach stops it. A command
// with timeoutMs must then be answered with TIMEOUT in bounded time, and the event raised once.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import type { ChildProcess } from 'node:child_process';
import path from 'node:path';
import type { Duplex } from 'node:stream';
import { fileURLToPath } from 'node:url';
import { after, describe, test } from 'node:test';
import { DsecError } from '@dsec/protocol';
import type { RaisedEvent } from '@dsec/protocol';
import { AgentWatch } from './agent-watch.js';
import type { SandboxAgent } from './backend.js';
import { ChronusClient } from './chronus/client.js';
import { SandboxCalls } from './sandbox-calls.js';
import { SandboxMonitor } from './sandbox-monitor.js';

const CHRONUS = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../../chronus/build/chronus');
const ID = 'sbx-agent-watch';
/** Generous against a hang: the SDK's own timeout is minutes. */
const ANSWER_BOUND_MS = 15_000;

/** The node's command path over one agent connection (the sandbox always running). */
class Calls extends SandboxCalls {
  readonly events: RaisedEvent[] = [];
  protected readonly monitor = new SandboxMonitor({ raise: () => undefined, isRunning: () => true, runningSessions: () => Promise.resolve(new Set()) });
  protected readonly agentWatch: AgentWatch;

  constructor(private readonly client: ChronusClient) {
    super();
    this.agentWatch = new AgentWatch(
      { raise: (ev) => this.events.push(ev), isRunning: () => true, agent: () => Promise.resolve(client as SandboxAgent) },
      { graceMs: 500, pingTimeoutMs: 1000 },
    );
  }

  protected withAgent<T>(_id: string, fn: (agent: SandboxAgent) => Promise<T>): Promise<T> {
    return fn(this.client);
  }

  protected commandEnv(): Record<string, string> | undefined {
    return undefined;
  }

  protected runningAgain(): Promise<boolean> {
    return Promise.resolve(false);
  }
}

const agents: ChildProcess[] = [];
after(() => {
  for (const a of agents) a.kill('SIGKILL');
});

function startAgent(): { agent: ChildProcess; calls: Calls; client: ChronusClient } {
  const agent = spawn(CHRONUS, ['--stream-fd', '3'], { stdio: ['ignore', 'ignore', 'ignore', 'pipe'] });
  agents.push(agent);
  const client = new ChronusClient(agent.stdio[3] as Duplex);
  return { agent, calls: new Calls(client), client };
}

/** Settles `p` or fails the test after the bound (never a hang). */
async function within<T>(p: Promise<T>, ms = ANSWER_BOUND_MS): Promise<{ value?: T; error?: unknown; ms: number }> {
  const t0 = Date.now();
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<never>((_, reject) => (timer = setTimeout(() => reject(new Error(`no answer within ${ms} ms`)), ms)));
  try {
    return { value: await Promise.race([p, late]), ms: Date.now() - t0 };
  } catch (error) {
    if ((error as Error).message === `no answer within ${ms} ms`) throw error;
    return { error, ms: Date.now() - t0 };
  } finally {
    clearTimeout(timer);
  }
}

function isAgentTimeout(err: unknown): boolean {
  return err instanceof DsecError && err.code === 'TIMEOUT' && err.details.reason === 'agent-unresponsive';
}

describe('agent watch', () => {
  test('a live agent enforces timeoutMs itself: its exit report comes, no event', async () => {
    const { calls, client } = startAgent();
    await client.ping();
    const r = await within(calls.exec(ID, { argv: ['sleep', '30'], timeoutMs: 300 }));
    assert.equal(r.error, undefined);
    assert.equal(r.value?.timedOut, true);
    assert.equal(r.value?.signal, 'SIGKILL');
    assert.deepEqual(calls.events, []);
  });

  test('an agent stopped while a command runs: the stream ends with TIMEOUT, the event is raised once', async () => {
    const { agent, calls, client } = startAgent();
    const proc = await calls.spawn(ID, { argv: ['sleep', '30'], timeoutMs: 800 });
    agent.kill('SIGSTOP');
    const r = await within(proc.exited);
    assert.ok(isAgentTimeout(r.error), `got ${String(r.error)}`);
    // A second command while it is still stopped: answered too, no second event.
    const again = await within(calls.exec(ID, { cmd: 'echo hi', timeoutMs: 200 }));
    assert.ok(isAgentTimeout(again.error), `got ${String(again.error)}`);
    assert.equal(calls.events.length, 1);
    assert.equal(calls.events[0]?.kind, 'sandbox.agent-unresponsive');
    assert.equal(calls.events[0]?.sandboxId, ID);
    // Let go, it answers again and the node's requests (the kills) were served.
    agent.kill('SIGCONT');
    await within(client.ping());
    // Every command goes once the agent runs again (killed at the node's request or by its own timer).
    const t0 = Date.now();
    while ((await client.list()).some((p) => p.running)) {
      assert.ok(Date.now() - t0 < ANSWER_BOUND_MS, 'commands still running after the agent came back');
      await new Promise((r) => setTimeout(r, 100));
    }
    const ok = await within(calls.exec(ID, { cmd: 'echo back', timeoutMs: 5000 }));
    assert.equal(ok.value?.stdout, 'back\n');
  });

  test('an agent stopped before a command starts: the start itself is bounded', async () => {
    const { agent, calls, client } = startAgent();
    await client.ping();
    agent.kill('SIGSTOP');
    const r = await within(calls.exec(ID, { argv: ['sleep', '30'], timeoutMs: 300, stdin: 'x' }));
    assert.ok(isAgentTimeout(r.error), `got ${String(r.error)}`);
    assert.equal(calls.events.length, 1);
    agent.kill('SIGCONT');
    await within(client.ping());
  });

  test('a command without timeoutMs is not bounded by the node', async () => {
    const { calls } = startAgent();
    const r = await within(calls.exec(ID, { cmd: 'sleep 1; echo done' }));
    assert.equal(r.value?.stdout, 'done\n');
    assert.deepEqual(calls.events, []);
  });
});
