// Prometheus text-format metrics of the API, the control plane, the node and the watcher.
import os from 'node:os';
import { monitorEventLoopDelay } from 'node:perf_hooks';
import { SandboxStateSchema } from '@dsec/protocol';
import { DENIAL_KINDS } from '@dsec/watcher';
import type { AdmissionQueue } from './admission.js';
import { CPU_MODES, readMachineUse } from './machine-use.js';
import type { NodeRegistry } from './nodes.js';
import type { PlatformCounters } from './services/common.js';
import type { WatchService } from './watch.js';

/** The event loop delay's window restarts at most this often (ms). */
const LOOP_DELAY_WINDOW_MS = 60_000;
const BUCKETS_MS = [1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 5000];
/** Buckets of the exec latency histogram (a `true` takes about a millisecond). */
const EXEC_BUCKETS_MS = [0.5, 1, 2, 5, 10, 25, 50, 100, 250, 1000, 10_000, 60_000];

/** What the control plane's metrics are read from. */
export interface ControlPlaneGauges {
  counters: PlatformCounters;
  admission: AdmissionQueue;
  nodes: NodeRegistry;
}

/** Counters and latency histograms, rendered on GET /metrics. */
export class Metrics {
  execs = 0;
  calls = 0;
  private readonly requests = new Map<string, number>();
  private readonly latency = new Map<string, { buckets: number[]; sum: number; count: number }>();
  private readonly execLatency = { buckets: EXEC_BUCKETS_MS.map(() => 0), sum: 0, count: 0 };
  /** Things removed by the watcher's garbage collection, read at render time. */
  garbageCollected: () => number = () => 0;
  /**
   * The event loop's delays (10 ms resolution), from the first render on, over a window reset
   * at most once a minute (not at each render: several scrapers each see the whole window).
   */
  private readonly loopDelay = monitorEventLoopDelay({ resolution: 10 });
  private loopDelayOn = false;
  private loopDelaySince = 0;

  constructor(
    private readonly cp?: ControlPlaneGauges,
    private readonly watch?: WatchService,
  ) {}

  /** Records one command run to completion through the API (its round trip in edge). */
  observeExec(ms: number): void {
    this.execs++;
    EXEC_BUCKETS_MS.forEach((b, i) => {
      if (ms <= b) this.execLatency.buckets[i]!++;
    });
    this.execLatency.sum += ms;
    this.execLatency.count++;
  }

  /** Records one HTTP request. */
  observeRequest(method: string, route: string, status: number, ms: number): void {
    const key = `method="${method}",route="${route}",status="${status}"`;
    this.requests.set(key, (this.requests.get(key) ?? 0) + 1);
    const lkey = `method="${method}",route="${route}"`;
    let h = this.latency.get(lkey);
    if (!h) this.latency.set(lkey, (h = { buckets: BUCKETS_MS.map(() => 0), sum: 0, count: 0 }));
    BUCKETS_MS.forEach((b, i) => {
      if (ms <= b) h.buckets[i]!++;
    });
    h.sum += ms;
    h.count++;
  }

  /** The text exposition. */
  async render(): Promise<string> {
    const out: string[] = this.processLines();
    out.push('# HELP dsec_http_requests_total HTTP requests by route and status.', '# TYPE dsec_http_requests_total counter');
    for (const [k, v] of this.requests) out.push(`dsec_http_requests_total{${k}} ${v}`);
    out.push('# HELP dsec_http_request_duration_ms HTTP request latency.', '# TYPE dsec_http_request_duration_ms histogram');
    for (const [k, h] of this.latency) {
      BUCKETS_MS.forEach((b, i) => out.push(`dsec_http_request_duration_ms_bucket{${k},le="${b}"} ${h.buckets[i]}`));
      out.push(`dsec_http_request_duration_ms_bucket{${k},le="+Inf"} ${h.count}`);
      out.push(`dsec_http_request_duration_ms_sum{${k}} ${h.sum.toFixed(3)}`, `dsec_http_request_duration_ms_count{${k}} ${h.count}`);
    }
    out.push('# HELP dsec_execs_total Commands run through the API.', '# TYPE dsec_execs_total counter', `dsec_execs_total ${this.execs}`);
    out.push('# HELP dsec_exec_duration_ms Time from start to exit of commands run to completion (plain exec).', '# TYPE dsec_exec_duration_ms histogram');
    EXEC_BUCKETS_MS.forEach((b, i) => out.push(`dsec_exec_duration_ms_bucket{le="${b}"} ${this.execLatency.buckets[i]}`));
    out.push(`dsec_exec_duration_ms_bucket{le="+Inf"} ${this.execLatency.count}`);
    out.push(`dsec_exec_duration_ms_sum ${this.execLatency.sum.toFixed(3)}`, `dsec_exec_duration_ms_count ${this.execLatency.count}`);
    out.push('# HELP dsec_calls_total Function calls run through the API.', '# TYPE dsec_calls_total counter', `dsec_calls_total ${this.calls}`);
    if (this.cp) {
      const c = this.cp.counters;
      out.push('# TYPE dsec_sandboxes_created_total counter', `dsec_sandboxes_created_total ${c.sandboxesCreated}`);
      out.push('# TYPE dsec_sandbox_create_failures_total counter', `dsec_sandbox_create_failures_total ${c.sandboxCreateFailures}`);
      out.push('# TYPE dsec_sandboxes_destroyed_total counter', `dsec_sandboxes_destroyed_total ${c.sandboxesDestroyed}`);
      out.push('# TYPE dsec_sandboxes_expired_total counter', `dsec_sandboxes_expired_total ${c.sandboxesExpired}`);
      out.push('# TYPE dsec_sandboxes_paused_total counter', `dsec_sandboxes_paused_total ${c.sandboxesPaused}`);
      out.push('# TYPE dsec_sandboxes_resumed_total counter', `dsec_sandboxes_resumed_total ${c.sandboxesResumed}`);
      out.push(
        '# HELP dsec_pool_claims_total Creates answered by a warm pool.',
        '# TYPE dsec_pool_claims_total counter',
        `dsec_pool_claims_total ${c.poolClaims}`,
      );
      out.push(
        '# HELP dsec_idempotent_replays_total Creates answered by an earlier request with the same idempotency key.',
        '# TYPE dsec_idempotent_replays_total counter',
        `dsec_idempotent_replays_total ${c.idempotentReplays}`,
      );
      const a = this.cp.admission;
      out.push(
        '# HELP dsec_admission_waiting Creates waiting for quota or capacity.',
        '# TYPE dsec_admission_waiting gauge',
        `dsec_admission_waiting ${a.waiting()}`,
      );
      out.push('# TYPE dsec_admission_waits_total counter', `dsec_admission_waits_total ${a.counters.waited}`);
      out.push('# TYPE dsec_admission_timeouts_total counter', `dsec_admission_timeouts_total ${a.counters.timedOut}`);
      out.push('# TYPE dsec_admission_cancelled_total counter', `dsec_admission_cancelled_total ${a.counters.cancelled}`);
      out.push('# TYPE dsec_admission_queue_full_total counter', `dsec_admission_queue_full_total ${a.counters.queueFull}`);
      out.push('# HELP dsec_node_sandboxes Sandboxes allocated per node.', '# TYPE dsec_node_sandboxes gauge');
      for (const n of this.cp.nodes.all()) {
        out.push(`dsec_node_sandboxes{node="${n.name}"} ${n.allocated.sandboxes}`);
        out.push(`dsec_node_cpu_allocated{node="${n.name}"} ${n.allocated.cpu}`);
        out.push(`dsec_node_memory_allocated_mib{node="${n.name}"} ${n.allocated.memoryMiB}`);
        out.push(`dsec_node_healthy{node="${n.name}"} ${n.healthy ? 1 : 0}`);
      }
      out.push(...(await nodeMetrics(this.cp.nodes.all()[0]?.name ?? os.hostname())));
    }
    if (this.watch) out.push(...(await this.watchMetrics(this.watch)));
    return out.join('\n') + '\n';
  }

  /**
   * This process: resident memory, CPU time, the V8 heap (used and reserved: their gap is what the
   * garbage collector has not yet given back), memory outside it, and the event loop's delay
   * over its window (what a request waits before its handler runs).
   */
  private processLines(): string[] {
    // Sampled only once something scrapes (its timer does not keep the process alive).
    if (!this.loopDelayOn) this.loopDelayOn = this.loopDelay.enable();
    const mem = process.memoryUsage();
    const cpu = process.cpuUsage();
    const delay = this.loopDelay.count > 0 ? this.loopDelay.percentile(99) / 1e9 : 0;
    const max = this.loopDelay.count > 0 ? this.loopDelay.max / 1e9 : 0;
    if (Date.now() - this.loopDelaySince >= LOOP_DELAY_WINDOW_MS) {
      this.loopDelay.reset();
      this.loopDelaySince = Date.now();
    }
    return [
      '# HELP process_resident_memory_bytes Resident memory of this process.',
      '# TYPE process_resident_memory_bytes gauge',
      `process_resident_memory_bytes ${mem.rss}`,
      '# HELP process_cpu_seconds_total CPU time of this process (user and system).',
      '# TYPE process_cpu_seconds_total counter',
      `process_cpu_seconds_total ${((cpu.user + cpu.system) / 1e6).toFixed(3)}`,
      '# HELP nodejs_heap_used_bytes V8 heap in use (live objects and garbage not yet collected).',
      '# TYPE nodejs_heap_used_bytes gauge',
      `nodejs_heap_used_bytes ${mem.heapUsed}`,
      '# HELP nodejs_heap_total_bytes V8 heap reserved.',
      '# TYPE nodejs_heap_total_bytes gauge',
      `nodejs_heap_total_bytes ${mem.heapTotal}`,
      '# HELP nodejs_external_memory_bytes Memory outside the V8 heap held by JavaScript objects (buffers included).',
      '# TYPE nodejs_external_memory_bytes gauge',
      `nodejs_external_memory_bytes ${mem.external}`,
      '# HELP nodejs_eventloop_delay_seconds Event loop delay over the current window (p99 and max; the window restarts at most once a minute).',
      '# TYPE nodejs_eventloop_delay_seconds gauge',
      `nodejs_eventloop_delay_seconds{quantile="0.99"} ${delay.toFixed(4)}`,
      `nodejs_eventloop_delay_seconds{quantile="1"} ${max.toFixed(4)}`,
    ];
  }

  private async watchMetrics(w: WatchService): Promise<string[]> {
    const out: string[] = [];
    const byState = await w.store.sandboxesByState();
    out.push('# HELP dsec_sandboxes Sandboxes by lifecycle state.', '# TYPE dsec_sandboxes gauge');
    for (const state of new Set([...SandboxStateSchema.options, 'stopping', ...byState.keys()]))
      out.push(`dsec_sandboxes{state="${state}"} ${byState.get(state) ?? 0}`);
    out.push('# HELP dsec_events_total Events stored, by kind and severity.', '# TYPE dsec_events_total counter');
    const denials = new Map<string, number>();
    for (const [key, n] of w.events.counts) {
      const [kind, severity] = key.split('|') as [string, string];
      out.push(`dsec_events_total{kind="${kind}",severity="${severity}"} ${n}`);
      if (DENIAL_KINDS.has(kind as never)) denials.set(kind, (denials.get(kind) ?? 0) + n);
    }
    out.push('# HELP dsec_denials_total Refusals of what a sandbox tried, by event kind.', '# TYPE dsec_denials_total counter');
    for (const kind of DENIAL_KINDS) out.push(`dsec_denials_total{kind="${kind}"} ${denials.get(kind) ?? 0}`);
    out.push('# HELP dsec_events_suppressed_total Events dropped by suppress rules, by kind.', '# TYPE dsec_events_suppressed_total counter');
    for (const [kind, n] of w.events.suppressedByRule) out.push(`dsec_events_suppressed_total{kind="${kind}"} ${n}`);
    out.push('# TYPE dsec_events_rate_limited_total counter', `dsec_events_rate_limited_total ${w.events.rateLimited}`);
    out.push('# TYPE dsec_events_dropped_total counter', `dsec_events_dropped_total ${w.events.dropped}`);
    out.push('# TYPE dsec_event_subscribers gauge', `dsec_event_subscribers ${w.events.subscriberCount}`);
    out.push('# TYPE dsec_audit_entries_total counter', `dsec_audit_entries_total ${w.audit.recorded}`);
    out.push('# TYPE dsec_audit_dropped_total counter', `dsec_audit_dropped_total ${w.audit.dropped}`);
    out.push('# TYPE dsec_rules gauge', `dsec_rules ${w.rules.size}`);
    out.push(
      '# HELP dsec_garbage_collected_total Leftovers of unknown sandboxes removed (containers, cgroups, mounts, folders).',
      '# TYPE dsec_garbage_collected_total counter',
    );
    out.push(`dsec_garbage_collected_total ${this.garbageCollected()}`);
    return out;
  }
}

/** CPU time and memory of the machine, from /proc (the node in the single-node form). */
async function nodeMetrics(node: string): Promise<string[]> {
  const out: string[] = [];
  const use = await readMachineUse();
  if (use.cpuSeconds.length > 0) {
    out.push('# HELP dsec_node_cpu_seconds_total CPU time of the node by mode.', '# TYPE dsec_node_cpu_seconds_total counter');
    CPU_MODES.forEach((m, i) => out.push(`dsec_node_cpu_seconds_total{node="${node}",mode="${m}"} ${(use.cpuSeconds[i] ?? 0).toFixed(2)}`));
  }
  out.push('# TYPE dsec_node_cpus gauge', `dsec_node_cpus{node="${node}"} ${os.cpus().length}`);
  out.push('# TYPE dsec_node_load1 gauge', `dsec_node_load1{node="${node}"} ${os.loadavg()[0]!.toFixed(2)}`);
  out.push('# TYPE dsec_node_memory_total_bytes gauge', `dsec_node_memory_total_bytes{node="${node}"} ${use.memoryTotalBytes}`);
  out.push('# TYPE dsec_node_memory_available_bytes gauge', `dsec_node_memory_available_bytes{node="${node}"} ${use.memoryAvailableBytes}`);
  return out;
}
