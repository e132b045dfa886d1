// The nodes the control plane can place sandboxes on, each reached through an EdgeClient (the
// in-process edge, or one across the network: the registry cannot tell).
import type { EdgeClient } from '@dsec/protocol';
import type { NodeView } from './scheduler.js';

/** A node as the control plane tracks it. */
export interface NodeEntry extends NodeView {
  client: EdgeClient;
}

/** Registry of nodes with their allocation (requested CPU and memory of their sandboxes). */
export class NodeRegistry {
  private readonly nodes = new Map<string, NodeEntry>();

  /** Adds a node. */
  add(client: EdgeClient): NodeEntry {
    const cap = client.capacity();
    const entry: NodeEntry = {
      name: client.nodeName,
      healthy: true,
      backends: cap.backends,
      capacity: { cpu: cap.cpu, memoryMiB: cap.memoryMiB, sandboxes: cap.sandboxes },
      allocated: { cpu: 0, memoryMiB: 0, sandboxes: 0 },
      client,
    };
    this.nodes.set(entry.name, entry);
    return entry;
  }

  /** Every node. */
  all(): NodeEntry[] {
    return [...this.nodes.values()];
  }

  /** A node by name. */
  get(name: string): NodeEntry | undefined {
    return this.nodes.get(name);
  }

  /** Adds (or with a negative sign removes) one sandbox's requests to a node's allocation. */
  charge(name: string, cpu: number, memoryMiB: number, sign: 1 | -1): void {
    const n = this.nodes.get(name);
    if (!n) return;
    n.allocated.cpu = Math.max(0, n.allocated.cpu + sign * cpu);
    n.allocated.memoryMiB = Math.max(0, n.allocated.memoryMiB + sign * memoryMiB);
    n.allocated.sandboxes = Math.max(0, n.allocated.sandboxes + sign);
  }

  /**
   * Adds (or removes) CPU alone: a paused sandbox gives its CPU back to the node and keeps its
   * memory and its place in the sandbox count.
   */
  chargeCpu(name: string, cpu: number, sign: 1 | -1): void {
    const n = this.nodes.get(name);
    if (n) n.allocated.cpu = Math.max(0, n.allocated.cpu + sign * cpu);
  }

  /** Marks a node healthy or not (the watcher's verdict). */
  setHealthy(name: string, healthy: boolean): void {
    const n = this.nodes.get(name);
    if (n) n.healthy = healthy;
  }
}
