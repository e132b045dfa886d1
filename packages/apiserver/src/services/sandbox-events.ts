// The events that follow a sandbox's row as lists show it: created, each settled state, deleted.
// A live list (the dashboard's) follows them on GET /v1/events instead of polling
// GET /v1/sandboxes. Each carries the row as the list shows it (`data.sandbox`) and, for a row
// already gone, whose it was, so that exactly the keys that could see the sandbox see its events.
import type { EventKind, Sandbox, SandboxState } from '@dsec/protocol';
import type { SandboxTable } from '../db/schema.js';
import type { ServiceSinks } from './common.js';

/** The fields of a sandbox that a list shows, carried in `data.sandbox` of the row events. */
export type SandboxSummary = Pick<Sandbox, 'id' | 'project' | 'node' | 'backend' | 'state' | 'labels' | 'createdAt' | 'resources'>;

/** The summary of a sandbox in the API's view. */
export function sandboxSummary(s: Sandbox): SandboxSummary {
  return { id: s.id, project: s.project, node: s.node, backend: s.backend, state: s.state, labels: s.labels, createdAt: s.createdAt, resources: s.resources };
}

/** Raises the row events of sandboxes (never those of a pool's unclaimed members: their ids are secret). */
export class SandboxRowEvents {
  constructor(private readonly sinks: ServiceSinks) {}

  /** A sandbox its caller now holds (created, or claimed from a pool); `labels`: all of its labels (rules match them). */
  created(s: Sandbox, labels: Record<string, string>): void {
    this.raise('sandbox.created', s.id, s.node, `sandbox ${s.id} created on ${s.node}`, { sandbox: sandboxSummary(s) }, { projectId: s.project, labels });
  }

  /** A row settled in a new state (`from` the one it left). */
  stateChanged(row: Pick<SandboxTable, 'id' | 'node' | 'project_id'>, state: SandboxState, from: string): void {
    this.raise('sandbox.state-changed', row.id, row.node, `sandbox ${row.id} is ${state} (was ${from})`, { state, from, project: row.project_id });
  }

  /** A row deleted: its events keep the project it belonged to. */
  deleted(row: Pick<SandboxTable, 'id' | 'node' | 'project_id'>, from: string, labels: Record<string, string> = {}): void {
    this.raise(
      'sandbox.deleted',
      row.id,
      row.node,
      `sandbox ${row.id} deleted (was ${from})`,
      { from, project: row.project_id },
      { projectId: row.project_id, labels },
    );
  }

  private raise(
    kind: EventKind,
    sandboxId: string,
    node: string,
    message: string,
    data: Record<string, unknown>,
    owner?: { projectId: string; labels: Record<string, string> },
  ): void {
    const ev = { kind, severity: 'info' as const, sandboxId, node, message, data };
    if (owner) this.sinks.raiseOwned(ev, owner);
    else this.sinks.raise(ev);
  }
}
