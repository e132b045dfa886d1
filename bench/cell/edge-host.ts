// One process of simulated nodes for `npm run cell`: each node is a SimEdge (sandboxes as
// records, delays of the real container backend) with its own name, key and certificate, joined
// to the control plane's node port with its own single-use token through the real node agent
// (HTTP/2 in mutual TLS, the edge wire protocol). Several nodes share the process, each on its
// own session. Reads its orders as JSON on argv[2]; prints `ready <n>` once every node has its
// session, then serves until SIGTERM or its parent goes away.
import path from 'node:path';
import { NodeAgent } from '@dsec/edge';
import { SimEdge } from '@dsec/apiserver/testing';
import type { SimEdgeOptions } from '@dsec/apiserver/testing';

/** What the cell hands one edge process. */
export interface EdgeHostOrders {
  /** The node port, `https://host:port`. */
  url: string;
  /** Directory under which each node keeps its credentials (`<home>/<name>/cluster/`). */
  home: string;
  nodes: Array<{ name: string; token: string }>;
  sim: SimEdgeOptions;
}

const orders = JSON.parse(process.argv[2] ?? '{}') as EdgeHostOrders;
const agents: NodeAgent[] = [];
const log = (line: string): void => void process.stderr.write(`${line}\n`);
let stopping = false;
const stop = async (): Promise<void> => {
  if (stopping) return;
  stopping = true;
  await Promise.all(agents.map((a) => a.close()));
  process.exit(0);
};
process.on('SIGTERM', () => void stop());
process.on('SIGINT', () => void stop());
// The cell holds our stdin: when it goes away (even killed), so do we.
process.stdin.on('end', () => void stop());
process.stdin.resume();

try {
  // A few joins at a time: each signs a certificate on the control plane.
  const queue = [...orders.nodes];
  await Promise.all(
    Array.from({ length: 8 }, async () => {
      for (let n = queue.shift(); n; n = queue.shift()) {
        const agent = await NodeAgent.start({
          edge: new SimEdge(n.name, orders.sim),
          url: orders.url,
          home: path.join(orders.home, n.name),
          name: n.name,
          token: n.token,
          log: (line) => (line.includes('refused') ? log(line) : undefined),
        });
        agents.push(agent);
        await agent.ready;
      }
    }),
  );
  process.stdout.write(`ready ${agents.length}\n`);
} catch (err) {
  log(`cell edge host: ${(err as Error).stack ?? String(err)}`);
  await stop();
}
