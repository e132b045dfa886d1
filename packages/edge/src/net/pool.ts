// Addresses of a node's sandboxes. Each edge home claims one slice of the pool (several homes on
// one machine, as in tests, must not share addresses: every sandbox has a host route); within
// it the first address is the gateway and each sandbox with a network gets one more.
import { access, mkdir, readFile, readdir, rename, rm, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { DsecError, ipv4ToInt, parseCidr } from '@dsec/protocol';
import { inRange } from './policy.js';
import type { Range } from './policy.js';

/** The default address pool of sandbox networks (private, rarely used elsewhere). */
export const DEFAULT_NETWORK_POOL = '10.213.0.0/16';
/** Default prefix length of one home's slice of the pool (4,093 sandboxes). */
export const DEFAULT_SLICE_PREFIX = 20;
/** Where homes record their slice claims, machine-wide. */
export const CLAIMS_DIR = '/run/dsec-net';

/** An IPv4 address from its number. */
export function intToIpv4(n: number): string {
  return [n >>> 24, (n >>> 16) & 255, (n >>> 8) & 255, n & 255].join('.');
}

/** One home's slice of the pool. */
export interface NetworkSlice {
  range: Range;
  /** The slice as `a.b.c.d/n`. */
  cidr: string;
  /** The node side of every sandbox's link; the egress proxy and DNS stub listen here. */
  gateway: string;
  /** Most sandboxes the slice holds. */
  slots: number;
  /** The address of slot `s` (1-based). */
  addressOf(slot: number): string;
}

function sliceOf(range: Range): NetworkSlice {
  const size = 2 ** (32 - range.prefix);
  return {
    range,
    cidr: `${intToIpv4(range.base)}/${range.prefix}`,
    gateway: intToIpv4(range.base + 1),
    // Not the network address, the gateway or the last address.
    slots: size - 3,
    addressOf: (slot) => intToIpv4(range.base + 1 + slot),
  };
}

const claimName = (r: Range): string => `${intToIpv4(r.base)}_${r.prefix}`;
const fromClaimName = (name: string): Range | undefined => parseCidr(name.replace('_', '/'));

function overlaps(a: Range, b: Range): boolean {
  const wider = a.prefix <= b.prefix ? a : b;
  const narrower = wider === a ? b : a;
  return inRange(narrower.base, wider);
}

/**
 * Claims a slice of `pool` for `home` (the one it already holds, if any). A claim whose home no
 * longer exists is stale: `purge(home)` removes what it left behind, then it is taken over.
 */
export async function claimSlice(home: string, pool: string, slicePrefix: number, purge: (staleHome: string) => Promise<void>): Promise<NetworkSlice> {
  const range = parseCidr(pool);
  if (!range) throw new DsecError('INVALID_ARGUMENT', `network pool ${pool} is not an IPv4 range`, { field: 'network.pool' });
  if (!(slicePrefix >= range.prefix && slicePrefix <= 29)) {
    throw new DsecError('INVALID_ARGUMENT', `network slice /${slicePrefix} does not fit the pool ${pool} (or is smaller than a /29)`, {
      field: 'network.slicePrefix',
    });
  }
  await mkdir(CLAIMS_DIR, { recursive: true, mode: 0o700 });
  const owner = async (dir: string): Promise<string | undefined> => readFile(path.join(dir, 'home'), 'utf8').catch(() => undefined);
  const claims = async (): Promise<Array<{ name: string; range: Range }>> =>
    (await readdir(CLAIMS_DIR)).map((name) => ({ name, range: fromClaimName(name) })).filter((c): c is { name: string; range: Range } => c.range !== undefined);

  for (const c of await claims()) {
    if ((await owner(path.join(CLAIMS_DIR, c.name))) === home && overlaps(c.range, range) && c.range.prefix === slicePrefix) return sliceOf(c.range);
  }
  const count = 2 ** (slicePrefix - range.prefix);
  for (let i = 0; i < count; i++) {
    const candidate: Range = { base: (range.base + i * 2 ** (32 - slicePrefix)) >>> 0, prefix: slicePrefix };
    const taken = (await claims()).filter((c) => overlaps(c.range, candidate));
    let free = true;
    for (const c of taken) {
      const dir = path.join(CLAIMS_DIR, c.name);
      const who = await owner(dir);
      const alive =
        who !== undefined &&
        (await access(who).then(
          () => true,
          () => false,
        ));
      if (alive) {
        free = false;
        continue;
      }
      // Stale: move it aside first (only one claimer wins the rename), then clean up after it.
      const aside = `${dir}.stale-${process.pid}-${Date.now()}`;
      if (
        !(await rename(dir, aside).then(
          () => true,
          () => false,
        ))
      ) {
        free = false;
        continue;
      }
      if (who !== undefined) await purge(who).catch(() => undefined);
      await rm(aside, { recursive: true, force: true });
    }
    if (!free) continue;
    const dir = path.join(CLAIMS_DIR, claimName(candidate));
    const tmp = `${dir}.new-${process.pid}-${Date.now()}`;
    await mkdir(tmp);
    await writeFile(path.join(tmp, 'home'), home);
    // rename(2) onto a missing name is atomic, and fails when another home got there first.
    if (
      await rename(tmp, dir).then(
        () => true,
        () => false,
      )
    ) {
      const mine = await owner(dir);
      if (mine === home) return sliceOf(candidate);
    }
    await rm(tmp, { recursive: true, force: true });
  }
  throw new DsecError('UNAVAILABLE', `no free slice /${slicePrefix} left in the network pool ${pool} on this machine`);
}

/** Gives a slice back (a home shutting down for good). */
export async function releaseSlice(home: string, slice: NetworkSlice): Promise<void> {
  const dir = path.join(CLAIMS_DIR, claimName(slice.range));
  if ((await readFile(path.join(dir, 'home'), 'utf8').catch(() => undefined)) === home) await rm(dir, { recursive: true, force: true });
}

/**
 * Slots of a slice, handed out round-robin: a freed address is reused as late as possible, so a
 * link the kernel is still tearing down never collides with a new one.
 */
export class SlotAllocator {
  private readonly used = new Set<number>();
  private next = 1;

  constructor(private readonly slots: number) {}

  /** Takes a free slot. */
  take(): number {
    if (this.used.size >= this.slots)
      throw new DsecError('CAPACITY_EXHAUSTED', `all ${this.slots} sandbox network addresses of this node are in use`, { retryAfterMs: 1000 });
    for (;;) {
      const slot = this.next;
      this.next = (this.next % this.slots) + 1;
      if (!this.used.has(slot)) {
        this.used.add(slot);
        return slot;
      }
    }
  }

  /** Marks a slot used (a sandbox found after a restart). */
  mark(slot: number): void {
    this.used.add(slot);
  }

  free(slot: number): void {
    this.used.delete(slot);
  }
}

/** The slot of an address in a slice, or undefined. */
export function slotOf(slice: NetworkSlice, address: string): number | undefined {
  const n = ipv4ToInt(address) - slice.range.base - 1;
  return n >= 1 && n <= slice.slots ? n : undefined;
}
