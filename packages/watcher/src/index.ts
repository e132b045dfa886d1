export {
  Watcher,
  DEFAULT_WATCH_INTERVAL_MS,
  DEFAULT_GC_INTERVAL_MS,
  DEFAULT_MAINTENANCE_INTERVAL_MS,
  DEFAULT_LOST_AFTER_MS,
  DEFAULT_ORPHAN_GRACE_MS,
} from './watcher.js';
export type { WatchedNode, WatchedSandbox, WatcherOptions, WatcherTarget } from './watcher.js';
export {
  EventHub,
  DEFAULT_EVENTS_PER_WINDOW,
  DEFAULT_EVENT_WINDOW_MS,
  DEFAULT_EVENT_FLUSH_MS,
  MAX_PENDING_EVENTS,
  DENIAL_KINDS,
  severitiesFrom,
} from './events.js';
export type { EventHubOptions, EventOwner, EventQuery, EventSandbox, EventStore, EventSubscription, SandboxLookup, StoredEvent } from './events.js';
export { AuditLog, MAX_AUDIT_BUFFER, DEFAULT_AUDIT_FLUSH_MS, MAX_COMMAND_CHARS, commandSummary } from './audit.js';
export type { AuditQuery, AuditRecord, AuditStore } from './audit.js';
export { RuleSet, RULE_APPLIES_TO, MAX_RULES } from './rules.js';
export type { EventSubject, EventVerdict, RuleRecord, Tightening } from './rules.js';
export { sortableId, isSortableId } from './ids.js';
