// `dsec apiserver --db postgres://...`: a stateless API replica. It holds no node of its own and
// keeps nothing that matters in memory: any number run at once on one PostgreSQL database and any
// of them serves any request. Nodes reach it by joining (remote edges) on its node port
// (`cluster.nodeAddr`; the cluster CA under `<home>/cluster/`, shared by replicas that share a
// home); until then it serves everything the store answers (projects, keys, lists, quotas,
// events) and refuses placement. A replica places only on the nodes whose sessions it holds.
import path from 'node:path';
import { makeCsr, makeKey, openssl } from '@dsec/edge';
import { DEFAULT_DSEC_ADDR, DEFAULT_DSEC_HOME, DsecError } from '@dsec/protocol';
import type { EdgeClient } from '@dsec/protocol';
import { parseAddr, startControlPlane } from './control-plane.js';
import type { ControlPlane, ControlPlaneOptions } from './control-plane.js';
import { isPostgresUrl } from './db/postgres.js';
import { StateStore } from './db/store.js';
import { startNodePort } from './cluster/node-port.js';
import type { ClusterOptions, NodePort } from './cluster/node-port.js';
import { NodeRegistry } from './nodes.js';

/** Options of {@link startApiserver}. */
export interface ReplicaOptions extends ControlPlaneOptions {
  /** PostgreSQL URL of the shared state store (required). */
  db: string;
  /** State directory (the first replica writes `admin.key` here). Default {@link DEFAULT_DSEC_HOME}. */
  home?: string;
  /** `host:port` to listen on. Default {@link DEFAULT_DSEC_ADDR}. */
  addr?: string;
  /** Where progress and errors go. Default: stderr. */
  log?: (line: string) => void;
  /** Nodes this replica reaches from the start (remote edges add themselves as they join). */
  nodes?: EdgeClient[];
  /** The node port remote edges join (none: no remote node) and the silence graces. */
  cluster?: ClusterOptions;
}

/** A running replica: the control plane, and the node port's URL when it takes nodes. */
export type Replica = ControlPlane & { nodeUrl?: string };

/** Starts an API replica on a shared PostgreSQL store. */
export async function startApiserver(opts: ReplicaOptions): Promise<Replica> {
  if (!isPostgresUrl(opts.db)) throw new DsecError('INVALID_ARGUMENT', 'db: dsec apiserver needs a postgres:// URL', { field: 'db' });
  const log = opts.log ?? ((line: string) => process.stderr.write(line + '\n'));
  const addr = opts.addr ?? DEFAULT_DSEC_ADDR;
  parseAddr(addr);
  const store = await StateStore.openPostgres(opts.db, { log });
  const nodes = new NodeRegistry();
  for (const n of opts.nodes ?? []) nodes.add(n);
  const home = path.resolve(opts.home ?? DEFAULT_DSEC_HOME);
  let nodePort: NodePort | undefined;
  const started = startControlPlane({
    ...opts,
    home,
    addr,
    log,
    store,
    nodes,
    listenUrl: opts.db,
    prepare: async (services, watch) => {
      nodePort = await startNodePort(opts.cluster, {
        home,
        certTools: { openssl, makeKey, makeCsr },
        nodes,
        nodeAdmin: services.nodeAdmin,
        ingest: watch.events.ingest,
        log,
      });
    },
  });
  const cp = await started.catch(async (err: unknown) => {
    await nodePort?.close();
    throw err;
  });
  const port = nodePort;
  if (!port) return cp;
  // The node port closes before the control plane: its sessions use the store.
  return {
    ...cp,
    nodeUrl: port.url,
    close: async () => {
      await port.close();
      await cp.close();
    },
  };
}
