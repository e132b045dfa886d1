// Host uid/gid ranges for sandboxes in user namespaces. Each sandbox gets 65,536 ids of its own
// (0 inside is the range's first id on the host), so root in one sandbox is an unprivileged uid
// on the host and never shares an id with another sandbox. Ranges are claimed host-wide, one file
// per range under /run/dsec/idmap created with O_EXCL, so several edges on one host (tests, a
// second state directory) never hand out the same range, and a restarted edge keeps the ranges
// of the sandboxes it adopts. /run is cleared at boot, when no sandbox survives anyway.
import { mkdir, open, readFile, readdir, unlink } from 'node:fs/promises';
import path from 'node:path';
import { DsecError } from '@dsec/protocol';

/** First host id handed to sandboxes: far above login users and /etc/subuid's usual ranges. */
export const ID_RANGE_START = 0x4000_0000;
/** Ids per sandbox (0..65535 inside). */
export const ID_RANGE_SIZE = 65_536;
/** Ranges that fit below 2^32 - 1 (the invalid id). */
export const ID_RANGE_SLOTS = Math.floor((2 ** 32 - 1 - ID_RANGE_START) / ID_RANGE_SIZE);
/** Where the claims live. */
export const DEFAULT_ID_RANGE_DIR = '/run/dsec/idmap';

/** Host ids that ids 0..size-1 of a sandbox map to. */
export interface IdRange {
  /** Host uid of the sandbox's root. */
  uid: number;
  /** Host gid of the sandbox's root group. */
  gid: number;
  /** Ids mapped. */
  size: number;
}

/** The slot of a host uid inside the sandbox ranges, or undefined when it is in none. */
export function slotOfHostId(hostId: number): number | undefined {
  if (hostId < ID_RANGE_START) return undefined;
  const slot = Math.floor((hostId - ID_RANGE_START) / ID_RANGE_SIZE);
  return slot < ID_RANGE_SLOTS ? slot : undefined;
}

function rangeOf(slot: number): IdRange {
  const base = ID_RANGE_START + slot * ID_RANGE_SIZE;
  return { uid: base, gid: base, size: ID_RANGE_SIZE };
}

/** Host-wide allocator of sandbox id ranges; `owner` tells this node's claims from others'. */
export class IdRanges {
  private next = Math.floor(Math.random() * ID_RANGE_SLOTS);

  constructor(
    /** The node's state directory: written into each claim. */
    private readonly owner: string,
    private readonly dir: string = DEFAULT_ID_RANGE_DIR,
  ) {}

  /** Claims a free range for a sandbox. */
  async allocate(sandboxId: string): Promise<IdRange> {
    await mkdir(this.dir, { recursive: true, mode: 0o700 });
    for (let tried = 0; tried < ID_RANGE_SLOTS; tried++) {
      const slot = this.next;
      this.next = (this.next + 1) % ID_RANGE_SLOTS;
      try {
        const fh = await open(path.join(this.dir, String(slot)), 'wx', 0o600);
        try {
          await fh.writeFile(`${this.owner}\n${sandboxId}\n`);
        } finally {
          await fh.close();
        }
        return rangeOf(slot);
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
      }
    }
    throw new DsecError('CAPACITY_EXHAUSTED', 'no free uid range for a user namespace on this host', { retryAfterMs: 1000 });
  }

  /** Gives a range back (only when this node still holds it for that sandbox). */
  async release(range: IdRange, sandboxId: string): Promise<void> {
    const slot = slotOfHostId(range.uid);
    if (slot === undefined) return;
    const file = path.join(this.dir, String(slot));
    const claim = await readFile(file, 'utf8').catch(() => '');
    if (claim === `${this.owner}\n${sandboxId}\n`) await unlink(file).catch(() => undefined);
  }

  /** Releases this node's claims whose sandbox is not in `live` (after a crash or restart). */
  async reconcile(live: ReadonlySet<string>): Promise<void> {
    for (const name of await readdir(this.dir).catch(() => [] as string[])) {
      const file = path.join(this.dir, name);
      const [owner, id] = (await readFile(file, 'utf8').catch(() => '')).split('\n');
      if (owner === this.owner && id !== undefined && !live.has(id)) await unlink(file).catch(() => undefined);
    }
  }
}
