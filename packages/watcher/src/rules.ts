// Run-time rules (POST /v1/rules): event rules change the severity of matching events or drop
// them; tightening rules (deny-path, deny-domain, deny-syscall) are merged into the spec of
// every new sandbox in the rule's project and the projects below it.
import type { CreateRuleRequest, EventKind, EventSeverity, RuleKind } from '@dsec/protocol';

/** A stored rule. */
export interface RuleRecord {
  id: string;
  /** The project whose sandboxes (and sub-projects' sandboxes) the rule applies to. */
  projectId: string;
  kind: RuleKind;
  spec: CreateRuleRequest;
  /** Id of the key that created it. */
  createdBy: string;
  createdAt: string;
}

/** Where each kind of rule takes effect (docs/api.md explains why). */
export const RULE_APPLIES_TO: Record<RuleKind, string> = {
  event: 'new and running sandboxes',
  'deny-path': 'new sandboxes',
  'deny-domain': 'new sandboxes',
  'deny-syscall': 'new sandboxes',
};

/** What rules add to a new sandbox's hardening. */
export interface Tightening {
  readOnlyPaths: string[];
  denySyscalls: string[];
  denyDomains: string[];
  /** Ids of the rules that contributed. */
  ruleIds: string[];
}

/** What an event rule needs to know about the sandbox an event concerns. */
export interface EventSubject {
  kind: EventKind;
  sandboxId: string | null;
  /** The sandbox's project and its ancestors, nearest first; empty for node-level events. */
  ancestry: string[];
  labels: Record<string, string>;
}

/** The outcome of event rules for one event. */
export type EventVerdict = { suppress: true; ruleId: string } | { suppress: false; severity: EventSeverity; ruleId?: string };

const SEVERITY_RANK: Record<EventSeverity, number> = { info: 0, warning: 1, critical: 2 };

/** Most rules kept; creating more is refused. */
export const MAX_RULES = 1000;

/**
 * The rules in force, in creation order. Reads are synchronous (the create path and the event
 * pipeline consult it for every sandbox and event); the store is the source of truth and is
 * re-read by the watcher's passes, so rules added through another replica arrive too.
 */
export class RuleSet {
  private rules: RuleRecord[] = [];

  constructor(private readonly rootProjectId: string) {}

  /** Replaces the rules (after reading them from the store). */
  replace(rules: RuleRecord[]): void {
    this.rules = [...rules].sort((a, b) => (a.id < b.id ? -1 : a.id > b.id ? 1 : 0));
  }

  add(rule: RuleRecord): void {
    if (!this.rules.some((r) => r.id === rule.id)) this.rules.push(rule);
  }

  remove(id: string): void {
    this.rules = this.rules.filter((r) => r.id !== id);
  }

  all(): RuleRecord[] {
    return [...this.rules];
  }

  get size(): number {
    return this.rules.length;
  }

  /**
   * Applies event rules to an event of `severity`. Rules apply in creation order. A rule of the
   * root project may set any severity or drop the event; a rule of any other project may only
   * raise the severity (a tenant cannot hide its own sandboxes' events from the operator).
   */
  judge(subject: EventSubject, severity: EventSeverity): EventVerdict {
    let verdict: EventVerdict = { suppress: false, severity };
    for (const r of this.rules) {
      if (r.spec.kind !== 'event' || !this.appliesTo(r, subject.ancestry)) continue;
      const m = r.spec.match;
      if (m.events && !m.events.includes(subject.kind)) continue;
      if (m.sandbox !== undefined && m.sandbox !== subject.sandboxId) continue;
      if (m.labels && !Object.entries(m.labels).every(([k, v]) => subject.labels[k] === v)) continue;
      const root = r.projectId === this.rootProjectId;
      if (r.spec.suppress) {
        if (root) return { suppress: true, ruleId: r.id };
        continue;
      }
      const wanted = r.spec.severity;
      if (wanted === undefined) continue;
      if (root || SEVERITY_RANK[wanted] > SEVERITY_RANK[verdict.severity]) verdict = { suppress: false, severity: wanted, ruleId: r.id };
    }
    return verdict;
  }

  /** Tightening for a new sandbox of a project (given with its ancestors, nearest first). */
  tightening(ancestry: string[]): Tightening {
    const t: Tightening = { readOnlyPaths: [], denySyscalls: [], denyDomains: [], ruleIds: [] };
    for (const r of this.rules) {
      if (!this.appliesTo(r, ancestry)) continue;
      const s = r.spec;
      if (s.kind === 'deny-path') pushNew(t.readOnlyPaths, s.path);
      else if (s.kind === 'deny-syscall') pushNew(t.denySyscalls, s.syscall);
      else if (s.kind === 'deny-domain') pushNew(t.denyDomains, s.domain);
      else continue;
      t.ruleIds.push(r.id);
    }
    return t;
  }

  private appliesTo(r: RuleRecord, ancestry: string[]): boolean {
    // Node-level events (no sandbox) fall under the root project's rules only.
    return ancestry.length === 0 ? r.projectId === this.rootProjectId : ancestry.includes(r.projectId);
  }
}

function pushNew(list: string[], value: string): void {
  if (!list.includes(value)) list.push(value);
}
