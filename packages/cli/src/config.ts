// The operator configuration of `dsec up`: a JSON file (`--config` or `$DSEC_CONFIG`), `DSEC_*`
// variables and flags, merged with precedence flags > environment > file > defaults and
// validated before anything starts (the schema is DsecConfigSchema in @dsec/protocol). A bad
// value is refused naming its key and where it came from, with exit status 2.
import { readFile } from 'node:fs/promises';
import type { PlatformOptions, ReplicaOptions } from '@dsec/apiserver';
import { LIMIT_NAMES, checkConfig } from '@dsec/protocol';
import type { DsecConfig } from '@dsec/protocol';

/** A configuration that cannot be used: the CLI prints the message and exits with status 2. */
export class ConfigError extends Error {
  override readonly name = 'ConfigError';
}

/** How a variable's text becomes a value. */
type EnvKind = 'string' | 'integer' | 'boolean' | 'list';

/** The `DSEC_*` variables `dsec up` reads, and the key each one sets. */
export const CONFIG_ENV: ReadonlyArray<{ name: string; key: string; kind: EnvKind }> = [
  { name: 'DSEC_HOME', key: 'home', kind: 'string' },
  { name: 'DSEC_ADDR', key: 'addr', kind: 'string' },
  { name: 'DSEC_AGENT', key: 'node.agentBinary', kind: 'string' },
  { name: 'DSEC_USERNS', key: 'node.userNamespaces', kind: 'boolean' },
  { name: 'DSEC_ZRAM_SWAP_MIB', key: 'node.zramSwapMiB', kind: 'integer' },
  { name: 'DSEC_NETWORK_POOL', key: 'node.network.pool', kind: 'string' },
  { name: 'DSEC_NAMESERVERS', key: 'node.network.nameservers', kind: 'list' },
  { name: 'DSEC_UPSTREAM_PROXY', key: 'node.network.upstreamProxy', kind: 'string' },
  { name: 'DSEC_CA_CERTIFICATES', key: 'node.network.caCertificates', kind: 'list' },
  { name: 'DSEC_ALLOWED_PRIVATE_RANGES', key: 'node.network.allowedPrivateRanges', kind: 'list' },
  { name: 'DSEC_EDGE_WIRE', key: 'edgeWire', kind: 'string' },
  { name: 'DSEC_DB', key: 'db', kind: 'string' },
  { name: 'DSEC_TRUSTED_PROXIES', key: 'trustedProxies', kind: 'list' },
  { name: 'DSEC_NODE_ADDR', key: 'cluster.nodeAddr', kind: 'string' },
  // One variable per tenant limit: DSEC_LIMIT_EXECS_PER_TENANT sets limits.execsPerTenant.
  ...LIMIT_NAMES.map((n) => ({ name: limitEnvName(n), key: `limits.${n}`, kind: 'integer' as const })),
];

/** The variable of a tenant limit: `execsPerTenant` -> `DSEC_LIMIT_EXECS_PER_TENANT`. */
export function limitEnvName(limit: string): string {
  return `DSEC_LIMIT_${limit.replace(/[A-Z]/g, (c) => `_${c}`).toUpperCase()}`;
}

/** The variable naming the configuration file when `--config` is not given. */
export const CONFIG_FILE_ENV = 'DSEC_CONFIG';

/** The flags of `dsec up` that are configuration (others, such as `--quiet`, are not). */
export interface ConfigFlags {
  config?: string;
  home?: string;
  addr?: string;
  agent?: string;
  userns?: boolean;
  zramSwap?: number;
  networkPool?: string;
  nameserver?: string[];
  db?: string;
  trustedProxy?: string[];
  nodeAddr?: string;
  allowPrivateRange?: string[];
  /** Tenant limits as `name=value` (repeatable): `--limit execsPerTenant=32`. */
  limit?: string[];
}

/** Which flag sets which key (for the flag's name in an error). */
const FLAG_KEYS: ReadonlyArray<{ flag: keyof ConfigFlags; option: string; key: string }> = [
  { flag: 'home', option: '--home', key: 'home' },
  { flag: 'addr', option: '--addr', key: 'addr' },
  { flag: 'agent', option: '--agent', key: 'node.agentBinary' },
  { flag: 'userns', option: '--userns/--no-userns', key: 'node.userNamespaces' },
  { flag: 'zramSwap', option: '--zram-swap', key: 'node.zramSwapMiB' },
  { flag: 'networkPool', option: '--network-pool', key: 'node.network.pool' },
  { flag: 'nameserver', option: '--nameserver', key: 'node.network.nameservers' },
  { flag: 'db', option: '--db', key: 'db' },
  { flag: 'trustedProxy', option: '--trusted-proxy', key: 'trustedProxies' },
  { flag: 'nodeAddr', option: '--node-addr', key: 'cluster.nodeAddr' },
  { flag: 'allowPrivateRange', option: '--allow-private-range', key: 'node.network.allowedPrivateRanges' },
];

/** Where the configuration comes from. */
export interface ConfigSources {
  flags?: ConfigFlags;
  /** Default `process.env`. */
  env?: NodeJS.ProcessEnv;
}

/** The effective configuration and the sources it was read from (file, variables, flags). */
export interface LoadedConfig {
  config: DsecConfig;
  sources: string[];
}

type Json = Record<string, unknown>;

function isObject(v: unknown): v is Json {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

/** Sets `key` (dotted) in `target`, creating the objects on the way. */
function setKey(target: Json, key: string, value: unknown): void {
  const parts = key.split('.');
  let at = target;
  for (const p of parts.slice(0, -1)) {
    const next = at[p];
    if (isObject(next)) at = next;
    else at = at[p] = {};
  }
  at[parts[parts.length - 1]!] = value;
}

/** `b` over `a`: objects merge key by key, anything else (arrays included) replaces. */
function merge(a: Json, b: Json): Json {
  const out: Json = { ...a };
  for (const [k, v] of Object.entries(b)) {
    const prev = out[k];
    out[k] = isObject(prev) && isObject(v) ? merge(prev, v) : v;
  }
  return out;
}

/** A variable's text as a value; text that does not convert is kept, so validation names it. */
function envValue(text: string, kind: EnvKind): unknown {
  switch (kind) {
    case 'string':
      return text;
    case 'integer':
      return /^-?\d+$/.test(text.trim()) ? Number(text) : text;
    case 'boolean':
      if (/^(1|true|yes|on)$/i.test(text)) return true;
      if (/^(0|false|no|off)$/i.test(text)) return false;
      return text;
    case 'list':
      return text
        .split(',')
        .map((s) => s.trim())
        .filter(Boolean);
  }
}

/** Validates one source alone, so that an error names where the bad value came from. */
function check(layer: Json, source: (key: string) => string): void {
  const res = checkConfig(layer);
  if (!res.ok) throw new ConfigError(`config: ${res.issue.key}: ${res.issue.message} (${source(res.issue.key)})`);
}

/** Reads and parses the configuration file. */
async function readConfigFile(file: string): Promise<Json> {
  let text: string;
  try {
    text = await readFile(file, 'utf8');
  } catch (err) {
    throw new ConfigError(`config: cannot read ${file}: ${(err as NodeJS.ErrnoException).code ?? (err as Error).message}`);
  }
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch (err) {
    throw new ConfigError(`config: ${file} is not JSON: ${(err as Error).message}`);
  }
  if (!isObject(value)) throw new ConfigError(`config: ${file} must hold a JSON object`);
  return value;
}

/**
 * The effective configuration: defaults, then the file, then `DSEC_*` variables, then flags,
 * each validated. Throws {@link ConfigError} naming the key and its source.
 */
export async function loadConfig(sources: ConfigSources = {}): Promise<LoadedConfig> {
  const env = sources.env ?? process.env;
  const flags = sources.flags ?? {};
  const used: string[] = [];

  let merged: Json = {};
  const file = flags.config ?? (env[CONFIG_FILE_ENV] || undefined);
  if (file !== undefined) {
    const fromFile = await readConfigFile(file);
    check(fromFile, () => `in ${file}`);
    merged = merge(merged, fromFile);
    used.push(file);
  }

  const fromEnv: Json = {};
  const envOf = new Map<string, string>();
  for (const v of CONFIG_ENV) {
    const text = env[v.name];
    if (text === undefined || text === '') continue;
    setKey(fromEnv, v.key, envValue(text, v.kind));
    envOf.set(v.key, v.name);
    used.push(`$${v.name}`);
  }
  check(fromEnv, (key) => `from $${envOf.get(key) ?? [...envOf.entries()].find(([k]) => key.startsWith(`${k}.`))?.[1] ?? 'the environment'}`);
  merged = merge(merged, fromEnv);

  const fromFlags: Json = {};
  const flagOf = new Map<string, string>();
  for (const f of FLAG_KEYS) {
    const value = flags[f.flag];
    if (value === undefined) continue;
    setKey(fromFlags, f.key, value);
    flagOf.set(f.key, f.option);
    used.push(f.option);
  }
  for (const text of flags.limit ?? []) {
    const m = /^([A-Za-z]+)=(.*)$/.exec(text);
    if (!m) throw new ConfigError(`config: --limit ${text}: not name=value`);
    const key = `limits.${m[1]!}`;
    setKey(fromFlags, key, envValue(m[2]!, 'integer'));
    flagOf.set(key, '--limit');
    used.push(`--limit ${m[1]!}`);
  }
  check(fromFlags, (key) => `from ${flagOf.get(key) ?? [...flagOf.entries()].find(([k]) => key.startsWith(`${k}.`))?.[1] ?? 'the flags'}`);
  merged = merge(merged, fromFlags);

  const res = checkConfig(merged);
  if (!res.ok) throw new ConfigError(`config: ${res.issue.key}: ${res.issue.message}`);
  return { config: res.config, sources: used };
}

/** `T` with no key holding `undefined` (optional keys stay optional). */
type Defined<T> = T extends readonly (infer U)[] ? Defined<U>[] : T extends object ? { [K in keyof T]: Defined<Exclude<T[K], undefined>> } : T;

/** A copy of `value` without the keys that hold `undefined`, at every depth. */
function defined<T>(value: T): Defined<T> {
  if (Array.isArray(value)) return value.map(defined) as Defined<T>;
  if (!isObject(value)) return value as Defined<T>;
  return Object.fromEntries(
    Object.entries(value)
      .filter(([, v]) => v !== undefined)
      .map(([k, v]) => [k, defined(v)]),
  ) as Defined<T>;
}

/** What `startPlatform` is given for a configuration (everything but the log). */
export function platformOptions(config: DsecConfig): PlatformOptions {
  const { node, placement, watcher, trajectory, events, cluster, limits } = defined(config);
  const opts: PlatformOptions = {
    home: config.home,
    addr: config.addr,
    ...(node.agentBinary !== undefined ? { agentBinary: node.agentBinary } : {}),
    ...(node.userNamespaces !== undefined ? { userNamespaces: node.userNamespaces } : {}),
    ...(node.zramSwapMiB ? { zramSwapMiB: node.zramSwapMiB } : {}),
    ...(node.maxSandboxes !== undefined ? { maxSandboxes: node.maxSandboxes } : {}),
    ...(node.network !== undefined ? { network: node.network } : {}),
    ...(node.registry !== undefined ? { registry: node.registry } : {}),
    ...(node.pullFrom !== undefined ? { pullFrom: node.pullFrom } : {}),
    ...(node.calls !== undefined ? { calls: node.calls } : {}),
    ...(node.microvm !== undefined ? { microvm: node.microvm } : {}),
    ...(node.vm !== undefined ? { vm: node.vm } : {}),
    ...(config.edgeWire !== undefined ? { edgeWire: config.edgeWire } : {}),
    ...(Object.keys(placement).length > 0 ? { placement } : {}),
    ...(watcher.intervalMs !== undefined ? { watchIntervalMs: watcher.intervalMs } : {}),
    ...(watcher.gcIntervalMs !== undefined ? { gcIntervalMs: watcher.gcIntervalMs } : {}),
    ...(watcher.orphanGraceMs !== undefined ? { orphanGraceMs: watcher.orphanGraceMs } : {}),
    ...(watcher.abandonedStoppingMs !== undefined ? { abandonedStoppingMs: watcher.abandonedStoppingMs } : {}),
    ...(watcher.goneReplicaMs !== undefined ? { goneReplicaMs: watcher.goneReplicaMs } : {}),
    ...(Object.keys(trajectory).length > 0 ? { trajectory } : {}),
    ...(Object.keys(events).length > 0 ? { watch: events } : {}),
    ...(config.db !== undefined ? { db: config.db } : {}),
    ...(config.trustedProxies !== undefined ? { trustedProxies: config.trustedProxies } : {}),
    ...(cluster.nodeAddr !== undefined ? { cluster } : {}),
    ...(Object.keys(limits).length > 0 ? { limits } : {}),
    ...(config.e2b.domain !== undefined || config.e2b.tls !== undefined
      ? { e2b: { ...(config.e2b.domain !== undefined ? { domain: config.e2b.domain } : {}), ...(config.e2b.tls ? { tls: config.e2b.tls } : {}) } }
      : {}),
  };
  return opts;
}

/** What `startApiserver` is given for a configuration: the control plane's part, no node. */
export function replicaOptions(config: DsecConfig): ReplicaOptions {
  if (config.db === undefined) throw new ConfigError('config: db: dsec apiserver needs the PostgreSQL URL of the shared store (--db or $DSEC_DB)');
  const {
    edgeWire: _edgeWire,
    agentBinary: _agent,
    userNamespaces: _userns,
    zramSwapMiB: _zram,
    maxSandboxes: _max,
    network: _network,
    ...rest
  } = platformOptions(config);
  return { ...rest, db: config.db };
}
