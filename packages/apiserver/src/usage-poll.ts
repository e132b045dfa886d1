// Measured use of the nodes, for placement: every few seconds each ready node reports what its
// sandboxes use together (NodeUsageReport) and the registry keeps it (NodeRegistry.setUsage). A
// node that does not answer (or an older edge without the call) keeps its last report; until it
// has one, placement counts each of its sandboxes at the idle estimate.
import type { NodeRegistry } from './nodes.js';

/** Interval of the usage reports (ms). */
export const DEFAULT_USAGE_INTERVAL_MS = 2000;

/** Polls every ready node's usage until the returned stop is called. */
export function startUsagePoll(nodes: NodeRegistry, intervalMs = DEFAULT_USAGE_INTERVAL_MS): () => void {
  let running = false;
  const poll = async (): Promise<void> => {
    if (running) return;
    running = true;
    try {
      await Promise.all(
        nodes
          .all()
          .filter((n) => n.state === 'ready')
          .map(async (n) => {
            const signal = AbortSignal.timeout(intervalMs * 2);
            const report = await n.client.usage({ signal }).catch(() => undefined);
            if (report) nodes.setUsage(n.name, report);
          }),
      );
    } finally {
      running = false;
    }
  };
  void poll();
  const timer = setInterval(() => void poll(), intervalMs);
  timer.unref();
  return () => clearInterval(timer);
}
