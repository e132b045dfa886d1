// Events (raised by edge, the egress proxy, the control plane) and the watcher's routes: events
// (GET /v1/events, also as a live text/event-stream), the audit trail (GET /v1/audit) and run-time
// rules (POST/GET/DELETE /v1/rules).
import { z } from 'zod';
import { LabelsSchema } from './common.js';
import { ESSENTIAL_SYSCALLS, SYSCALL_NAMES } from './syscalls.js';

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
  // the server of a sandbox's read-only protected paths is gone: they answer ENOTCONN (container)
  'protected-path.server-gone',
  // ... and a new one serves them (the edge restarted it, a bounded number of times)
  'protected-path.server-restarted',
  'seccomp.denied',
  'pids.limit-hit',
  'oom.kill',
  'process.survived-command',
  'control.forged-message',
  // network
  'egress.denied',
  'egress.port-scan',
  'egress.throttled',
  // lifecycle
  'lease.exceeded',
  'sandbox.paused',
  'sandbox.resumed',
  'sandbox.lost',
  'owner.lost',
  // a sandbox's agent did not answer a ping while a command waited past its timeoutMs
  'sandbox.agent-unresponsive',
  // a sandbox's row, as lists show it (the control plane alone raises these; see SANDBOX_ROW_EVENT_KINDS)
  'sandbox.created',
  'sandbox.state-changed',
  'sandbox.deleted',
  // nodes of a cluster (node.* events carry the node; sandbox.replayed names the new sandbox)
  'node.unreachable',
  'node.lost',
  'node.ready',
  'sandbox.replayed',
  'sandbox.replay-failed',
  // lazily loaded layers (a chunk the registry did not give in time; one that failed its digest)
  'layer.fetch-failed',
  'layer.corrupt',
  // a lazy layer's server died while mounted (its sandboxes are lost)
  'layer.server-lost',
  // anything a rule added at run time matched
  'rule.matched',
] as const;

/** One of {@link EVENT_KINDS}. */
export type EventKind = (typeof EVENT_KINDS)[number];

/**
 * Kinds that follow a sandbox's row (created, each settled state, deleted), raised by the control
 * plane only: an edge's events of these kinds are dropped. Their `data.sandbox` is the row as
 * `GET /v1/sandboxes` lists it (fields a list shows), so a live list needs no read of its own.
 */
export const SANDBOX_ROW_EVENT_KINDS: readonly EventKind[] = ['sandbox.created', 'sandbox.state-changed', 'sandbox.deleted'];

/** Default and largest page of events and audit entries. */
export const DEFAULT_WATCH_PAGE_SIZE = 100;

export const MAX_WATCH_PAGE_SIZE = 1000;

/** One of {@link EVENT_KINDS}. */
export const EventKindSchema = z.enum(EVENT_KINDS);

/** An event as it is raised (before the watcher stores it and gives it an id). */
export const RaisedEventSchema = z.object({
  kind: EventKindSchema,
  /** Default severity; a watcher rule may raise or lower it. */
  severity: EventSeveritySchema,
  /** The sandbox concerned, when there is one. */
  sandboxId: z.string().exactOptional(),
  /** The node that saw it. */
  node: z.string().exactOptional(),
  /** One line for humans. */
  message: z.string(),
  /** Kind-specific fields (destination, path, syscall, count). Small and JSON-serialisable. */
  data: z.record(z.string(), z.unknown()).exactOptional(),
  /** ISO time it happened; the sink fills it in when absent. */
  at: z.string().exactOptional(),
});
/** An event as it is raised (before the watcher stores it and gives it an id). */
export type RaisedEvent = z.infer<typeof RaisedEventSchema>;

/** Where raised events go. Implementations must not throw or block the caller. */
export type EventSink = (ev: RaisedEvent) => void;

/** An event as the API returns it. */
export const EventSchema = z.object({
  /** Sortable id (time order); also the SSE `id:` used by `Last-Event-ID`. */
  id: z.string(),
  at: z.string(),
  kind: EventKindSchema,
  severity: EventSeveritySchema,
  /** Project of the sandbox concerned; null for node-level events. */
  project: z.string().nullable(),
  sandbox: z.string().nullable(),
  node: z.string().nullable(),
  message: z.string(),
  data: z.record(z.string(), z.unknown()),
});

/** An event as the API returns it (stored, with its id). */
export type RecordedEvent = z.infer<typeof EventSchema>;

const isoTime = z
  .string()
  .max(40)
  .refine((s) => !Number.isNaN(Date.parse(s)), 'not an ISO-8601 time');

const cursor = z.string().max(256);

const sandboxId = z.string().regex(/^[a-z0-9][a-z0-9-]{0,127}$/, 'not a sandbox id');

/** GET /v1/events query. `kind` is a comma-separated list; `severity` is a minimum. */
export const ListEventsQuerySchema = z.strictObject({
  kind: z
    .string()
    .max(1024)
    .refine((s) => s.split(',').every((k) => (EVENT_KINDS as readonly string[]).includes(k)), `each kind must be one of ${EVENT_KINDS.join(', ')}`)
    .optional(),
  severity: EventSeveritySchema.optional(),
  sandbox: sandboxId.optional(),
  since: isoTime.optional(),
  limit: z.coerce.number().int().min(1).max(MAX_WATCH_PAGE_SIZE).optional(),
  cursor: cursor.optional(),
  /** `desc` (default): newest first; `asc`: oldest first. */
  order: z.enum(['asc', 'desc']).optional(),
});

export type ListEventsQuery = z.infer<typeof ListEventsQuerySchema>;

/** One audit entry: an API call (and, for exec, the command and its exit). */
export const AuditEntrySchema = z.object({
  id: z.string(),
  at: z.string(),
  /** Id of the API key that made the call; null when no valid key was sent. */
  key: z.string().nullable(),
  /** Project of that key. */
  project: z.string().nullable(),
  method: z.string(),
  /** The route pattern (`/v1/sandboxes/:id/exec`), never the raw URL. */
  route: z.string(),
  sandbox: z.string().nullable(),
  status: z.number(),
  durationMs: z.number(),
  /** exec: argv joined by spaces, or the shell string, cut at 256 characters. */
  command: z.string().nullable(),
  /** exec: the command's exit status (null while unknown or when killed by a signal). */
  exitCode: z.number().nullable(),
  /** Calls the entry stands for, when more than one: repeated failed authentications from one source are collapsed. */
  count: z.number().optional(),
});

/** One audit entry. */
export type AuditEntry = z.infer<typeof AuditEntrySchema>;

/** GET /v1/audit query. */
export const ListAuditQuerySchema = z.strictObject({
  since: isoTime.optional(),
  sandbox: sandboxId.optional(),
  /** An API key id (`key_...`). */
  key: z
    .string()
    .regex(/^key_[0-9a-f]{1,64}$/, 'not a key id')
    .optional(),
  limit: z.coerce.number().int().min(1).max(MAX_WATCH_PAGE_SIZE).optional(),
  cursor: cursor.optional(),
  order: z.enum(['asc', 'desc']).optional(),
});

export type ListAuditQuery = z.infer<typeof ListAuditQuerySchema>;

/** An absolute path without `.`/`..` segments or NUL. */
const absolutePath = z
  .string()
  .max(4096)
  .regex(/^\/(?!.*(^|\/)\.\.?(\/|$))[^\0]*$/, 'must be an absolute path without . or .. segments')
  .refine((p) => p !== '/', 'the root itself cannot be made read-only by a rule');

/** A domain (`example.com`) or every subdomain of one (`*.example.com`). */
export const DomainPatternSchema = z
  .string()
  .max(253)
  .regex(/^(\*\.)?([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\.)+[a-z]([a-z0-9-]{0,61}[a-z0-9])?$/, 'not a domain or *.domain pattern (lowercase)');

/** A system call a rule may deny: a known name that the agent does not need. */
export const DeniableSyscallSchema = z
  .string()
  .max(64)
  .refine((s) => SYSCALL_NAMES.has(s), 'not a known system call name')
  .refine((s) => !ESSENTIAL_SYSCALLS.has(s), 'every sandbox needs this system call; denying it would make every create fail');

/** What an event rule matches: all given conditions must hold. */
export const EventMatchSchema = z.strictObject({
  /** Event kinds (any of). Default: every kind. */
  events: z.array(EventKindSchema).min(1).max(EVENT_KINDS.length).optional(),
  /** Labels the sandbox must carry. */
  labels: LabelsSchema.optional(),
  sandbox: sandboxId.optional(),
});
/** What an event rule matches. */
export type EventMatch = z.infer<typeof EventMatchSchema>;

/** POST /v1/rules: one rule. */
export const CreateRuleRequestSchema = z.discriminatedUnion('kind', [
  z
    .strictObject({
      kind: z.literal('event'),
      match: EventMatchSchema,
      /** Severity the matched events get. */
      severity: EventSeveritySchema.optional(),
      /** Drop matched events (they are counted, not stored). */
      suppress: z.literal(true).optional(),
      note: z.string().max(512).optional(),
    })
    .refine((r) => (r.severity === undefined) !== (r.suppress === undefined), { error: 'give exactly one of severity or suppress', path: ['severity'] }),
  z.strictObject({ kind: z.literal('deny-path'), path: absolutePath, note: z.string().max(512).optional() }),
  z.strictObject({ kind: z.literal('deny-domain'), domain: DomainPatternSchema, note: z.string().max(512).optional() }),
  z.strictObject({ kind: z.literal('deny-syscall'), syscall: DeniableSyscallSchema, note: z.string().max(512).optional() }),
]);

export type CreateRuleRequest = z.infer<typeof CreateRuleRequestSchema>;

/** Kinds of rules. */
export const RuleKindSchema = z.enum(['event', 'deny-path', 'deny-domain', 'deny-syscall']);

export type RuleKind = z.infer<typeof RuleKindSchema>;

/** A rule as the API returns it. */
export const RuleSchema = z.object({
  id: z.string(),
  kind: RuleKindSchema,
  /** Project whose sandboxes (and sub-projects' sandboxes) the rule applies to. */
  project: z.string(),
  /** The key that created it. */
  createdBy: z.string(),
  createdAt: z.string(),
  /** The rule's own fields, as created (`match`, `severity`, `path`, `domain`, `syscall`, `note`). */
  spec: z.record(z.string(), z.unknown()),
  /** Where it takes effect: `new sandboxes`, or `new and running sandboxes`. */
  appliesTo: z.string(),
});

/** A rule as the API returns it. */
export type Rule = z.infer<typeof RuleSchema>;
