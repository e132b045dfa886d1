// Services over a real in-memory SQLite store and a fake node, for unit tests.
import Database from 'better-sqlite3';
import type { EventSink, RaisedEvent } from '@dsec/protocol';
import { Authenticator } from '../auth.js';
import type { Principal } from '../auth.js';
import { PUBLIC_PROJECT_ID, ROOT_PROJECT_ID, StateStore } from '../db/store.js';
import { NodeRegistry } from '../nodes.js';
import { Placement } from '../scheduler.js';
import { createServices } from '../services/index.js';
import type { ServiceDeps, Services } from '../services/index.js';
import { FakeEdge, fakeLayer } from './fake-edge.js';

/** Services ready to use: a node, the public busybox base, an admin key. */
export interface Harness {
  services: Services;
  store: StateStore;
  edge: FakeEdge;
  /** The node registry the fake node is in (its charges). */
  nodes: NodeRegistry;
  /** The admin key's secret (for HTTP tests). */
  adminKey: string;
  admin: Principal;
  /** Events the services raised. */
  raised: RaisedEvent[];
  logged: string[];
  close(): Promise<void>;
}

/** Builds a harness; `deps` adds or replaces what the services are built from. */
export async function harness(deps: Partial<Omit<ServiceDeps, 'store' | 'auth' | 'nodes'>> = {}): Promise<Harness> {
  const store = await StateStore.openSqlite(new Database(':memory:'));
  const auth = new Authenticator(store);
  const nodes = new NodeRegistry();
  const edge = new FakeEdge();
  nodes.add(edge);
  const raised: RaisedEvent[] = [];
  const logged: string[] = [];
  const raise: EventSink = (ev) => void raised.push(ev);
  const services = createServices({ store, auth, nodes, placement: new Placement(), raise, log: (l) => void logged.push(l), ...deps });
  const base = fakeLayer('busybox');
  edge.layerInfos.set(base.digest, base);
  await services.layers.register(PUBLIC_PROJECT_ID, base, 'busybox');
  const key = await services.iam.issueKey(ROOT_PROJECT_ID, 'admin', 'admin');
  const adminKey = key.key ?? '';
  const admin = await auth.authenticate(`Bearer ${adminKey}`);
  return {
    services,
    store,
    edge,
    nodes,
    adminKey,
    admin,
    raised,
    logged,
    async close() {
      await services.poolManager.stop();
      services.admission.close();
      await services.trajectory.close();
      await store.close();
    },
  };
}

/** Reads the lines of a response body as they come (ndjson, or the lines of an SSE stream). */
export function responseLines(res: Response): AsyncGenerator<string> {
  if (!res.body) throw new Error(`a response without a body (${res.status})`);
  const reader = (res.body as ReadableStream<Uint8Array>).getReader();
  const decoder = new TextDecoder();
  let buf = '';
  return (async function* () {
    try {
      for (;;) {
        let nl = buf.indexOf('\n');
        while (nl >= 0) {
          yield buf.slice(0, nl);
          buf = buf.slice(nl + 1);
          nl = buf.indexOf('\n');
        }
        const { done, value } = await reader.read();
        if (done) return;
        buf += decoder.decode(value, { stream: true });
      }
    } finally {
      await reader.cancel().catch(() => undefined);
    }
  })();
}
