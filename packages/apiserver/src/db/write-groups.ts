// Writes grouped by key: every request made while the previous group of its key is being
// written (or in the same turn of the event loop) goes into the next group, which one call of
// the writer handles (one transaction, a few statements) and answers item by item. The create
// path's sandbox rows (SandboxInserts), `creating -> running` updates and the quota reservations
// of concurrent creates go through this: a store round trip per group instead of one (or four)
// per create.

/** Writes a group and gives each item its result, in order (an Error instance fails that item alone). */
export type GroupWriter<T, R> = (key: string, items: readonly T[]) => Promise<Array<R | Error>>;

interface Pending<T, R> {
  item: T;
  resolve: (r: R) => void;
  reject: (err: unknown) => void;
}

interface Lane<T, R> {
  queue: Array<Pending<T, R>>;
  writing: boolean;
  scheduled: boolean;
}

/** Groups requests of the same key into one write (one writer at a time per key). */
export class WriteGroups<T, R> {
  private readonly lanes = new Map<string, Lane<T, R>>();
  /** Groups written and items in them (for tests and reports). */
  readonly written = { groups: 0, items: 0 };

  constructor(
    private readonly writer: GroupWriter<T, R>,
    /** Items per call of the writer at most. */
    private readonly maxGroup = 500,
    /**
     * Groups of one key may be written at once: a group is what arrived in one turn of the event
     * loop, and it does not wait for the group before it (calls whose latency is their own, as a
     * node's creates, rather than a store's writes that queue behind each other anyway).
     */
    private readonly overlap = false,
  ) {}

  /** Queues an item under `key`; settles with its own result once its group is written. */
  submit(key: string, item: T): Promise<R> {
    return new Promise<R>((resolve, reject) => {
      let lane = this.lanes.get(key);
      if (!lane) this.lanes.set(key, (lane = { queue: [], writing: false, scheduled: false }));
      lane.queue.push({ item, resolve, reject });
      this.schedule(key, lane);
    });
  }

  private schedule(key: string, lane: Lane<T, R>): void {
    if ((lane.writing && !this.overlap) || lane.scheduled) return;
    lane.scheduled = true;
    // The rest of this turn's requests (a batch's items started together) join the group.
    setImmediate(() => {
      lane.scheduled = false;
      if (this.overlap) void this.flush(key, lane);
      else void this.drain(key, lane);
    });
  }

  /** Overlapping groups: writes what is queued now, without waiting for groups in flight. */
  private async flush(key: string, lane: Lane<T, R>): Promise<void> {
    const groups: Array<Array<Pending<T, R>>> = [];
    while (lane.queue.length > 0) groups.push(lane.queue.splice(0, this.maxGroup));
    if (this.lanes.get(key) === lane) this.lanes.delete(key);
    await Promise.all(groups.map((g) => this.write(key, g)));
  }

  /** Writes one group and settles each of its items. */
  private async write(key: string, group: Array<Pending<T, R>>): Promise<void> {
    try {
      const out = await this.writer(
        key,
        group.map((p) => p.item),
      );
      this.written.groups++;
      this.written.items += group.length;
      for (const [i, p] of group.entries()) {
        const r = out[i];
        if (r instanceof Error) p.reject(r);
        else p.resolve(r as R);
      }
    } catch (err) {
      for (const p of group) p.reject(err);
    }
  }

  private async drain(key: string, lane: Lane<T, R>): Promise<void> {
    lane.writing = true;
    try {
      while (lane.queue.length > 0) await this.write(key, lane.queue.splice(0, this.maxGroup));
    } finally {
      lane.writing = false;
      if (lane.queue.length === 0) this.lanes.delete(key);
      else this.schedule(key, lane);
    }
  }
}
