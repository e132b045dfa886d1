// The operator's configuration of a dsec installation, defined once: the CLI reads it from a JSON
// file, `DSEC_*` variables and flags (packages/cli/src/config.ts) and validates it here before
// anything starts. `node` is the part that belongs to one node (its edge): a node that joins a
// control plane elsewhere is handed exactly that part.
//
// Every key is optional. A key left out takes the default of the component that owns it (the
// constants named in each comment); only `home` and `addr` have their defaults here, because the
// CLI prints and uses them before any component exists.
import { z } from 'zod';
import { parseIpRange } from './addresses.js';
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
  /** How long (ms) a connection over a connection limit waits for a slot before a refusal; 0: refused at once. */
  queueTimeoutMs: nonNegativeInt.optional(),
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

/** An IPv4 range of `node.network.allowedPrivateRanges`: `a.b.c.d/n` or one address. */
export const PrivateRangeSchema = z.string().superRefine((v, ctx) => {
  const r = parseIpRange(v);
  if (!r || r.family !== 4) ctx.addIssue({ code: 'custom', message: `${JSON.stringify(v)}: not an IPv4 address or a.b.c.d/n range` });
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
  // -- egress under operators' networks (issue 14) --
  /** Open client connections to the egress proxy, node-wide (edge default `DEFAULT_MAX_CONNECTIONS`). */
  maxProxyConnections: positiveInt.optional(),
  /** The operator's HTTP proxy for all egress, `http://[user:pass@]host:port` (a CONNECT tunnel per connection, to the address the node checked). Default: direct. */
  upstreamProxy: z
    .url({ error: 'not a URL', protocol: /^http$/ })
    .refine((u) => !/^http:\/\/[^/]+\/./.test(u), { error: 'a proxy URL has no path' })
    .optional(),
  /** CA certificates added to every networked sandbox's trust and to the mirrors' (each PEM text or the absolute path of a PEM file). Default none. */
  caCertificates: z.array(z.string().min(1, { error: 'empty entry' })).optional(),
  // -- issue 13 §2 (net): the operator's way to special address ranges --
  /**
   * IPv4 ranges (loopback, private, link-local, shared, reserved...) that names a sandbox's
   * policy allows may resolve to, and that the node's own addresses count as reachable in.
   * The only way to them: a tenant's policy may not name special ranges. Default none.
   * The sandbox pool, multicast, broadcast and 0.0.0.0/8 stay unreachable whatever this says.
   */
  allowedPrivateRanges: z.array(PrivateRangeSchema).max(256, { error: 'more than 256 ranges' }).optional(),
  // -- end net --
});

/** An OCI distribution registry and the credentials to use there. */
export const RegistryEndpointConfigSchema = z.strictObject({
  /** `http://host:port` or `https://host`. */
  url: z.url({ error: 'not a URL', protocol: /^https?$/ }),
  username: z.string().min(1, { error: 'empty user name' }).optional(),
  password: z.string().optional(),
});

/** The registry a node keeps its layers in (the edge's `LayerRegistryOptions`). */
export const LayerRegistryConfigSchema = RegistryEndpointConfigSchema.extend({
  /** Repository of the layers (edge default `DEFAULT_LAYER_REPOSITORY`). */
  repository: z
    .string()
    .regex(/^[a-z0-9]+([._-][a-z0-9]+)*(\/[a-z0-9]+([._-][a-z0-9]+)*)*$/, { error: 'not a repository name' })
    .optional(),
  /** Bytes of layers the node keeps; past it, unused layers the registry holds are removed (LRU). Default no bound. */
  cacheMaxBytes: positiveInt.optional(),
  /** Lazy loading: a layer the node lacks is mounted before its data blob arrives, chunks fetched as read. Default false. */
  lazy: z.boolean({ error: 'not true or false' }).optional(),
  /** Bytes of the node's chunk cache (lazy layers); past it, chunks no mounted layer needs go, LRU. Default no bound. */
  chunkCacheMaxBytes: positiveInt.optional(),
  /** A chunk the registry has not given within this many ms fails its read with EIO (`layer.fetch-failed`). Default 10000. */
  fetchDeadlineMs: positiveInt.optional(),
  /** Bytes of the extents after a missed read that are fetched with it in one range request. Default 1048576; 0 for none. */
  readAheadBytes: z.int({ error: 'not a non-negative integer' }).nonnegative({ error: 'not a non-negative integer' }).optional(),
  /** How long a lazy layer's server is kept after the layer's last unmount (its next user mounts at once). Default 300000; 0 stops it at once. */
  lazyServerIdleMs: z.int({ error: 'not a non-negative integer' }).nonnegative({ error: 'not a non-negative integer' }).optional(),
});

/** Default machine-wide cache of the fncall runtimes' Debian layers (`node.calls.runtimeCache`) of `dsec up`. */
export const DEFAULT_RUNTIME_CACHE = '/var/cache/dsec/runtimes';
/** The fncall runtime layers, in the order `dsec up` builds them at start by default. */
export const RUNTIME_LAYER_IDS = ['python', 'node', 'gcc', 'go', 'java'] as const;

/** Function calls of a node: the language runtimes (docs/integrations.md). */
export const CallsConfigSchema = z.strictObject({
  /** Machine-wide directory of built runtime layers, shared by the node homes of the machine. Default {@link DEFAULT_RUNTIME_CACHE}. */
  runtimeCache: z.string().startsWith('/', { error: 'not an absolute path' }).optional(),
  /** Runtime layers built in the background at start, in this order (python: python3, pytest and bash; gcc: c and cpp). Default all of {@link RUNTIME_LAYER_IDS}; `[]`: each when first asked for. */
  prebuild: z.array(z.enum(RUNTIME_LAYER_IDS, { error: `not one of ${RUNTIME_LAYER_IDS.join(', ')}` })).optional(),
});

/** The node's microVM backend (issue 17): off unless this block is present. */
export const MicrovmConfigSchema = z.strictObject({
  /** Cache of guest kernels, initramfs images and probe verdicts. Default `/var/cache/dsec/microvm`. */
  cacheDir: z.string().min(1, { error: 'empty path' }).optional(),
  /** Debian kernel package (fetched with apt-get download). Default `linux-image-cloud-amd64`. */
  kernelPackage: z
    .string()
    .regex(/^[a-z0-9][a-z0-9.+-]+$/, { error: 'not a Debian package name' })
    .optional(),
  /** QEMU binary. Default `qemu-system-x86_64`. */
  qemu: z.string().min(1, { error: 'empty path' }).optional(),
  /** Longest a boot may take, ms. Default 120000. */
  bootTimeoutMs: positiveInt.optional(),
  /** Never use KVM, even when the probe would. */
  noKvm: z.boolean({ error: 'not true or false' }).optional(),
});

/** The node's full-VM backend (issue 22): off unless this block is present. */
export const VmConfigSchema = z.strictObject({
  /** QEMU binary. Default `qemu-system-x86_64`. */
  qemu: z.string().min(1, { error: 'empty path' }).optional(),
  /** Longest a boot may take (QEMU start to the guest's agent answering), ms. Default 300000. */
  bootTimeoutMs: positiveInt.optional(),
  /** Accelerator. Default: the node's accelerator probe (the microVM backend's boot probe, cached: KVM when a boot under it works, else TCG). */
  accel: z.enum(['kvm', 'tcg'], { error: 'not kvm or tcg' }).optional(),
  /** Machine-wide cache of built VM disk images. Default `/var/cache/dsec/vm`. */
  imageCache: z.string().startsWith('/', { error: 'not an absolute path' }).optional(),
});

/** The settings of one node: what a node joining from elsewhere is handed. */
export const NodeConfigSchema = z.strictObject({
  /** Host path of the static chronus binary. Default: the one built in the checkout. */
  agentBinary: z.string().min(1, { error: 'empty path' }).optional(),
  /** A user namespace per container sandbox. Default true. */
  userNamespaces: z.boolean({ error: 'not true or false' }).optional(),
  /** Size in MiB of a zram swap device for paused sandboxes' memory. Default none (0: none). */
  zramSwapMiB: nonNegativeInt.optional(),
  /** Most sandboxes the node admits. Default the edge's `DEFAULT_MAX_SANDBOXES`. */
  maxSandboxes: positiveInt.optional(),
  /** Sandbox networking. */
  network: NetworkConfigSchema.optional(),
  /** Layers pushed to and pulled from an OCI registry. Default none (layers live on the node only). */
  registry: LayerRegistryConfigSchema.optional(),
  /** Registries `dsec image pull` may fetch images from. Default none. */
  pullFrom: z.array(RegistryEndpointConfigSchema).max(64, { error: 'more than 64 registries' }).optional(),
  /** Function calls: where the language runtimes are cached and which are built at start. */
  calls: CallsConfigSchema.optional(),
  /** Runs microVM sandboxes (`backend: "microvm"`) beside containers. Default off. */
  microvm: MicrovmConfigSchema.optional(),
  /** Runs full-VM sandboxes (`backend: "vm"`, q35 + OVMF booting a disk image layer). Default off. */
  vm: VmConfigSchema.optional(),
});

/** Retention of a table: newest `maxRows` rows, none older than `maxAgeMs`. */
export const RetentionConfigSchema = z.strictObject({
  maxRows: positiveInt,
  maxAgeMs: positiveInt,
});

/** A share in (0, 1]. */
const share = z.number({ error: 'not a number' }).gt(0, { error: 'not above 0' }).max(1, { error: 'above 1' });

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
      /** Share of a node's CPUs its measured use may reach before latency-sensitive placement stops (apiserver `DEFAULT_CPU_TARGET`). */
      cpuTarget: share.optional(),
      /** Share of a node's memory its measured use may reach before placement stops (`DEFAULT_MEMORY_TARGET`). */
      memoryTarget: share.optional(),
      /** CPU a sandbox not yet measured is taken to use, as a share of its request (`DEFAULT_IDLE_CPU_SHARE`). */
      idleCpuShare: share.optional(),
      /** Memory a sandbox not yet measured is taken to use, as a share of its limit (`DEFAULT_IDLE_MEMORY_SHARE`). */
      idleMemoryShare: share.optional(),
    })
    .default({}),
  /** The watcher's passes (watcher defaults `DEFAULT_WATCH_INTERVAL_MS`, `DEFAULT_GC_INTERVAL_MS`, `DEFAULT_ORPHAN_GRACE_MS`). */
  watcher: z
    .strictObject({
      /** Interval of the reconcile pass, in ms. */
      intervalMs: positiveInt.optional(),
      /** Interval of the node garbage collection, in ms. */
      gcIntervalMs: positiveInt.optional(),
      /**
       * How long a sandbox a node runs without a record may stay so before it is destroyed, in ms
       * (watcher `DEFAULT_ORPHAN_GRACE_MS`, 5 s); 0 destroys it at first sight.
       */
      orphanGraceMs: durationMs.optional(),
      /** How long a `stopping` row no process here tears down waits before the lease pass finishes it, in ms (apiserver `ABANDONED_STOPPING_MS`). */
      abandonedStoppingMs: positiveInt.optional(),
      /** How long a replica with work on the store shows no database session before a live replica settles its work, in ms (apiserver `GONE_REPLICA_MS`). */
      goneReplicaMs: positiveInt.optional(),
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
  /**
   * PostgreSQL URL (`postgres://user:pass@host:5432/dsec`) of a state store shared by API
   * replicas (`dsec apiserver`, or `dsec up` beside them). Default none: SQLite in `home`.
   */
  db: z
    .string()
    .regex(/^postgres(ql)?:\/\/\S+$/i, { error: 'not a postgres:// URL' })
    .optional(),
  /**
   * Reverse proxies (addresses or CIDR ranges) in front of the API whose `X-Forwarded-For` is
   * believed. Default none: the client is the connection's peer.
   */
  trustedProxies: z.array(z.union([z.ipv4(), z.ipv6(), z.cidrv4(), z.cidrv6()], { error: 'not an address or CIDR range' })).optional(),
  /**
   * Nodes on other machines (docs/deploy.md): the node port they join and hold their sessions on
   * (mutual TLS with the cluster CA under `<home>/cluster/`), and how long a node may be silent.
   */
  cluster: z
    .strictObject({
      /** `host:port` of the node port; none (the default) takes no remote nodes. */
      nodeAddr: HostPortSchema.optional(),
      /** Silence after which a node is `unreachable`, in ms (default `DEFAULT_NODE_UNREACHABLE_AFTER_MS`, 15 s). */
      unreachableAfterMs: positiveInt.optional(),
      /** Time `unreachable` before a node and its sandboxes are `lost`, in ms (default `DEFAULT_NODE_LOST_AFTER_MS`, 60 s). */
      lostAfterMs: positiveInt.optional(),
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
  /** The E2B-compatible API (docs/e2b.md). */
  e2b: z
    .strictObject({
      /**
       * Base domain of per-sandbox host names `<port>-<sandboxID>.<domain>` (a wildcard DNS name
       * pointing at the API; `:port` allowed), returned to clients as `domain`. Default none: no
       * host-name routing, `domain: null`.
       */
      domain: z
        .string()
        .regex(/^[a-z0-9]([a-z0-9-]{0,62}\.)*[a-z0-9-]{1,63}(:[0-9]{1,5})?$/i, { error: 'not a domain name (with an optional :port)' })
        .optional(),
      /**
       * An HTTPS listener for E2B clients with the operator's certificate (PEM files: a wildcard
       * `*.<domain>` and the API's name), on an address of its own (`host:port`, usually `:443`
       * with `domain` without a port). Default none (plain HTTP only; or TLS in front).
       */
      tls: z
        .strictObject({
          certFile: z.string().min(1),
          keyFile: z.string().min(1),
          addr: z.string().regex(/^(\[[0-9a-f:.]+\]|[A-Za-z0-9.-]+):[0-9]{1,5}$/i, { error: 'not host:port' }),
        })
        .optional(),
    })
    .default({}),
});

/** A validated configuration, defaults applied. */
export type DsecConfig = z.output<typeof DsecConfigSchema>;
/** A configuration as written (a file, or one source of it): every key optional. */
export type DsecConfigInput = z.input<typeof DsecConfigSchema>;
/** The settings of one node. */
export type NodeConfig = z.output<typeof NodeConfigSchema>;
/** Sandbox networking of a node. */
export type NetworkConfig = z.output<typeof NetworkConfigSchema>;
/** A registry and its credentials. */
export type RegistryEndpointConfig = z.output<typeof RegistryEndpointConfigSchema>;
/** The registry a node keeps its layers in. */
export type LayerRegistryConfig = z.output<typeof LayerRegistryConfigSchema>;

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
