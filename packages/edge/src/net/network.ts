// A node's sandbox networking. A sandbox in mode `none` keeps the empty network namespace its
// runtime gave it (loopback only): nothing here touches it. A sandbox in mode `allowlist` gets
// a veth link to the node's gateway address, where the DNS stub and the egress proxy listen; the
// node's nftables table lets it reach those and nothing else. Its policy lives here, in user
// space, compiled per sandbox: a change is one swap of the compiled view (after it is saved),
// and open proxy connections it no longer allows are closed.
//
// The node-wide parts (address slice, gateway, table, DNS stub, proxy, kernel log reader) are
// set up when the first sandbox needs them, so nodes without networked sandboxes pay nothing.
import { readFile, readdir, mkdir, rm, rename, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { DEFAULT_NETWORK_POLICY, DsecError, KeyedSerialQueue, NETWORK_PRESETS, crashPoint, parseCidr, parseIpRange } from '@dsec/protocol';
import type { EventSink, IpRange, NetworkPolicy } from '@dsec/protocol';
import { runDirFor } from '../host/runtime-ns.js';
import { DnsStub } from './dns.js';
import { EXPLICIT_PROXY_PORT, LinkMaker, applyTable, deleteLinks, deleteTable, ensureGateway, linksWithPrefix } from './kernel.js';
import { EgressMonitor } from './monitor.js';
import type { EgressCounts } from './monitor.js';
import { KernelLog, protocolName } from './nflog.js';
import type { LoggedPacket } from './nflog.js';
import { compilePolicy } from './policy.js';
import type { NodeAddressing, Range } from './policy.js';
import { DEFAULT_NETWORK_POOL, DEFAULT_SLICE_PREFIX, SlotAllocator, claimSlice, releaseSlice } from './pool.js';
import type { NetworkSlice } from './pool.js';
import { HostsResolver } from './resolver.js';
import { DEFAULT_MAX_CONNECTIONS, startEgressProxy } from './proxy/index.js';
import { loadCaCertificates, trustEnv } from './trust.js';
import type { EgressProxyHandle, MirrorServiceOptions } from './proxy/index.js';
import type { EgressLogEntry, EgressPolicyView, EgressProxyLimits, EgressStats, SandboxResolver } from './types.js';

/** Logged kernel denials per second per sandbox (bursts of twice that). */
export const KERNEL_LOG_RATE_PER_SECOND = 50;
/** How long the node's own addresses are remembered before they are read again. */
const LOCAL_ADDRESSES_TTL_MS = 60_000;
/** apt's configuration for a sandbox's Debian mirror. */
export const APT_MIRROR_CONF = '/etc/apt/apt.conf.d/99dsec-mirror';

/** Network settings of a node (Edge options). */
export interface NetworkOptions {
  /** IPv4 range sandbox addresses come from, machine-wide. Default {@link DEFAULT_NETWORK_POOL}. */
  pool?: string;
  /** Prefix length of the slice one edge home claims. Default {@link DEFAULT_SLICE_PREFIX}. */
  slicePrefix?: number;
  /** Static name -> IPv4 map used by the DNS stub and the proxy before any resolver. */
  hosts?: Record<string, string>;
  /** Resolvers for other names; default the host's; `[]`: only `hosts` resolve. */
  nameservers?: string[];
  /** Per-sandbox limits of the egress proxy. */
  proxyLimits?: Partial<EgressProxyLimits>;
  /** Package mirrors: origins a policy's mirror may name, cache size, TTL (cache under `<home>/net/mirrors`). */
  mirrors?: Omit<MirrorServiceOptions, 'cacheDir'>;
  /** Open client connections to the proxy, node-wide. Default {@link DEFAULT_MAX_CONNECTIONS}. */
  maxProxyConnections?: number;
  /**
   * The operator's HTTP proxy for all egress (`http://[user:pass@]host:port`): the egress proxy
   * and the mirrors tunnel through it (CONNECT to the checked address). Default: direct.
   */
  upstreamProxy?: string;
  /** CA certificates (PEM text or absolute paths of PEM files) added to every networked sandbox's trust and to the mirrors'. Default none. */
  caCertificates?: string[];
  /**
   * IPv4 ranges of special addresses (loopback, private, link-local, ...) that names a policy
   * allows may resolve to, the node's own addresses included: the operator's setting, the only
   * way to them besides a root-project policy naming them. Default none.
   */
  allowedPrivateRanges?: readonly string[];
}

/** What {@link NodeNetwork} needs besides {@link NetworkOptions}. */
export interface NodeNetworkDeps {
  home: string;
  /** dsec-nflog (built beside chronus). */
  nflogBinary: string;
  /** dsec-netlink (built beside chronus). */
  netlinkBinary: string;
  raise: EventSink;
}

/** What a sandbox's network looks like now. */
export interface SandboxNetworkInfo {
  policy: NetworkPolicy;
  /** The sandbox's address and its gateway (allowlist only). */
  address?: string;
  gateway?: string;
  /** `HTTP_PROXY` for explicit proxying (allowlist with a proxy). */
  proxy?: string;
  /** Traffic through the proxy and attempts seen. */
  stats: EgressStats & EgressCounts;
}

interface Linked {
  id: string;
  slot: number;
  address: string;
  hostIf: string;
  ifindex: number;
  view: EgressPolicyView;
}

interface Infra {
  slice: NetworkSlice;
  /** The operator's CA certificates (PEM), when configured. */
  operatorCas?: string;
  dns: DnsStub;
  proxy: EgressProxyHandle;
  kernelLog: KernelLog;
  links: LinkMaker;
  slots: SlotAllocator;
}

/** What is saved per sandbox, so a restarted edge enforces the same policy. */
interface SavedNetwork {
  policy: NetworkPolicy;
  slot?: number;
}

/** A node's sandbox networking. */
export class NodeNetwork implements SandboxResolver {
  readonly monitor: EgressMonitor;
  readonly resolver: HostsResolver;
  private readonly policies = new Map<string, NetworkPolicy>();
  private readonly linked = new Map<string, Linked>();
  private readonly byAddress = new Map<string, Linked>();
  private readonly byIfindex = new Map<number, Linked>();
  private readonly versions = new Map<string, number>();
  private readonly changes = new KeyedSerialQueue();
  private infraP: Promise<Infra> | undefined;
  private readonly pool: Range;
  private readonly allowedPrivateRanges: IpRange[];
  private readonly tag: string;
  private readonly stateDir: string;
  private local: { at: number; addresses: string[] } = { at: 0, addresses: [] };
  /** The slice this home holds, once it has claimed one. */
  private claimed: NetworkSlice | undefined;

  constructor(
    private readonly o: NetworkOptions,
    private readonly deps: NodeNetworkDeps,
  ) {
    const pool = parseCidr(o.pool ?? DEFAULT_NETWORK_POOL);
    if (!pool) throw new DsecError('INVALID_ARGUMENT', `network.pool: ${o.pool} is not an IPv4 range`, { field: 'network.pool' });
    this.pool = pool;
    this.allowedPrivateRanges = (o.allowedPrivateRanges ?? []).map((cidr, i) => {
      const r = parseIpRange(cidr);
      if (!r || r.family !== 4) {
        throw new DsecError('INVALID_ARGUMENT', `network.allowedPrivateRanges.${i}: ${cidr} is not an IPv4 range`, {
          field: `network.allowedPrivateRanges.${i}`,
        });
      }
      return r;
    });
    this.tag = path.basename(runDirFor(deps.home));
    this.stateDir = path.join(deps.home, 'net');
    this.monitor = new EgressMonitor(deps.raise);
    this.resolver = new HostsResolver({ ...(o.hosts ? { hosts: o.hosts } : {}), ...(o.nameservers ? { nameservers: o.nameservers } : {}) });
  }

  /** nftables table of this home. */
  get table(): string {
    return tableOf(this.tag);
  }

  /** Prefix of this home's interface names. */
  get ifPrefix(): string {
    return ifPrefixOf(this.tag);
  }

  bySourceAddress(ip: string): EgressPolicyView | undefined {
    return this.byAddress.get(ip.startsWith('::ffff:') ? ip.slice(7) : ip)?.view;
  }

  /** The policy a sandbox has now (`none` for one never given another). */
  policyOf(id: string): NetworkPolicy {
    return this.policies.get(id) ?? DEFAULT_NETWORK_POLICY;
  }

  /** Runs changes of one sandbox one after another. */
  private serial<T>(id: string, fn: () => Promise<T>): Promise<T> {
    return this.changes.run(id, fn);
  }

  /**
   * Puts a (validated, normalised) policy in force for a sandbox whose network namespace is at
   * `netnsPath()`; `next` may compute it from the current one (a patch: no lost updates). Either
   * the new policy is in force when this returns, or the old one still is.
   */
  apply(id: string, next: NetworkPolicy | ((current: NetworkPolicy) => NetworkPolicy), netnsPath: () => Promise<string>): Promise<NetworkPolicy> {
    return this.serial(id, async () => {
      const policy = typeof next === 'function' ? next(this.policyOf(id)) : next;
      const cur = this.linked.get(id);
      if (policy.mode === 'allowlist') {
        if (cur) {
          await this.save(id, { policy, slot: cur.slot });
          this.register({ ...cur, view: await this.compile(id, cur.address, policy) });
          (await this.infraP)?.proxy?.policyChanged(id);
        } else {
          await this.link(id, policy, await netnsPath());
        }
      } else if (cur) {
        await this.unlink(id, cur);
      } else if (this.policies.has(id)) {
        await this.save(id, { policy });
      }
      this.policies.set(id, policy);
      return policy;
    });
  }

  /** Gives a sandbox its link and registers its policy; undone entirely on failure. */
  private async link(id: string, policy: NetworkPolicy, netnsPath: string): Promise<void> {
    const infra = await this.infra();
    const slot = infra.slots.take();
    const address = infra.slice.addressOf(slot);
    const hostIf = `${this.ifPrefix}${slot.toString(16)}`;
    try {
      const plan = { hostIf, netnsPath, gateway: infra.slice.gateway, address };
      const ifindex = await infra.links.attach(plan).catch(async (err: unknown) => {
        // The link of a sandbox destroyed long ago may still be on its way out: remove it, retry.
        if (!(err instanceof Error && err.message.includes('File exists'))) throw err;
        await deleteLinks([hostIf]);
        return infra.links.attach(plan);
      });
      crashPoint('network.link.attached');
      const view = await this.compile(id, address, policy);
      await this.save(id, { policy, slot });
      this.register({ id, slot, address, hostIf, ifindex, view });
    } catch (err) {
      this.unregister(id);
      await deleteLinks([hostIf]).catch(() => undefined);
      infra.slots.free(slot);
      throw err;
    }
  }

  /** Takes a sandbox off the network; on failure its old policy stays in force. */
  private async unlink(id: string, cur: Linked): Promise<void> {
    const old = this.policyOf(id);
    await this.save(id, { policy: DEFAULT_NETWORK_POLICY });
    this.unregister(id);
    const infra = await this.infraP;
    infra?.proxy?.forget(id);
    try {
      await deleteLinks([cur.hostIf]);
    } catch (err) {
      this.register(cur);
      await this.save(id, { policy: old, slot: cur.slot }).catch(() => undefined);
      throw err;
    }
    infra?.dns.forget(cur.address);
    infra?.slots.free(cur.slot);
  }

  private register(l: Linked): void {
    this.linked.set(l.id, l);
    this.byAddress.set(l.address, l);
    this.byIfindex.set(l.ifindex, l);
  }

  private unregister(id: string): void {
    const l = this.linked.get(id);
    if (!l) return;
    this.linked.delete(id);
    if (this.byAddress.get(l.address) === l) this.byAddress.delete(l.address);
    if (this.byIfindex.get(l.ifindex) === l) this.byIfindex.delete(l.ifindex);
  }

  private async compile(id: string, address: string, policy: NetworkPolicy): Promise<EgressPolicyView> {
    const version = (this.versions.get(id) ?? 0) + 1;
    this.versions.set(id, version);
    return compilePolicy(id, address, policy, version, this.addressing());
  }

  private addressing(): NodeAddressing {
    if (Date.now() - this.local.at > LOCAL_ADDRESSES_TTL_MS) {
      const addresses = new Set<string>();
      for (const list of Object.values(os.networkInterfaces())) for (const a of list ?? []) if (a.family === 'IPv4') addresses.add(a.address);
      this.local = { at: Date.now(), addresses: [...addresses] };
    }
    return { pool: this.pool, localAddresses: this.local.addresses, allowedPrivateRanges: this.allowedPrivateRanges };
  }

  /**
   * After an edge restart: puts a surviving sandbox's saved policy back in force. `fallback` is
   * the policy it was created with (used when nothing was saved).
   */
  recover(id: string, fallback: NetworkPolicy | undefined, netnsPath: () => Promise<string>): Promise<void> {
    return this.serial(id, async () => {
      const saved = await this.load(id);
      const policy = saved?.policy ?? fallback ?? DEFAULT_NETWORK_POLICY;
      this.policies.set(id, policy);
      if (policy.mode !== 'allowlist') return;
      const infra = await this.infra();
      const slot = saved?.slot;
      const hostIf = slot !== undefined ? `${this.ifPrefix}${slot.toString(16)}` : undefined;
      if (slot !== undefined && hostIf && (await linksWithPrefix(hostIf)).includes(hostIf)) {
        infra.slots.mark(slot);
        const address = infra.slice.addressOf(slot);
        const ifindex = Number(await readFile(`/sys/class/net/${hostIf}/ifindex`, 'utf8'));
        this.register({ id, slot, address, hostIf, ifindex, view: await this.compile(id, address, policy) });
        return;
      }
      await this.link(id, policy, await netnsPath());
    });
  }

  /** A sandbox is gone: forget it (its link went with its network namespace). */
  remove(id: string): Promise<void> {
    return this.serial(id, async () => {
      const cur = this.linked.get(id);
      this.unregister(id);
      this.policies.delete(id);
      this.versions.delete(id);
      this.monitor.forget(id);
      await rm(this.savedFile(id), { force: true });
      if (!cur) return;
      const infra = await this.infraP;
      infra?.proxy?.forget(id);
      infra?.dns.forget(cur.address);
      // The link goes with the sandbox's network namespace (the kernel frees it a moment later;
      // slots are reused round-robin, and a link still there when its slot comes round is removed).
      infra?.slots.free(cur.slot);
    });
  }

  /**
   * At an edge's start, once the sandboxes that survived are recovered: removes the saved
   * policies of every other sandbox. An edge killed between a sandbox's teardown and the removal
   * of its network (or during a create, after its link was made) leaves one, which nothing would
   * remove later (the sandbox is gone from the node; its link went with its namespace). Gives the
   * ids whose policy was removed.
   */
  async forgetSavedExcept(keep: (id: string) => boolean): Promise<string[]> {
    const removed: string[] = [];
    for (const file of await readdir(this.stateDir).catch(() => [] as string[])) {
      const id = /^(.+)\.json(?:\.tmp)?$/.exec(file)?.[1];
      if (id === undefined || keep(id)) continue;
      await rm(path.join(this.stateDir, file), { force: true });
      removed.push(id);
    }
    return removed;
  }

  /** Environment for commands of a sandbox with a network (explicit proxy settings). */
  env(id: string): Record<string, string> | undefined {
    const l = this.linked.get(id);
    const proxy = l ? this.proxyUrl() : undefined;
    if (!proxy) return undefined;
    const noProxy = 'localhost,127.0.0.1,::1';
    const env: Record<string, string> = { HTTP_PROXY: proxy, HTTPS_PROXY: proxy, http_proxy: proxy, https_proxy: proxy, NO_PROXY: noProxy, no_proxy: noProxy };
    // A mirror answers only plain HTTP (the proxy does not terminate TLS): point npm at it.
    if (l?.view.mirrors.npm) env.npm_config_registry = 'http://registry.npmjs.org/';
    // npm opens a CONNECT tunnel per request through HTTPS_PROXY (hundreds per install); its
    // registry reached directly goes through the transparent ports instead, over npm's own
    // keep-alive sockets (a few per install).
    if (l?.view.policy.presets?.includes('npm') || l?.view.mirrors.npm) {
      const direct = [noProxy, ...NETWORK_PRESETS.npm].join(',');
      Object.assign(env, { NO_PROXY: direct, no_proxy: direct, npm_config_noproxy: direct });
    }
    // pip: the index over plain HTTP when mirrored (the mirror rewrites file URLs onto
    // files.pythonhosted.org, also plain HTTP), which pip must be told to accept.
    if (l?.view.mirrors.pypi) {
      Object.assign(env, { PIP_INDEX_URL: 'http://pypi.org/simple/', PIP_TRUSTED_HOST: NETWORK_PRESETS.pypi.join(' ') });
    }
    if (this.infraNow?.operatorCas) Object.assign(env, trustEnv());
    return env;
  }

  /**
   * Files a linked sandbox's root gets for its package managers: with a Debian mirror, apt's
   * setting for it (a frozen mirror serves a snapshot archive, whose Release files are past their
   * Valid-Until; an unfrozen one keeps apt's check). Empty when there is nothing to write.
   */
  presetFiles(id: string): Array<{ path: string; content: string }> {
    const debian = this.linked.get(id)?.view.mirrors.debian;
    if (!debian) return [];
    const check = debian.freeze ? 'Acquire::Check-Valid-Until "false";\n' : '';
    return [{ path: APT_MIRROR_CONF, content: `// Written by dsec for the sandbox's Debian mirror (network policy).\n${check}` }];
  }

  /** The operator's CA certificates (PEM) to install in a linked sandbox, when configured. */
  operatorCas(id: string): string | undefined {
    return this.linked.has(id) ? this.infraNow?.operatorCas : undefined;
  }

  private proxyUrl(): string | undefined {
    return this.infraNow?.proxy ? `http://${this.infraNow.slice.gateway}:${EXPLICIT_PROXY_PORT}` : undefined;
  }

  private infraNow: Infra | undefined;

  /** `/etc/resolv.conf` for a sandbox with a network. */
  resolvConf(id: string): string | undefined {
    if (!this.linked.has(id) || !this.infraNow) return undefined;
    return `nameserver ${this.infraNow.slice.gateway}\noptions timeout:2 attempts:2\n`;
  }

  /** A sandbox's network as it is now. */
  info(id: string): SandboxNetworkInfo {
    const l = this.linked.get(id);
    const proxyStats = this.infraNow?.proxy?.stats(id) ?? { bytesIn: 0, bytesOut: 0, connections: 0, totalConnections: 0, denied: 0 };
    const counts = this.monitor.counts(id);
    const out: SandboxNetworkInfo = { policy: this.policyOf(id), stats: { ...proxyStats, ...counts, denied: counts.denied } };
    if (l && this.infraNow) {
      out.address = l.address;
      out.gateway = this.infraNow.slice.gateway;
      const proxy = this.proxyUrl();
      if (proxy) out.proxy = proxy;
    }
    return out;
  }

  /** The latest egress attempts of a sandbox, oldest first. */
  log(id: string, limit?: number): EgressLogEntry[] {
    return this.monitor.recent(id, limit);
  }

  private infra(): Promise<Infra> {
    this.infraP ??= this.setUpInfra().then(
      (infra) => {
        this.infraNow = infra;
        return infra;
      },
      (err: unknown) => {
        this.infraP = undefined;
        throw err;
      },
    );
    return this.infraP;
  }

  private async setUpInfra(): Promise<Infra> {
    const undo: Array<() => unknown> = [];
    try {
      await mkdir(this.stateDir, { recursive: true, mode: 0o700 });
      const slice = await claimSlice(this.deps.home, this.o.pool ?? DEFAULT_NETWORK_POOL, this.o.slicePrefix ?? DEFAULT_SLICE_PREFIX, purgeHome);
      this.claimed = slice;
      undo.push(async () => {
        this.claimed = undefined;
        await releaseSlice(this.deps.home, slice);
      });
      const gwIf = `${this.ifPrefix}gw`;
      await ensureGateway(gwIf, `${this.ifPrefix}gp`, slice.gateway);
      undo.push(() => deleteLinks([gwIf]));
      const operatorCas = this.o.caCertificates?.length ? await loadCaCertificates(this.o.caCertificates) : undefined;
      const record = (e: EgressLogEntry): void => this.monitor.record(e);
      const dns = await DnsStub.start({ address: slice.gateway, sandboxes: this, resolver: this.resolver, log: record });
      undo.push(() => dns.close());
      const proxy = await startEgressProxy({
        address: slice.gateway,
        sandboxes: this,
        resolver: this.resolver,
        log: record,
        raise: this.deps.raise,
        mirrors: { ...this.o.mirrors, cacheDir: path.join(this.stateDir, 'mirrors') },
        ...(this.o.proxyLimits ? { limits: this.o.proxyLimits } : {}),
        maxConnections: this.o.maxProxyConnections ?? DEFAULT_MAX_CONNECTIONS,
        outbound: { ...(this.o.upstreamProxy ? { upstreamProxy: this.o.upstreamProxy } : {}), ...(operatorCas ? { caCertificates: operatorCas } : {}) },
      });
      undo.push(() => proxy.close());
      const logGroup = 20_000 + ((slice.range.base >>> (32 - slice.range.prefix)) % 40_000);
      const kernelLog = new KernelLog(this.deps.nflogBinary, logGroup, (p) => this.kernelDenied(p));
      await kernelLog.start();
      undo.push(() => kernelLog.close());
      await applyTable({
        table: this.table,
        ifPrefix: this.ifPrefix,
        gateway: slice.gateway,
        ports: { dns: dns.port, http: proxy.ports.http, transparentHttp: proxy.ports.transparentHttp, transparentTls: proxy.ports.transparentTls },
        logGroup,
        logRatePerSecond: KERNEL_LOG_RATE_PER_SECOND,
      });
      return {
        slice,
        ...(operatorCas ? { operatorCas } : {}),
        dns,
        proxy,
        kernelLog,
        links: new LinkMaker(this.deps.netlinkBinary),
        slots: new SlotAllocator(slice.slots),
      };
    } catch (err) {
      for (const step of undo.reverse())
        await Promise.resolve()
          .then(step)
          .catch(() => undefined);
      throw err;
    }
  }

  private kernelDenied(p: LoggedPacket): void {
    const l = this.byIfindex.get(p.ifindex) ?? this.byAddress.get(p.source);
    if (!l) return;
    const protocol = p.family === 6 ? `ipv6/${protocolName(p.protocol)}` : protocolName(p.protocol);
    this.monitor.record({
      sandboxId: l.id,
      via: 'kernel',
      host: p.destination,
      port: p.port,
      protocol,
      verdict: 'denied',
      reason:
        p.reason === 'spoofed'
          ? `source address ${p.source} is not the sandbox's`
          : p.family === 6
            ? 'IPv6 is not allowed'
            : 'only the gateway DNS and proxy are reachable',
    });
  }

  private savedFile(id: string): string {
    return path.join(this.stateDir, `${id}.json`);
  }

  private async save(id: string, s: SavedNetwork): Promise<void> {
    await mkdir(this.stateDir, { recursive: true, mode: 0o700 });
    const file = this.savedFile(id);
    await writeFile(`${file}.tmp`, JSON.stringify(s));
    await rename(`${file}.tmp`, file);
  }

  private async load(id: string): Promise<SavedNetwork | undefined> {
    try {
      return JSON.parse(await readFile(this.savedFile(id), 'utf8')) as SavedNetwork;
    } catch {
      return undefined;
    }
  }

  /** Stops listening (sandboxes keep their links; a reopened edge serves them again). */
  async close(): Promise<void> {
    const infra = await this.infraP?.catch(() => undefined);
    this.infraP = undefined;
    this.infraNow = undefined;
    if (!infra) return;
    infra.kernelLog.close();
    infra.links.close();
    await infra.proxy?.close();
    await infra.dns.close();
    this.resolver.close();
  }

  /** Removes everything of this home's networking: table, links, slice claim, saved state (tests). */
  async shutdown(): Promise<void> {
    await this.close();
    // A node that never had a networked sandbox has nothing to remove (and runs no nft for it).
    if (this.claimed || (await linksWithPrefix(this.ifPrefix)).length > 0) await purgeHome(this.deps.home);
    if (this.claimed) await releaseSlice(this.deps.home, this.claimed);
    this.claimed = undefined;
    await rm(this.stateDir, { recursive: true, force: true });
  }
}

/** The nftables table of a home with run-dir tag `tag`. */
export function tableOf(tag: string): string {
  return `dsec_${tag}`;
}

/** The prefix of a home's interface names (15 characters at most in all). */
export function ifPrefixOf(tag: string): string {
  return `d${tag.slice(0, 6)}-`;
}

/** Removes a home's table and links (its own shutdown, or a stale claim taken over). */
export async function purgeHome(home: string): Promise<void> {
  const tag = path.basename(runDirFor(home));
  await deleteTable(tableOf(tag)).catch(() => undefined);
  await deleteLinks(await linksWithPrefix(ifPrefixOf(tag)));
}
