// Reads the packets the node's table drops and logs (dsec-nflog, one per node), so that kernel
// denials (a direct connection, another port, UDP elsewhere, ICMP, IPv6) are seen per sandbox.
import { spawn } from 'node:child_process';
import type { ChildProcessByStdio } from 'node:child_process';
import { createInterface } from 'node:readline';
import type { Readable } from 'node:stream';

/** One logged packet. */
export interface LoggedPacket {
  family: 4 | 6;
  /** The rule's prefix: `deny` or `spoofed`. */
  reason: string;
  source: string;
  destination: string;
  /** IP protocol number (6 TCP, 17 UDP, 1 ICMP, 58 ICMPv6). */
  protocol: number;
  sourcePort: number;
  /** Destination port; the ICMP type for ICMP. */
  port: number;
  /** Index of the interface it came in on. */
  ifindex: number;
}

/** Parses one output line of dsec-nflog. */
export function parseLogLine(line: string): LoggedPacket | undefined {
  const f = line.split(' ');
  if (f.length !== 8 || (f[0] !== '4' && f[0] !== '6')) return undefined;
  const [protocol, sourcePort, port, ifindex] = [Number(f[4]), Number(f[5]), Number(f[6]), Number(f[7])];
  if (![protocol, sourcePort, port, ifindex].every(Number.isInteger)) return undefined;
  return { family: f[0] === '4' ? 4 : 6, reason: f[1] as string, source: f[2] as string, destination: f[3] as string, protocol, sourcePort, port, ifindex };
}

/** Names of the protocols worth naming. */
export function protocolName(n: number): string {
  return ({ 1: 'icmp', 6: 'tcp', 17: 'udp', 58: 'icmpv6', 132: 'sctp' } as Record<number, string>)[n] ?? `ip-proto-${n}`;
}

/** Delay before restarting a reader that died; doubled after each quick death, up to the max. */
const RESTART_DELAY_MS = 1000;
const MAX_RESTART_DELAY_MS = 60_000;

/** A running dsec-nflog, restarted if it dies, until closed. */
export class KernelLog {
  private child: ChildProcessByStdio<null, Readable, Readable> | undefined;
  private closed = false;
  private timer: NodeJS.Timeout | undefined;
  private delayMs = RESTART_DELAY_MS;
  /** The last failure (for diagnostics): the reader's stderr or exit. */
  lastError: string | undefined;

  constructor(
    private readonly binary: string,
    private readonly group: number,
    private readonly onPacket: (p: LoggedPacket) => void,
  ) {}

  /** Starts the reader and waits until it is bound to the group (or failed). */
  start(): Promise<void> {
    return new Promise((resolve) => {
      const child = spawn(this.binary, [String(this.group)], { stdio: ['ignore', 'pipe', 'pipe'] });
      this.child = child;
      let ready = false;
      let stderr = '';
      child.stderr.on('data', (d: Buffer) => {
        if (stderr.length < 4096) stderr += d.toString();
      });
      const lines = createInterface({ input: child.stdout });
      lines.on('line', (line) => {
        if (!ready && line.startsWith('ready ')) {
          ready = true;
          this.delayMs = RESTART_DELAY_MS;
          resolve();
          return;
        }
        const p = parseLogLine(line);
        if (p) this.onPacket(p);
      });
      child.on('error', (err) => {
        this.lastError = err.message;
      });
      child.on('close', (code, signal) => {
        this.lastError = stderr.trim() || `exited with ${code ?? signal}`;
        if (!ready) resolve();
        if (this.child === child) this.child = undefined;
        if (!this.closed) {
          this.timer = setTimeout(() => void this.start(), this.delayMs);
          this.timer.unref();
          if (!ready) this.delayMs = Math.min(this.delayMs * 2, MAX_RESTART_DELAY_MS);
        }
      });
    });
  }

  /** True while the reader runs. */
  get running(): boolean {
    return this.child !== undefined && this.child.exitCode === null;
  }

  close(): void {
    this.closed = true;
    if (this.timer) clearTimeout(this.timer);
    this.child?.kill('SIGTERM');
    this.child = undefined;
  }
}
