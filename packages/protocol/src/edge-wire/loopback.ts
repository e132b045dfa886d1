// An edge reached through the wire protocol inside one process: every call, stream and event is
// encoded, crosses a loopback transport as text and is decoded again. It proves that the
// EdgeClient interface survives a wire (the end-to-end suite runs through it once) and is the
// shape a remote edge takes with a real transport.
import { z } from 'zod';
import type { EdgeClient } from '../edge-client.js';
import { WireEdgeClient } from './client.js';
import type { ServeEdgeOptions } from './server.js';
import { serveEdge } from './server.js';
import { loopbackTransport } from './transport.js';

/** How the composition root reaches its in-process edge: directly (`off`) or through the wire codec (`loopback`). */
export const EdgeWireModeSchema = z.enum(['off', 'loopback']);
/** One of {@link EdgeWireModeSchema}'s values (`DSEC_EDGE_WIRE`). */
export type EdgeWireMode = z.infer<typeof EdgeWireModeSchema>;

/** An EdgeClient that reaches `edge` only through encoded frames; `close()` ends the connection. */
export async function loopbackEdge(edge: EdgeClient, opts: ServeEdgeOptions = {}): Promise<WireEdgeClient> {
  const [clientEnd, serverEnd] = loopbackTransport();
  serveEdge(edge, serverEnd, opts);
  return WireEdgeClient.connect(clientEnd, opts.log ? { log: opts.log } : {});
}

/** An edge as the control plane reaches it, and how to end that connection. */
export interface WiredEdge {
  client: EdgeClient;
  /** Ends the loopback connection (calls in flight fail, streams detach); nothing for `off`. */
  close(): void;
}

/** `edge` itself (`off`) or wrapped in {@link loopbackEdge} (`loopback`). */
export async function edgeThroughWire(edge: EdgeClient, mode: EdgeWireMode, opts: ServeEdgeOptions = {}): Promise<WiredEdge> {
  if (mode === 'off') return { client: edge, close: () => undefined };
  const client = await loopbackEdge(edge, opts);
  return { client, close: () => client.close() };
}
