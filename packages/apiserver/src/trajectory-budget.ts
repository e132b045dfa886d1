// Trajectory byte budgets (issue 13 §3): what the trajectories of one tenant (a top-level
// project with its sub-projects) may keep, and what all of them together may. Before a batch of
// steps is written, its growth is admitted here: past a budget, finished sandboxes'
// trajectories are evicted first (oldest end first: the tenant's own for its budget, anyone's
// for the platform's ceiling); what still does not fit cuts the growing live trajectories
// (largest growth first): their steps of this batch are not written, nothing more is recorded
// for them, and a replay of them is refused with TRAJECTORY_TRUNCATED.
import type { StateStore } from './db/store.js';

/** How often the counters are read again from the store (replicas write beside this process; pruning). */
const RELOAD_INTERVAL_MS = 60_000;

/** What {@link TrajectoryBudget} needs. */
export interface TrajectoryBudgetOptions {
  /** Bytes one tenant's trajectories may keep (`limits.trajectoryBytesPerTenant`). */
  bytesPerTenant: number;
  /** Bytes every tenant's trajectories together may keep (`limits.trajectoryBytesTotal`). */
  bytesTotal: number;
  /** The tenant of a project. */
  tenantOf: (projectId: string) => Promise<string>;
  /** Every project of a tenant. */
  tenantProjects: (tenantId: string) => Promise<Set<string>>;
  log?: (line: string) => void;
}

/** One trajectory's growth in a batch about to be written. */
export interface TrajectoryGrowth {
  sandboxId: string;
  projectId: string;
  /** Stored bytes the batch adds (negative: frees). */
  delta: number;
}

/** The byte budgets of every tenant's trajectories, counted in memory and kept from the store. */
export class TrajectoryBudget {
  private readonly tenantBytes = new Map<string, number>();
  private readonly tenants = new Map<string, string>();
  private total = 0;
  private loadedAt = -Infinity;

  constructor(
    private readonly store: StateStore,
    private readonly o: TrajectoryBudgetOptions,
  ) {}

  /** Reads the counters again at the next admission (after a prune, a failed write). */
  forget(): void {
    this.loadedAt = -Infinity;
  }

  private async tenantOf(projectId: string): Promise<string> {
    let t = this.tenants.get(projectId);
    if (t === undefined) {
      t = await this.o.tenantOf(projectId);
      this.tenants.set(projectId, t);
    }
    return t;
  }

  private async load(): Promise<void> {
    if (Date.now() - this.loadedAt < RELOAD_INTERVAL_MS) return;
    this.tenantBytes.clear();
    this.total = 0;
    for (const { projectId, bytes } of await this.store.trajectoryBytesByProject()) {
      const t = await this.tenantOf(projectId);
      this.tenantBytes.set(t, (this.tenantBytes.get(t) ?? 0) + bytes);
      this.total += bytes;
    }
    this.loadedAt = Date.now();
  }

  private evicted(gone: Array<{ projectId: string; bytes: number }>, tenantOfGone: Map<string, string>): number {
    let freed = 0;
    for (const g of gone) {
      const t = tenantOfGone.get(g.projectId);
      if (t !== undefined) this.tenantBytes.set(t, (this.tenantBytes.get(t) ?? 0) - g.bytes);
      this.total -= g.bytes;
      freed += g.bytes;
    }
    return freed;
  }

  /**
   * Admits a batch's growth: evicts finished trajectories where a budget needs room, and
   * returns the live trajectories to cut (their growth is not counted). The rest is counted.
   */
  async admit(growth: readonly TrajectoryGrowth[]): Promise<Set<string>> {
    const cut = new Set<string>();
    if (!growth.some((g) => g.delta > 0)) {
      for (const g of growth) await this.count(g);
      return cut;
    }
    await this.load();
    const inBatch = new Set(growth.map((g) => g.sandboxId));
    const byTenant = new Map<string, TrajectoryGrowth[]>();
    for (const g of growth) {
      const t = await this.tenantOf(g.projectId);
      byTenant.set(t, [...(byTenant.get(t) ?? []), g]);
    }
    const sum = (gs: readonly TrajectoryGrowth[]): number => gs.filter((g) => !cut.has(g.sandboxId)).reduce((a, g) => a + g.delta, 0);
    const cutUntil = (gs: readonly TrajectoryGrowth[], over: () => number): void => {
      for (const g of [...gs].filter((x) => x.delta > 0).sort((a, b) => b.delta - a.delta)) {
        if (over() <= 0) return;
        cut.add(g.sandboxId);
      }
    };
    // Each tenant within its own budget: its own finished trajectories go first.
    for (const [t, gs] of byTenant) {
      const over = (): number => (this.tenantBytes.get(t) ?? 0) + sum(gs) - this.o.bytesPerTenant;
      if (over() <= 0) continue;
      const projects = await this.o.tenantProjects(t);
      const gone = await this.store.evictFinishedTrajectories([...projects], over(), inBatch);
      this.evicted(gone, new Map(gone.map((g) => [g.projectId, t])));
      if (over() > 0) cutUntil(gs, over);
    }
    // Everyone within the platform's ceiling: anyone's finished trajectories go first.
    const overAll = (): number => this.total + sum(growth) - this.o.bytesTotal;
    if (overAll() > 0) {
      const gone = await this.store.evictFinishedTrajectories(null, overAll(), inBatch);
      const owners = new Map<string, string>();
      for (const g of gone) owners.set(g.projectId, await this.tenantOf(g.projectId));
      this.evicted(gone, owners);
      if (overAll() > 0) cutUntil(growth, overAll);
    }
    for (const g of growth) if (!cut.has(g.sandboxId)) await this.count(g);
    if (cut.size > 0) this.o.log?.(`trajectory: byte budget reached: recording stopped for ${[...cut].join(', ')}`);
    return cut;
  }

  private async count(g: TrajectoryGrowth): Promise<void> {
    if (g.delta === 0) return;
    const t = await this.tenantOf(g.projectId);
    this.tenantBytes.set(t, (this.tenantBytes.get(t) ?? 0) + g.delta);
    this.total += g.delta;
  }
}
