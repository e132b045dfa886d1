// The contract between edge's per-sandbox networking (namespaces, nftables, DNS stub, policy
// store) and the egress proxy (net/proxy/). The kernel lets a sandbox reach only the node's
// gateway address: the DNS stub on port 53 and the proxy's ports (80 and 443 to anywhere are
// redirected to the transparent ports). Everything the proxy decides comes from these shapes.
import type { EventSink, Mirror, NetworkMode, NetworkPolicy, NetworkPreset } from '@dsec/protocol';

/** The verdict on one destination. */
export interface EgressVerdict {
  allowed: boolean;
  /** The rule that matched, e.g. `allow:*.example.com`, `preset:npm:registry.npmjs.org`. */
  rule?: string;
  /** Why it was denied, when it was (`no rule matches`, `port 22 not allowed by ...`). */
  reason?: string;
}

/** A sandbox's compiled policy, as the egress proxy and the DNS stub consult it. */
export interface EgressPolicyView {
  readonly sandboxId: string;
  readonly mode: NetworkMode;
  /** The sandbox's IPv4 address: the source address of every connection it makes. */
  readonly address: string;
  /** The policy as stored (normalised: lower-case hosts, sorted ports). */
  readonly policy: NetworkPolicy;
  /** Grows by one with every change of this sandbox's policy. */
  readonly version: number;
  /**
   * May the sandbox connect to `host` on `port`? `host` is a name (any case, trailing dot
   * allowed) or an IPv4 literal; an IP literal is allowed only when a rule names it.
   */
  allows(host: string, port: number): EgressVerdict;
  /** May the sandbox resolve `name` at all (some rule matches it on some port)? */
  allowsName(name: string): EgressVerdict;
  /**
   * May the proxy dial `ip` for this sandbox (any spelling; IPv6 forms carrying IPv4 judged as
   * that address)? Public unicast addresses: yes. Loopback, private, link-local, CGNAT and other
   * special ranges: only inside the node's `allowedPrivateRanges`, or when `allowAddresses`
   * covers the address or a rule names it (root-project policies; the apiserver refuses them
   * from tenants). The node's own addresses: only inside `allowedPrivateRanges`. The sandbox
   * pool, 0/8, multicast and broadcast: never.
   */
  addressAllowed(ip: string): boolean;
  /** Package mirrors by preset. */
  readonly mirrors: Readonly<Partial<Record<NetworkPreset, Mirror>>>;
}

/** Finds the sandbox behind a connection. */
export interface SandboxResolver {
  /** The policy of the sandbox with source address `ip`, or undefined (refuse the connection). */
  bySourceAddress(ip: string): EgressPolicyView | undefined;
}

/**
 * Resolves names for the DNS stub and the proxy alike: the node's static `hosts` map first,
 * then the host's resolver. IPv4 only.
 */
export interface NameResolver {
  /** The IPv4 addresses of `name`; [] when it has none. Throws a DsecError TIMEOUT/UNAVAILABLE when the resolver fails. */
  resolve4(name: string, signal?: AbortSignal): Promise<string[]>;
}

/** How an attempt reached the decision point. */
export type EgressVia = 'http' | 'connect' | 'transparent-http' | 'transparent-tls' | 'mirror' | 'dns' | 'kernel';

/** One connection attempt (or DNS question, or packet the kernel dropped), with its verdict. */
export interface EgressLogEntry {
  /** ISO time; the sink fills it in when absent. */
  at?: string;
  sandboxId: string;
  via: EgressVia;
  /** The name or IP literal asked for (for `kernel`: the destination address). */
  host: string;
  port: number;
  /** `tcp` unless said otherwise (`udp`, `icmp`, `ipv6`, ...: kernel drops). */
  protocol?: string;
  /** The address dialled, when one was. */
  address?: string;
  verdict: 'allowed' | 'denied';
  rule?: string;
  reason?: string;
}

/** Where attempts are reported. Edge stores them per sandbox, turns denials into events and watches for scans. */
export type EgressLogSink = (entry: EgressLogEntry) => void;

/** Per-sandbox limits the proxy enforces. */
export interface EgressProxyLimits {
  /** Open connections per sandbox. */
  maxConnections: number;
  /** Bytes per second per sandbox, each direction. */
  bytesPerSecond: number;
  /** Time to dial an upstream. */
  connectTimeoutMs: number;
  /** A connection with no traffic either way for this long is closed. */
  idleTimeoutMs: number;
  /** How long a connection over a connection limit waits for a slot before it is refused. */
  queueTimeoutMs: number;
}

/** The ports the proxy listens on (all on {@link EgressProxyOptions.address}). */
export interface EgressProxyPorts {
  /** Explicit proxying: HTTP forward and CONNECT (`HTTP_PROXY`, `HTTPS_PROXY`). */
  http: number;
  /** Where the kernel redirects TCP 80: destination from the Host header. */
  transparentHttp: number;
  /** Where the kernel redirects TCP 443: destination from the TLS SNI (TLS is not terminated). */
  transparentTls: number;
  /** Package mirrors, when the proxy serves them on a port of their own. */
  mirror?: number;
}

/** What edge passes to {@link StartEgressProxy}. */
export interface EgressProxyOptions {
  /** The node's gateway address: listen here only (never 0.0.0.0). */
  address: string;
  /** Ports to listen on; 0 or absent picks a free one (http defaults to 3128). */
  ports?: Partial<EgressProxyPorts>;
  sandboxes: SandboxResolver;
  resolver: NameResolver;
  /** Every attempt, allowed or denied. */
  log: EgressLogSink;
  /** For events that are not attempts (a limit hit). */
  raise: EventSink;
  limits?: Partial<EgressProxyLimits>;
}

/** Traffic counters of one sandbox. */
export interface EgressStats {
  /** Bytes from upstreams to the sandbox. */
  bytesIn: number;
  /** Bytes from the sandbox to upstreams. */
  bytesOut: number;
  /** Connections open now. */
  connections: number;
  /** Connections accepted since the sandbox got its policy. */
  totalConnections: number;
  /** Attempts denied. */
  denied: number;
}

/** A running egress proxy. */
export interface EgressProxyHandle {
  readonly address: string;
  readonly ports: EgressProxyPorts;
  /** The sandbox's policy changed: close its open connections that it no longer allows. */
  policyChanged(sandboxId: string): void;
  /** The sandbox left the network (destroyed, or now `none`): close all it has, drop its counters. */
  forget(sandboxId: string): void;
  stats(sandboxId: string): EgressStats;
  close(): Promise<void>;
}

/** Starts the egress proxy (implemented in net/proxy/). */
export type StartEgressProxy = (opts: EgressProxyOptions) => Promise<EgressProxyHandle>;
