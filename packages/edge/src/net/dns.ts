// The DNS stub sandboxes with a network ask (UDP and TCP, on the gateway address). It answers
// only names the asking sandbox's policy allows, and answers them with the gateway's own
// address: connections then reach the egress proxy (ports 80 and 443 are redirected to it, and
// explicit proxying ignores addresses), which resolves and checks the real destination itself.
// A sandbox never learns an upstream's address, and a name that resolves only to addresses its
// policy does not name (DNS rebinding into loopback or private ranges) is refused here already.
import dgram from 'node:dgram';
import net from 'node:net';
import { DsecError, hostNameProblem } from '@dsec/protocol';
import type { EgressLogSink, NameResolver, SandboxResolver } from './types.js';

/** DNS response codes used here. */
export const RCODE = { NOERROR: 0, FORMERR: 1, SERVFAIL: 2, NXDOMAIN: 3, NOTIMP: 4, REFUSED: 5 } as const;
const TYPE_A = 1;
const CLASS_IN = 1;
/** TTL of answers: they always name the gateway, so only policy changes make them stale. */
export const DNS_ANSWER_TTL_S = 30;
/** Queries per second one sandbox may ask (bursts of twice that). */
export const DNS_QUERIES_PER_SECOND = 200;
/** Open TCP connections to the stub, all sandboxes together. */
export const DNS_MAX_TCP_CONNECTIONS = 256;
/** A TCP connection without a query for this long is closed. */
export const DNS_TCP_IDLE_MS = 10_000;
/** Largest TCP query accepted. */
const MAX_TCP_QUERY_BYTES = 4096;

/** A parsed question. */
export interface DnsQuestion {
  id: number;
  /** Recursion desired (echoed back). */
  rd: boolean;
  /** Lower-case name without the trailing dot. */
  name: string;
  type: number;
  cls: number;
  /** The question section's bytes (copied into the answer). */
  raw: Buffer;
  /** Why the name is no host name (a byte outside letters, digits and inner hyphens in a label, too long, an IP literal); undefined when it is one. */
  nameProblem?: string;
}

/** A label's bytes as a host name allows them: letters, digits and inner hyphens. */
const LDH_LABEL = /^[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?$/;

/** Why the labels (raw, as on the wire) are not a host name, or undefined. */
export function dnsNameProblem(labels: readonly string[]): string | undefined {
  if (labels.length === 0) return 'the root name';
  for (const l of labels) {
    if (!LDH_LABEL.test(l)) return `label ${JSON.stringify(l).slice(0, 80)} has a byte outside letters, digits and inner hyphens`;
  }
  return hostNameProblem(labels.join('.'));
}

/** A name as it goes into the egress log: printable, bounded. */
export function printableName(name: string): string {
  return JSON.stringify(name).slice(1, -1).slice(0, 300);
}

/** Parses a query; returns an rcode when it cannot be answered normally (with the id when known). */
export function parseQuery(msg: Buffer): DnsQuestion | { id: number; rcode: number } | undefined {
  if (msg.length < 12) return undefined;
  const id = msg.readUInt16BE(0);
  const flags = msg.readUInt16BE(2);
  if (flags & 0x8000) return undefined; // a response: ignore
  if (((flags >> 11) & 0xf) !== 0) return { id, rcode: RCODE.NOTIMP };
  if (msg.readUInt16BE(4) !== 1) return { id, rcode: RCODE.FORMERR };
  const labels: string[] = [];
  let off = 12;
  for (;;) {
    const len = msg[off];
    if (len === undefined) return { id, rcode: RCODE.FORMERR };
    off++;
    if (len === 0) break;
    if (len > 63 || off + len > msg.length) return { id, rcode: RCODE.FORMERR };
    labels.push(msg.subarray(off, off + len).toString('latin1'));
    off += len;
  }
  if (off + 4 > msg.length || off - 12 > 255) return { id, rcode: RCODE.FORMERR };
  const type = msg.readUInt16BE(off);
  const cls = msg.readUInt16BE(off + 2);
  const problem = dnsNameProblem(labels);
  return {
    id,
    rd: (flags & 0x0100) !== 0,
    name: labels.join('.').toLowerCase(),
    type,
    cls,
    raw: Buffer.from(msg.subarray(12, off + 4)),
    ...(problem ? { nameProblem: problem } : {}),
  };
}

/** Builds a response: the question echoed, and an A record per address. */
export function buildResponse(id: number, rd: boolean, rcode: number, question: Buffer | undefined, addresses: readonly string[] = []): Buffer {
  const header = Buffer.alloc(12);
  header.writeUInt16BE(id, 0);
  header.writeUInt16BE(0x8000 | (rd ? 0x0100 : 0) | 0x0080 | rcode, 2);
  header.writeUInt16BE(question ? 1 : 0, 4);
  header.writeUInt16BE(addresses.length, 6);
  const answers = addresses.map((ip) => {
    const rr = Buffer.alloc(16);
    rr.writeUInt16BE(0xc00c, 0); // the name: a pointer to the question's
    rr.writeUInt16BE(TYPE_A, 2);
    rr.writeUInt16BE(CLASS_IN, 4);
    rr.writeUInt32BE(DNS_ANSWER_TTL_S, 6);
    rr.writeUInt16BE(4, 10);
    ip.split('.').forEach((p, i) => rr.writeUInt8(Number(p), 12 + i));
    return rr;
  });
  return Buffer.concat([header, ...(question ? [question] : []), ...answers]);
}

/** Options of {@link DnsStub.start}. */
export interface DnsStubOptions {
  /** The gateway address: listen here, and answer allowed names with it. */
  address: string;
  /** Port (0 picks one; the kernel redirects port 53 to it). */
  port?: number;
  sandboxes: SandboxResolver;
  resolver: NameResolver;
  log: EgressLogSink;
}

interface Bucket {
  tokens: number;
  at: number;
}

/** The running stub. */
export class DnsStub {
  private readonly buckets = new Map<string, Bucket>();
  private readonly conns = new Set<net.Socket>();

  private constructor(
    private readonly o: DnsStubOptions,
    private readonly udp: dgram.Socket,
    private readonly tcp: net.Server,
    /** The port both listen on. */
    readonly port: number,
  ) {}

  /** Listens on UDP and TCP, on one port. */
  static async start(o: DnsStubOptions): Promise<DnsStub> {
    const udp = dgram.createSocket({ type: 'udp4' });
    await new Promise<void>((resolve, reject) => {
      udp.once('error', reject);
      udp.bind(o.port ?? 0, o.address, () => {
        udp.off('error', reject);
        resolve();
      });
    });
    const port = udp.address().port;
    const tcp = net.createServer();
    try {
      await new Promise<void>((resolve, reject) => {
        tcp.once('error', reject);
        tcp.listen(port, o.address, () => {
          tcp.off('error', reject);
          resolve();
        });
      });
    } catch (err) {
      udp.close();
      throw new DsecError('UNAVAILABLE', `DNS stub cannot listen on ${o.address}:${port}/tcp: ${(err as Error).message}`);
    }
    const stub = new DnsStub(o, udp, tcp, port);
    udp.on('message', (msg, rinfo) => {
      void stub.answer(msg, rinfo.address).then((reply) => {
        if (reply) udp.send(reply, rinfo.port, rinfo.address);
      });
    });
    udp.on('error', () => undefined);
    tcp.on('connection', (sock) => stub.serveTcp(sock));
    return stub;
  }

  private serveTcp(sock: net.Socket): void {
    if (this.conns.size >= DNS_MAX_TCP_CONNECTIONS) {
      sock.destroy();
      return;
    }
    this.conns.add(sock);
    sock.setTimeout(DNS_TCP_IDLE_MS, () => sock.destroy());
    sock.on('close', () => this.conns.delete(sock));
    sock.on('error', () => undefined);
    let buf = Buffer.alloc(0);
    sock.on('data', (chunk: Buffer) => {
      buf = Buffer.concat([buf, chunk]);
      while (buf.length >= 2) {
        const len = buf.readUInt16BE(0);
        if (len > MAX_TCP_QUERY_BYTES) {
          sock.destroy();
          return;
        }
        if (buf.length < 2 + len) break;
        const msg = buf.subarray(2, 2 + len);
        buf = buf.subarray(2 + len);
        void this.answer(Buffer.from(msg), sock.remoteAddress ?? '').then((reply) => {
          if (!reply || sock.destroyed) return;
          const framed = Buffer.alloc(2 + reply.length);
          framed.writeUInt16BE(reply.length, 0);
          reply.copy(framed, 2);
          sock.write(framed);
        });
      }
    });
  }

  /** One sandbox's token bucket: false when it asks too fast. */
  private admit(source: string): boolean {
    const now = Date.now();
    const b = this.buckets.get(source) ?? { tokens: DNS_QUERIES_PER_SECOND * 2, at: now };
    b.tokens = Math.min(DNS_QUERIES_PER_SECOND * 2, b.tokens + ((now - b.at) / 1000) * DNS_QUERIES_PER_SECOND);
    b.at = now;
    if (b.tokens < 1) return false;
    b.tokens--;
    this.buckets.set(source, b);
    return true;
  }

  /** The reply to one query from `source`, or undefined to stay silent. */
  async answer(msg: Buffer, source: string): Promise<Buffer | undefined> {
    const q = parseQuery(msg);
    if (!q) return undefined;
    if ('rcode' in q) return buildResponse(q.id, false, q.rcode, undefined);
    const view = this.o.sandboxes.bySourceAddress(source.replace(/^::ffff:/, ''));
    if (!view) return buildResponse(q.id, q.rd, RCODE.REFUSED, q.raw);
    if (!this.admit(source)) return buildResponse(q.id, q.rd, RCODE.REFUSED, q.raw);
    if (q.cls !== CLASS_IN) return buildResponse(q.id, q.rd, RCODE.REFUSED, q.raw);
    if (q.nameProblem !== undefined) {
      // Refused before any policy check or lookup: the name never reaches a matcher or a resolver.
      this.o.log({
        sandboxId: view.sandboxId,
        via: 'dns',
        host: printableName(q.name),
        port: 53,
        protocol: 'udp',
        verdict: 'denied',
        reason: `bad-name: ${q.nameProblem}`,
      });
      return buildResponse(q.id, q.rd, RCODE.REFUSED, q.raw);
    }
    const verdict = view.allowsName(q.name);
    const entry = { sandboxId: view.sandboxId, via: 'dns' as const, host: q.name, port: 53, protocol: 'udp' };
    if (!verdict.allowed) {
      this.o.log({ ...entry, verdict: 'denied', reason: verdict.reason ?? 'no rule matches' });
      return buildResponse(q.id, q.rd, RCODE.NXDOMAIN, q.raw);
    }
    // Only A questions get addresses; AAAA and the rest get an empty answer (IPv6 is off).
    if (q.type !== TYPE_A) return buildResponse(q.id, q.rd, RCODE.NOERROR, q.raw);
    let addresses: string[];
    try {
      addresses = await this.o.resolver.resolve4(q.name);
    } catch {
      return buildResponse(q.id, q.rd, RCODE.SERVFAIL, q.raw);
    }
    if (addresses.length === 0) return buildResponse(q.id, q.rd, RCODE.NXDOMAIN, q.raw);
    const usable = addresses.filter((ip) => view.addressAllowed(ip));
    if (usable.length === 0) {
      this.o.log({
        ...entry,
        verdict: 'denied',
        ...(verdict.rule ? { rule: verdict.rule } : {}),
        address: addresses[0] as string,
        reason: 'resolves only to addresses the policy does not name',
      });
      return buildResponse(q.id, q.rd, RCODE.NXDOMAIN, q.raw);
    }
    this.o.log({ ...entry, verdict: 'allowed', ...(verdict.rule ? { rule: verdict.rule } : {}), address: usable[0] as string });
    return buildResponse(q.id, q.rd, RCODE.NOERROR, q.raw, [this.o.address]);
  }

  /** Forgets a sandbox's rate state. */
  forget(address: string): void {
    this.buckets.delete(address);
  }

  async close(): Promise<void> {
    for (const s of this.conns) s.destroy();
    await new Promise<void>((resolve) => this.udp.close(() => resolve()));
    await new Promise<void>((resolve) => this.tcp.close(() => resolve()));
  }
}
