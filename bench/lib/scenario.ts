// What every scenario gets and gives.
import type { BenchPlatform, PreloadedLayer } from './platform.js';
import type { Peers } from './peers.js';
import type { Row } from './report.js';

/** Shared state of one run, handed to each scenario. */
export interface ScenarioContext {
  /** Small sizes for CI (seconds, not minutes). */
  quick: boolean;
  /** Idle sandboxes the density scenario fills the node with. */
  density: number;
  bench: BenchPlatform;
  peers: Peers;
  /** The run's temp dir (/tmp/dsec-bench-*), removed at the end. */
  dir: string;
  /** Persistent cache across runs (built layers, downloaded packages). */
  cacheDir: string;
  record(row: Row): void;
  /** A line for this scenario's section of the report. */
  note(text: string): void;
}

/** One benchmark scenario. */
export interface Scenario {
  name: string;
  title: string;
  /** How it measures (markdown), for the report. */
  method: string;
  /** Runs only when named (`--only`), never in `--quick` runs or the full run (it needs the public registry once, and minutes). */
  onlyWhenNamed?: boolean;
  /** Prepares what must exist before the platform starts: layers to copy into its store. */
  prepare?(opts: { cacheDir: string; quick: boolean }): Promise<PreloadedLayer[]>;
  run(ctx: ScenarioContext): Promise<void>;
}
