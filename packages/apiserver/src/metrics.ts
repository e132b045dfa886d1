// Prometheus text-format metrics of the API and the control plane.
import type { ControlPlane } from './control-plane.js';

const BUCKETS_MS = [1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 5000];

/** Counters and latency histograms, rendered on GET /metrics. */
export class Metrics {
  execs = 0;
  calls = 0;
  private readonly requests = new Map<string, number>();
  private readonly latency = new Map<string, { buckets: number[]; sum: number; count: number }>();

  constructor(private readonly cp?: ControlPlane) {}

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
  render(): string {
    const out: string[] = [];
    out.push('# HELP dsec_http_requests_total HTTP requests by route and status.', '# TYPE dsec_http_requests_total counter');
    for (const [k, v] of this.requests) out.push(`dsec_http_requests_total{${k}} ${v}`);
    out.push('# HELP dsec_http_request_duration_ms HTTP request latency.', '# TYPE dsec_http_request_duration_ms histogram');
    for (const [k, h] of this.latency) {
      BUCKETS_MS.forEach((b, i) => out.push(`dsec_http_request_duration_ms_bucket{${k},le="${b}"} ${h.buckets[i]}`));
      out.push(`dsec_http_request_duration_ms_bucket{${k},le="+Inf"} ${h.count}`);
      out.push(`dsec_http_request_duration_ms_sum{${k}} ${h.sum.toFixed(3)}`, `dsec_http_request_duration_ms_count{${k}} ${h.count}`);
    }
    out.push('# HELP dsec_execs_total Commands run through the API.', '# TYPE dsec_execs_total counter', `dsec_execs_total ${this.execs}`);
    out.push('# HELP dsec_calls_total Function calls run through the API.', '# TYPE dsec_calls_total counter', `dsec_calls_total ${this.calls}`);
    if (this.cp) {
      const c = this.cp.counters;
      out.push('# TYPE dsec_sandboxes_created_total counter', `dsec_sandboxes_created_total ${c.sandboxesCreated}`);
      out.push('# TYPE dsec_sandbox_create_failures_total counter', `dsec_sandbox_create_failures_total ${c.sandboxCreateFailures}`);
      out.push('# TYPE dsec_sandboxes_destroyed_total counter', `dsec_sandboxes_destroyed_total ${c.sandboxesDestroyed}`);
      out.push('# TYPE dsec_sandboxes_expired_total counter', `dsec_sandboxes_expired_total ${c.sandboxesExpired}`);
      out.push('# HELP dsec_pool_claims_total Creates answered by a warm pool.', '# TYPE dsec_pool_claims_total counter', `dsec_pool_claims_total ${c.poolClaims}`);
      out.push('# HELP dsec_idempotent_replays_total Creates answered by an earlier request with the same idempotency key.', '# TYPE dsec_idempotent_replays_total counter', `dsec_idempotent_replays_total ${c.idempotentReplays}`);
      const a = this.cp.admission;
      out.push('# HELP dsec_admission_waiting Creates waiting for quota or capacity.', '# TYPE dsec_admission_waiting gauge', `dsec_admission_waiting ${a.waiting()}`);
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
    }
    return out.join('\n') + '\n';
  }
}
