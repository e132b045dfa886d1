import { z } from 'zod';

/** How urgent an event is. */
export const EventSeveritySchema = z.enum(['info', 'warning', 'critical']);
/** How urgent an event is. */
export type EventSeverity = z.infer<typeof EventSeveritySchema>;

/**
 * Kinds of events that edge, the egress proxy, the control plane and the watcher raise. A kind
 * names what happened, not who noticed it; rules (watcher) decide severity and what follows.
 */
export const EVENT_KINDS = [
  // containment
  'protected-path.write',
  'seccomp.denied',
  'pids.limit-hit',
  'oom.kill',
  'process.survived-command',
  'control.forged-message',
  // network
  'egress.denied',
  'egress.port-scan',
  // lifecycle
  'lease.exceeded',
  'sandbox.paused',
  'sandbox.resumed',
  'sandbox.lost',
  'owner.lost',
  // anything a rule added at run time matched
  'rule.matched',
] as const;
/** One of {@link EVENT_KINDS}. */
export type EventKind = (typeof EVENT_KINDS)[number];

/** An event as it is raised (before the watcher stores it and gives it an id). */
export interface RaisedEvent {
  kind: EventKind;
  /** Default severity; a watcher rule may raise or lower it. */
  severity: EventSeverity;
  /** The sandbox concerned, when there is one. */
  sandboxId?: string;
  /** The node that saw it. */
  node?: string;
  /** One line for humans. */
  message: string;
  /** Kind-specific fields (destination, path, syscall, count). Small and JSON-serialisable. */
  data?: Record<string, unknown>;
  /** ISO time it happened; the sink fills it in when absent. */
  at?: string;
}

/** Where raised events go. Implementations must not throw or block the caller. */
export type EventSink = (ev: RaisedEvent) => void;
