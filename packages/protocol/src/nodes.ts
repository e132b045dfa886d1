// Nodes of a cluster: the admin API's shapes (GET /v1/nodes/{name}, join tokens, cordon, drain)
// and the join exchange of an edge that runs on another machine (docs/deploy.md).
import { z } from 'zod';
import { invalidArgument } from './errors.js';
import { NodeSchema } from './resources.js';
import { LayerCacheStatsSchema } from './layer-cache.js';

/** A node's connection state: `ready` (its session is up), `unreachable` (gone, within the lost grace), `lost`. */
export const NodeStateSchema = z.enum(['ready', 'unreachable', 'lost']);
/** One of {@link NodeStateSchema}'s values. */
export type NodeState = z.infer<typeof NodeStateSchema>;

/** Default silence after which a joined node's session is dropped and the node is `unreachable` (3 heartbeats). */
export const DEFAULT_NODE_UNREACHABLE_AFTER_MS = 15_000;
/** Default time a node may stay `unreachable` before it (and its sandboxes) are `lost`. */
export const DEFAULT_NODE_LOST_AFTER_MS = 60_000;
/** Default lifetime of a join token. */
export const DEFAULT_JOIN_TOKEN_TTL_MS = 3_600_000;

/** Paths of the node port (mutual TLS, HTTP/2). */
export const NODE_JOIN_PATHS = {
  /** GET: the cluster CA (PEM); the only request served without a client certificate besides the join. */
  ca: '/v1/node/ca',
  /** POST {@link NodeJoinRequestSchema}: a join token and a CSR in, the node's certificate out. */
  join: '/v1/node/join',
  /** POST with the node's certificate: the stream becomes the edge wire session (NDJSON frames). */
  session: '/v1/node/session',
} as const;

/** The name in the control plane's node-port certificate; a node checks it instead of an address. */
export const CONTROL_PLANE_TLS_NAME = 'dsec-control-plane';
/** Header of the session request that carries the node's edge wire version. */
export const EDGE_WIRE_VERSION_HEADER = 'dsec-edge-wire-version';
/** Response headers of an accepted session: the lost grace, the silence allowed, the heartbeat wanted (ms). */
export const NODE_LOST_AFTER_HEADER = 'dsec-node-lost-after-ms';
export const NODE_UNREACHABLE_AFTER_HEADER = 'dsec-unreachable-after-ms';
export const NODE_HEARTBEAT_HEADER = 'dsec-heartbeat-ms';
/** Pause reason of a sandbox its node froze itself while cut off from the control plane. */
export const CUT_OFF_PAUSE_REASON = 'node-cut-off';

/**
 * HTTP/2 settings of both ends of a node session: one stream carries every call, so its window
 * is large, and a large file's frame must not trip the default 10 MB session memory bound.
 */
export const NODE_SESSION_HTTP2 = {
  /** Per-stream window, bytes. */
  initialWindowSize: 8 * 1024 * 1024,
  /** Connection window, bytes (set with setLocalWindowSize). */
  connectionWindowSize: 32 * 1024 * 1024,
  /** Node's maxSessionMemory, MB. */
  maxSessionMemoryMB: 512,
} as const;

/**
 * A node in full (GET /v1/nodes/{name}, an item of GET /v1/nodes). `allocatable`, `allocated`,
 * `sandboxes`, `layerCache` and `address` are the operator's: null for a key outside the root project.
 */
export const NodeDetailSchema = NodeSchema.extend({
  /** What placement may still give out; null for a key outside the root project. */
  allocatable: NodeSchema.shape.allocatable.nullable(),
  /** What is allocated to sandboxes (every tenant's together); null for a key outside the root project. */
  allocated: NodeSchema.shape.allocated.nullable(),
  state: NodeStateSchema,
  /** Placement skips a cordoned node (cordon, drain). */
  cordoned: z.boolean(),
  /** False for the control plane's own in-process edge. */
  remote: z.boolean(),
  /** The address its session comes from (remote nodes); null for a key outside the root project. */
  address: z.string().nullable(),
  /** Edge wire version of its session. */
  version: z.number().nullable(),
  joinedAt: z.string().nullable(),
  /** Last frame heard from it. */
  lastHeardAt: z.string().nullable(),
  /** When it entered its state. */
  stateSince: z.string(),
  /** Its sandboxes by state (from the store; every tenant's); null for a key outside the root project. */
  sandboxes: z.record(z.string(), z.number()).nullable(),
  /** Its chunk cache of lazily loaded layers; null when it loads none lazily, did not answer, or for a key outside the root project. */
  layerCache: LayerCacheStatsSchema.nullable().exactOptional(),
});
/** A node in full. */
export type NodeDetail = z.infer<typeof NodeDetailSchema>;

/** POST /v1/nodes/join-tokens */
export const JoinTokenRequestSchema = z.strictObject({
  /** Lifetime in ms. Default {@link DEFAULT_JOIN_TOKEN_TTL_MS}, at most a week. */
  ttlMs: z
    .number()
    .int()
    .min(1000)
    .max(7 * 86_400_000)
    .optional(),
});
/** A join token request. */
export type JoinTokenRequest = z.infer<typeof JoinTokenRequestSchema>;

/** A new join token: single use, shown once. */
export const JoinTokenSchema = z.object({ id: z.string(), token: z.string(), expiresAt: z.string() });
/** A new join token. */
export type JoinToken = z.infer<typeof JoinTokenSchema>;

/** POST /v1/nodes/{name}/drain */
export const DrainRequestSchema = z.strictObject({
  /** Also recreate every sandbox of the node elsewhere from its trajectory (and destroy the original). */
  replay: z.boolean().optional(),
});
/** A drain request. */
export type DrainRequest = z.infer<typeof DrainRequestSchema>;

/** What a drain did. */
export const DrainResultSchema = z.object({
  node: z.string(),
  replayed: z.array(z.object({ from: z.string(), to: z.string() })),
  failed: z.array(z.object({ sandboxId: z.string(), error: z.string() })),
});
/** What a drain did. */
export type DrainResult = z.infer<typeof DrainResultSchema>;

const NODE_NAME = /^[a-z0-9](?:[a-z0-9-]{0,38}[a-z0-9])?$/;

/** The join request an edge sends (node port, no client certificate yet). */
export const NodeJoinRequestSchema = z.strictObject({
  token: z.string().max(256),
  /** The node's name: lowercase letters, digits and `-`, at most 40 (it prefixes sandbox ids). */
  name: z.string().regex(NODE_NAME, 'lowercase letters, digits and -, at most 40'),
  /** PEM certificate signing request of the node's own key (the key never leaves the node). */
  csr: z.string().max(16_384),
});
/** A join request. */
export type NodeJoinRequest = z.infer<typeof NodeJoinRequestSchema>;

/** The answer to a join: the node's client certificate and the cluster CA (PEM). */
export const NodeJoinResponseSchema = z.object({ name: z.string(), cert: z.string(), ca: z.string() });
/** The answer to a join. */
export type NodeJoinResponse = z.infer<typeof NodeJoinResponseSchema>;

/** The parts of a join token `dsecjoin.<id>.<secret>.<sha256 of the cluster CA>`. */
export interface JoinTokenParts {
  id: string;
  secret: string;
  /** Hex SHA-256 of the cluster CA certificate (DER): the edge trusts only that CA. */
  caSha256: string;
}

/** Splits a join token; INVALID_ARGUMENT (field `token`) when it is not one. */
export function parseJoinToken(token: string): JoinTokenParts {
  const m = /^dsecjoin\.([0-9a-f]{16})\.([A-Za-z0-9_-]{32,64})\.([0-9a-f]{64})$/.exec(token.trim());
  if (!m) throw invalidArgument('token', 'not a dsec join token (dsecjoin.<id>.<secret>.<ca sha256>)');
  return { id: m[1]!, secret: m[2]!, caSha256: m[3]! };
}
