// The kernel side of sandbox networking: links (dsec-netlink for sandboxes, iproute2 for the
// rest) and the node's nftables table (one `nft -f` transaction that replaces the whole table). Nothing here decides policy: the
// kernel only lets sandboxes reach the gateway's DNS and proxy ports, and logs the rest.
import { spawn } from 'node:child_process';
import type { ChildProcessByStdio } from 'node:child_process';
import { readdir } from 'node:fs/promises';
import { createInterface } from 'node:readline';
import type { Readable, Writable } from 'node:stream';
import { DsecError } from '@dsec/protocol';

/** Time one ip or nft call may take. */
const TOOL_TIMEOUT_MS = 15_000;
const MAX_CAPTURE_BYTES = 16_384;

/** Runs a tool with `input` on stdin; throws BACKEND_FAILED with its stderr when it fails. */
export function runTool(argv: string[], input: string, what: string): Promise<void> {
  return new Promise((resolve, reject) => {
    const child = spawn(argv[0] as string, argv.slice(1), { stdio: ['pipe', 'ignore', 'pipe'] });
    let stderr = '';
    child.stderr.on('data', (d: Buffer) => {
      if (stderr.length < MAX_CAPTURE_BYTES) stderr += d.toString();
    });
    const timer = setTimeout(() => child.kill('SIGKILL'), TOOL_TIMEOUT_MS);
    child.on('error', (err) => {
      clearTimeout(timer);
      reject(new DsecError('BACKEND_FAILED', `${what}: cannot run ${argv[0]}: ${err.message}`));
    });
    child.on('close', (code, signal) => {
      clearTimeout(timer);
      if (code === 0) resolve();
      else reject(new DsecError('BACKEND_FAILED', `${what}: ${argv[0]} failed: ${stderr.trim().split('\n').slice(-3).join('; ') || `exit ${code ?? signal}`}`));
    });
    child.stdin.on('error', () => undefined);
    child.stdin.end(input);
  });
}

/** `ip -batch -` in the host's network namespace. */
export function ipBatch(lines: string[], what: string): Promise<void> {
  return runTool(['ip', '-batch', '-'], lines.join('\n') + '\n', what);
}

/** Interface names on the host that start with `prefix`. */
export async function linksWithPrefix(prefix: string): Promise<string[]> {
  return (await readdir('/sys/class/net').catch(() => [] as string[])).filter((n) => n.startsWith(prefix));
}

/** Deletes interfaces (a veth's peer goes with it); missing ones are not an error. */
export async function deleteLinks(names: string[]): Promise<void> {
  if (names.length === 0) return;
  await runTool(['ip', '-force', '-batch', '-'], names.map((n) => `link del dev ${n}`).join('\n') + '\n', 'delete links').catch(async () => {
    // -force still exits non-zero when a line failed; what matters is that none is left.
    const left = (await readdir('/sys/class/net').catch(() => [] as string[])).filter((n) => names.includes(n));
    if (left.length) throw new DsecError('BACKEND_FAILED', `cannot delete links ${left.join(', ')}`);
  });
}

/**
 * Creates the interface that holds the gateway address while no sandbox link does (idempotent).
 * It is a veth pair with both ends on the host (kernels without the dummy driver have veth).
 */
export async function ensureGateway(name: string, peer: string, gateway: string): Promise<void> {
  const exists = (await linksWithPrefix(name)).includes(name);
  const lines = exists ? [] : [`link add ${name} type veth peer name ${peer}`, `link set ${name} addrgenmode none`, `link set ${peer} addrgenmode none`];
  lines.push(`addr replace ${gateway}/32 dev ${name}`, `link set ${peer} up`, `link set ${name} up`);
  await ipBatch(lines, `gateway ${gateway}`);
}

/** What one sandbox's link needs. */
export interface VethPlan {
  /** Host-side interface name. */
  hostIf: string;
  /** The sandbox's network namespace (a path: /proc/<pid>/ns/net). */
  netnsPath: string;
  gateway: string;
  address: string;
}

const IFNAME_RE = /^[a-z0-9-]{1,15}$/;
const IPV4_RE = /^\d{1,3}(\.\d{1,3}){3}$/;

/**
 * Makes sandbox links through one long-running dsec-netlink (no fork per sandbox). A link is a
 * veth pair whose host end holds the gateway address (pointing at the sandbox's /32) and whose
 * other end, `eth0` in the sandbox, holds the sandbox's address with a default route via the
 * gateway; no IPv6 addresses on either end. Requests are answered in order.
 */
export class LinkMaker {
  private child: ChildProcessByStdio<Writable, Readable, Readable> | undefined;
  private readonly waiting: Array<{ resolve: (line: string) => void; reject: (err: Error) => void }> = [];

  constructor(private readonly binary: string) {}

  private process(): ChildProcessByStdio<Writable, Readable, Readable> {
    if (this.child && this.child.exitCode === null && !this.child.killed) return this.child;
    const child = spawn(this.binary, [], { stdio: ['pipe', 'pipe', 'pipe'] });
    let stderr = '';
    child.stderr.on('data', (d: Buffer) => {
      if (stderr.length < MAX_CAPTURE_BYTES) stderr += d.toString();
    });
    createInterface({ input: child.stdout }).on('line', (line) => this.waiting.shift()?.resolve(line));
    const fail = (why: string): void => {
      if (this.child === child) this.child = undefined;
      const err = new DsecError('BACKEND_FAILED', `dsec-netlink: ${stderr.trim() || why}`);
      for (const w of this.waiting.splice(0)) w.reject(err);
    };
    child.on('error', (err) => fail(err.message));
    child.on('close', (code, signal) => fail(`exited with ${code ?? signal}`));
    child.stdin.on('error', () => undefined);
    this.child = child;
    return child;
  }

  /** Gives a sandbox its link; returns the host end's interface index. */
  attach(p: VethPlan): Promise<number> {
    if (!IFNAME_RE.test(p.hostIf) || !/^[^\s]+$/.test(p.netnsPath) || !IPV4_RE.test(p.gateway) || !IPV4_RE.test(p.address)) {
      return Promise.reject(new DsecError('INTERNAL', `bad link plan ${JSON.stringify(p)}`));
    }
    const child = this.process();
    return new Promise<string>((resolve, reject) => {
      this.waiting.push({ resolve, reject });
      child.stdin.write(`attach ${p.hostIf} ${p.netnsPath} ${p.gateway} ${p.address}\n`);
    }).then((line) => {
      const [verdict, ...rest] = line.split(' ');
      if (verdict !== 'ok') throw new DsecError('BACKEND_FAILED', `link ${p.hostIf}: ${rest.join(' ') || line}`);
      return Number(rest[0]);
    });
  }

  close(): void {
    this.child?.stdin.end();
    this.child = undefined;
  }
}

/** The ports the node's table lets sandboxes reach on the gateway, after redirection. */
export interface GatewayPorts {
  /** The DNS stub (UDP and TCP); port 53 is redirected here. */
  dns: number;
  /** The explicit proxy; {@link EXPLICIT_PROXY_PORT} is redirected here. */
  http?: number;
  /** Where TCP 80 to any address goes. */
  transparentHttp?: number;
  /** Where TCP 443 to any address goes. */
  transparentTls?: number;
}

/** The port sandboxes use for explicit proxying (HTTP_PROXY=http://<gateway>:3128). */
export const EXPLICIT_PROXY_PORT = 3128;

/** What the node's table is built from. */
export interface TablePlan {
  /** nftables table name (family inet). */
  table: string;
  /** Prefix of every sandbox's host-side interface. */
  ifPrefix: string;
  gateway: string;
  ports: GatewayPorts;
  /** NFLOG group that denied attempts are logged to. */
  logGroup: number;
  /** Logged packets per second per sandbox (bursts of twice that); the rest are dropped silently. */
  logRatePerSecond: number;
}

/**
 * The node's table. Sandbox packets are judged before routing (so even packets the host would
 * not forward are logged): IPv4 only, from the sandbox's own address (reverse-path check), to
 * the gateway's DNS and explicit-proxy ports, or TCP 80/443 anywhere (redirected to the proxy).
 * Everything else is logged (TCP only for connection attempts, rate-limited) and dropped. The
 * input and forward hooks drop anything from a sandbox that got past that with another target.
 */
export function tableRuleset(p: TablePlan): string {
  const wild = `"${p.ifPrefix}*"`;
  const gw = p.gateway;
  const { dns, http, transparentHttp: th, transparentTls: tt } = p.ports;
  const proxyTcp = [53, ...(http ? [EXPLICIT_PROXY_PORT] : [])];
  const localTcp = [dns, http, th, tt].filter((x): x is number => x !== undefined);
  const transparent = [...(th ? [80] : []), ...(tt ? [443] : [])];
  const lines = [
    `table inet ${p.table}`,
    `delete table inet ${p.table}`,
    `table inet ${p.table} {`,
    `  set lograte { type ipv4_addr; size 65536; flags dynamic,timeout; timeout 1m; }`,
    `  chain screen {`,
    `    type filter hook prerouting priority mangle - 10; policy accept;`,
    `    iifname != ${wild} accept`,
    `    meta nfproto != ipv4 goto deny`,
    `    fib saddr . iif oif missing goto spoofed`,
    `    ip daddr ${gw} tcp dport { ${proxyTcp.join(', ')} } accept`,
    `    ip daddr ${gw} udp dport 53 accept`,
    ...(transparent.length ? [`    tcp dport { ${transparent.join(', ')} } accept`] : []),
    `    goto deny`,
    `  }`,
    `  chain divert {`,
    `    type nat hook prerouting priority dstnat; policy accept;`,
    `    iifname != ${wild} accept`,
    `    ip daddr ${gw} udp dport 53 dnat ip to ${gw}:${dns}`,
    `    ip daddr ${gw} tcp dport 53 dnat ip to ${gw}:${dns}`,
    ...(http ? [`    ip daddr ${gw} tcp dport ${EXPLICIT_PROXY_PORT} dnat ip to ${gw}:${http}`] : []),
    ...(th ? [`    tcp dport 80 dnat ip to ${gw}:${th}`] : []),
    ...(tt ? [`    tcp dport 443 dnat ip to ${gw}:${tt}`] : []),
    `  }`,
    `  chain local_in {`,
    `    type filter hook input priority filter; policy accept;`,
    `    iifname != ${wild} accept`,
    `    ip daddr ${gw} tcp dport { ${localTcp.join(', ')} } accept`,
    `    ip daddr ${gw} udp dport ${dns} accept`,
    `    counter drop`,
    `  }`,
    `  chain transit {`,
    `    type filter hook forward priority filter; policy accept;`,
    `    iifname ${wild} counter drop`,
    `    oifname ${wild} counter drop`,
    `  }`,
    `  chain spoofed {`,
    `    update @lograte { ip saddr limit rate over ${p.logRatePerSecond}/second burst ${p.logRatePerSecond * 2} packets } counter drop`,
    `    log prefix "spoofed" group ${p.logGroup}`,
    `    counter drop`,
    `  }`,
    `  chain deny {`,
    // One line per connection attempt: a TCP segment other than a first SYN is just dropped.
    `    tcp flags & (syn | ack) != syn counter drop`,
    `    meta nfproto != ipv4 limit rate over ${p.logRatePerSecond}/second burst ${p.logRatePerSecond * 2} packets counter drop`,
    `    meta nfproto ipv4 update @lograte { ip saddr limit rate over ${p.logRatePerSecond}/second burst ${p.logRatePerSecond * 2} packets } counter drop`,
    `    log prefix "deny" group ${p.logGroup}`,
    `    counter drop`,
    `  }`,
    `}`,
  ];
  return lines.join('\n') + '\n';
}

/** Applies a whole table in one transaction: it replaces the old one entirely, or nothing changes. */
export function applyTable(plan: TablePlan): Promise<void> {
  return runTool(['nft', '-f', '-'], tableRuleset(plan), `nftables table ${plan.table}`);
}

/** Deletes a table (missing is not an error). */
export async function deleteTable(table: string): Promise<void> {
  await runTool(['nft', '-f', '-'], `table inet ${table}\ndelete table inet ${table}\n`, `delete nftables table ${table}`);
}
