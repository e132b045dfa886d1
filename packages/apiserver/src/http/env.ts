// What every router shares: the context's variables and how a router is built.
import { Hono } from 'hono';
import type { Principal } from '../auth.js';
import type { Metrics } from '../metrics.js';
import type { Services } from '../services/index.js';
import type { AuditExec } from './audit.js';
import type { LiveStreams } from './streams.js';

/**
 * Variables set on every `/v1` request: who calls, and what an exec adds to its audit entry;
 * on every request: the client's address (`X-Forwarded-For` only from trusted proxies).
 */
export type Env = { Variables: { principal: Principal; auditExec: AuditExec | undefined; clientAddress: string } };

/** What the routers are built from. */
export interface RouterDeps {
  services: Services;
  metrics: Metrics;
  log: (line: string) => void;
  /** The live streams of this replica (slots, principals under watch, followed answers). */
  streams: LiveStreams;
}

/** A router of one resource, mounted under `/v1`. */
export function router(): Hono<Env> {
  return new Hono<Env>();
}
