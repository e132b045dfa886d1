// How long the node waits on a sandbox's agent. A command's `timeoutMs` is enforced by the agent
// (chronus kills it and reports the exit); an agent that was stopped (ptrace, SIGSTOP, a guest
// that stalls it) enforces nothing and answers nothing. So the node bounds the wait itself: once
// a command's timeoutMs and a grace have passed without its exit, the agent is pinged; when the
// ping goes unanswered the command is answered with a TIMEOUT error (the agent is still asked to
// kill it, should it ever answer) and `sandbox.agent-unresponsive` is raised, once per episode.
import { DsecError } from '@dsec/protocol';
import type { RaisedEvent } from '@dsec/protocol';
import type { SandboxAgent } from './backend.js';

/** How long after a command's timeoutMs its exit may take to arrive before the agent is pinged. */
export const EXIT_GRACE_MS = 3000;
/** How long the agent has to answer that ping before it is taken for unresponsive. */
export const AGENT_PING_TIMEOUT_MS = 5000;

/** What the watch needs of the node. */
export interface AgentWatchDeps {
  raise: (ev: RaisedEvent) => void;
  /** True while the sandbox runs with no pause, resume or destroy under way (only then must its agent answer). */
  isRunning: (id: string) => boolean;
  /** The sandbox's agent connection. */
  agent: (id: string) => Promise<SandboxAgent>;
}

/** A command's bound on its agent: `signal` aborts (with a TIMEOUT error) when the node gives up. */
export interface CommandDeadline {
  readonly signal: AbortSignal;
  /** The command ended (or was refused): no more checks. */
  stop(): void;
}

/** Liveness checks of the node's agents. */
export class AgentWatch {
  /** Sandboxes whose agent did not answer its last ping (the event is raised once per episode). */
  private readonly unresponsive = new Set<string>();

  constructor(
    private readonly deps: AgentWatchDeps,
    private readonly o: { graceMs?: number; pingTimeoutMs?: number } = {},
  ) {}

  /**
   * Pings the agent, bounded: true when it answered, false when it did not (the event raised),
   * undefined when the sandbox was not running throughout (a frozen agent owes no answer).
   */
  async probe(id: string): Promise<boolean | undefined> {
    if (!this.deps.isRunning(id)) return undefined;
    const bound = this.o.pingTimeoutMs ?? AGENT_PING_TIMEOUT_MS;
    const started = Date.now();
    let timer: NodeJS.Timeout | undefined;
    let failure: string | undefined;
    try {
      const ping = this.deps.agent(id).then((agent) => agent.ping());
      ping.catch(() => undefined);
      const late = new Promise<never>((_, reject) => {
        timer = setTimeout(() => reject(new Error(`no answer to a ping within ${bound} ms`)), bound);
        timer.unref();
      });
      await Promise.race([ping, late]);
    } catch (err) {
      failure = (err as Error).message;
    } finally {
      clearTimeout(timer);
    }
    if (failure === undefined) {
      this.unresponsive.delete(id);
      return true;
    }
    if (!this.deps.isRunning(id)) return undefined;
    if (!this.unresponsive.has(id)) {
      this.unresponsive.add(id);
      this.deps.raise({
        kind: 'sandbox.agent-unresponsive',
        severity: 'warning',
        sandboxId: id,
        message: `sandbox ${id}: its agent did not answer (${failure}); commands waiting on it are answered with TIMEOUT`,
        data: { pingTimeoutMs: bound, waitedMs: Date.now() - started },
      });
    }
    return false;
  }

  /**
   * Bounds a command with `timeoutMs` (its start included): from timeoutMs + the grace on, the
   * agent is pinged every grace; the signal aborts at the first unanswered ping.
   */
  deadline(id: string, timeoutMs: number): CommandDeadline {
    const grace = this.o.graceMs ?? EXIT_GRACE_MS;
    const ctl = new AbortController();
    let timer: NodeJS.Timeout | undefined;
    let stopped = false;
    const arm = (ms: number): void => {
      timer = setTimeout(() => void check(), ms);
      timer.unref();
    };
    const check = async (): Promise<void> => {
      const answered = await this.probe(id);
      if (stopped) return;
      if (answered === false) {
        stopped = true;
        ctl.abort(
          new DsecError(
            'TIMEOUT',
            `sandbox ${id}: command not reported done ${grace} ms after its timeoutMs (${timeoutMs} ms): the sandbox's agent does not answer`,
            {
              timeoutMs,
              reason: 'agent-unresponsive',
            },
          ),
        );
        return;
      }
      arm(grace);
    };
    arm(timeoutMs + grace);
    return {
      signal: ctl.signal,
      stop: () => {
        stopped = true;
        clearTimeout(timer);
      },
    };
  }

  /** Forgets a sandbox (its destroy began). */
  remove(id: string): void {
    this.unresponsive.delete(id);
  }
}
