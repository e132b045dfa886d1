// The operator's configuration of a dsec installation, defined once: the CLI reads it from a JSON
// file, `DSEC_*` variables and flags (packages/cli/src/config.ts) and validates it here before
// anything starts. `node` is the part that belongs to one node (its edge): a node that joins a
// control plane elsewhere is handed exactly that part.
//
// Every key is optional. A key left out takes the default of the component that owns it (the
// constants named in each comment); only `home` and `addr` have their defaults here, because the
// CLI prints and uses them before any component exists.
import { z } from 'zod';
import { EdgeWireModeSchema } from './edge-wire/loopback.js';
import { LimitsConfigSchema } from './limits.js';

/** State directory of a local installation when none is configured. */
export const DEFAULT_DSEC_HOME = '/var/lib/dsec';
/** Address the API listens on when none is configured. */
export const DEFAULT_DSEC_ADDR = '127.0.0.1:7878';

const positiveInt = z.int({ error: 'not a positive integer' }).positive({ error: 'not a positive integer' });
const nonNegativeInt = z.int({ error: 'not a non-negative integer' }).nonnegative({ error: 'not a non-negative integer' });
const durationMs = nonNegativeInt;

/** `host:port` (IPv6 hosts in brackets); port 0 picks a free one. */
export const HostPortSchema = z
  .string()
  .regex(/^(\[[0-9a-fA-F:.]+\]|[^:[\]\s]+):(\d{1,5})$/, { error: 'not host:port' })
  .refine((s) => Number(s.slice(s.lastIndexOf(':') + 1)) <= 65535, { error: 'port above 65535' });

/** Per-sandbox limits of the node's egress proxy (defaults in the edge's net/proxy/). */
export const ProxyLimitsConfigSchema = z.strictObject({
  /** Open connections per sandbox. */
  maxConnections: positiveInt.optional(),
  /** Bytes per second per sandbox, each direction. */
  bytesPerSecond: positiveInt.optional(),
  /** Time to dial an upstream, in ms. */
  connectTimeoutMs: positiveInt.optional(),
  /** A connection idle this long (ms) is closed. */
  idleTimeoutMs: positiveInt.optional(),
});

/** Package mirrors the node's proxy serves (defaults in the edge's net/proxy/mirror/). */
export const MirrorsConfigSchema = z.strictObject({
  /** Origins (`http://mirror.internal:4873`) a policy's mirror may name as its upstream. Default none. */
  origins: z.array(z.url({ error: 'not a URL', protocol: /^https?$/ })).optional(),
  /** Metadata TTL of unfrozen mirrors, in ms. */
  metadataTtlMs: durationMs.optional(),
  /** Size bound of the on-disk cache, in bytes. */
  maxBytes: positiveInt.optional(),
  /** Largest cached object, in bytes. */
  maxObjectBytes: positiveInt.optional(),
  /** Upstream fetch timeout, in ms. */
  fetchTimeoutMs: positiveInt.optional(),
});

/** Sandbox networking of a node (the edge's `NetworkOptions`). */
export const NetworkConfigSchema = z.strictObject({
  /** IPv4 range sandbox addresses come from, machine-wide (edge default `DEFAULT_NETWORK_POOL`). */
  pool: z.cidrv4({ error: 'not a CIDR' }).optional(),
  /** Prefix length of the slice one node home claims from the pool (edge default `DEFAULT_SLICE_PREFIX`). */
  slicePrefix: z.int({ error: 'not an integer' }).min(8, { error: 'below 8' }).max(30, { error: 'above 30' }).optional(),
  /** Static name -> IPv4 map the DNS stub and the proxy consult before any resolver. */
  hosts: z.record(z.string().min(1, { error: 'empty host name' }), z.ipv4({ error: 'not an IPv4 address' })).optional(),
  /** Resolvers for other names (IPv4); default the host's; `[]`: only `hosts` resolve. */
  nameservers: z.array(z.ipv4({ error: 'not an IPv4 address' })).optional(),
  /** Per-sandbox limits of the egress proxy. */
  proxyLimits: ProxyLimitsConfigSchema.optional(),
  /** Package mirrors. */
  mirrors: MirrorsConfigSchema.optional(),
});

/** The settings of one node: what a node joining from elsewhere is handed. */
export const NodeConfigSchema = z.strictObject({
  /** Host path of the static chronus binary. Default: the one built in the checkout. */
  agentBinary: z.string().min(1, { error: 'empty path' }).optional(),
  /** A user namespace per container sandbox. Default true. */
  userNamespaces: z.boolean({ error: 'not true or false' }).optional(),
  /** Size in MiB of a zram swap device for paused sandboxes' memory. Default none (0: none). */
  zramSwapMiB: nonNegativeInt.optional(),
  /** Sandbox networking. */
  network: NetworkConfigSchema.optional(),
});

/** Retention of a table: newest `maxRows` rows, none older than `maxAgeMs`. */
export const RetentionConfigSchema = z.strictObject({
  maxRows: positiveInt,
  maxAgeMs: positiveInt,
});

/** The whole operator configuration of `dsec up`. */
export const DsecConfigSchema = z.strictObject({
  /** State directory. Default {@link DEFAULT_DSEC_HOME}. */
  home: z.string().min(1, { error: 'empty path' }).default(DEFAULT_DSEC_HOME),
  /** `host:port` the API listens on. Default {@link DEFAULT_DSEC_ADDR}. */
  addr: HostPortSchema.default(DEFAULT_DSEC_ADDR),
  /** This machine's node. */
  node: NodeConfigSchema.default({}),
  /** How the control plane reaches this machine's node: directly (`off`) or through the edge wire protocol over a loopback (`loopback`). Default `off`. */
  edgeWire: EdgeWireModeSchema.optional(),
  /** Scheduler over-commit and sampling (apiserver defaults `DEFAULT_CPU_OVERCOMMIT`, ...). */
  placement: z
    .strictObject({
      /** CPUs placed per CPU of a node. */
      cpuOvercommit: z.number({ error: 'not a number' }).min(1, { error: 'below 1' }).optional(),
      /** Memory placed per byte of a node. */
      memoryOvercommit: z.number({ error: 'not a number' }).min(1, { error: 'below 1' }).optional(),
      /** Nodes sampled per placement (power of k choices). */
      sampleK: positiveInt.optional(),
    })
    .default({}),
  /** The watcher's passes (watcher defaults `DEFAULT_WATCH_INTERVAL_MS`, `DEFAULT_GC_INTERVAL_MS`). */
  watcher: z
    .strictObject({
      /** Interval of the reconcile pass, in ms. */
      intervalMs: positiveInt.optional(),
      /** Interval of the node garbage collection, in ms. */
      gcIntervalMs: positiveInt.optional(),
    })
    .default({}),
  /** Limits and retention of trajectories (apiserver defaults `DEFAULT_TRAJECTORY_*`). */
  trajectory: z
    .strictObject({
      /** Steps recorded per trajectory. */
      maxSteps: positiveInt.optional(),
      /** Bytes recorded per trajectory. */
      maxBytes: positiveInt.optional(),
      /** How long a finished trajectory is kept, in ms. */
      retentionMs: positiveInt.optional(),
    })
    .default({}),
  /** Events and audit: heartbeats, queues, retention. */
  events: z
    .strictObject({
      /** Interval of heartbeats on live event streams, in ms. */
      heartbeatMs: positiveInt.optional(),
      /** Events queued per live subscriber before it is dropped. */
      subscriberQueue: positiveInt.optional(),
      /** Retention of the event table. */
      eventRetention: RetentionConfigSchema.optional(),
      /** Retention of the audit table. */
      auditRetention: RetentionConfigSchema.optional(),
    })
    .default({}),
  /** Per-tenant limits (defaults `DEFAULT_TENANT_LIMITS` in protocol's limits.ts; docs/security.md). */
  limits: LimitsConfigSchema.default({}),
});

/** A validated configuration, defaults applied. */
export type DsecConfig = z.output<typeof DsecConfigSchema>;
/** A configuration as written (a file, or one source of it): every key optional. */
export type DsecConfigInput = z.input<typeof DsecConfigSchema>;
/** The settings of one node. */
export type NodeConfig = z.output<typeof NodeConfigSchema>;
/** Sandbox networking of a node. */
export type NetworkConfig = z.output<typeof NetworkConfigSchema>;

/** A configuration that failed validation: `key` is the dotted path (`node.network.pool`). */
export interface ConfigIssue {
  key: string;
  message: string;
}

/** Validates one source of configuration; the first problem, naming its key, or the value. */
export function checkConfig(value: unknown): { ok: true; config: DsecConfig } | { ok: false; issue: ConfigIssue } {
  const res = DsecConfigSchema.safeParse(value);
  if (res.success) return { ok: true, config: res.data };
  const issue = res.error.issues[0];
  const path = (issue?.path ?? []).map(String);
  let message = issue?.message ?? 'invalid';
  if (issue?.code === 'unrecognized_keys') {
    path.push(issue.keys[0] ?? '');
    message = 'unknown key';
  }
  return { ok: false, issue: { key: path.join('.') || '(top level)', message } };
}

/** The JSON Schema of a configuration file (for editors and `dsec config schema`). */
export function configJsonSchema(): Record<string, unknown> {
  return z.toJSONSchema(DsecConfigSchema, { io: 'input' });
}
