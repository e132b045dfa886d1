// The egress proxy and package mirrors of a node (see docs/egress-proxy.md).
export { startEgressProxy, DEFAULT_CONNECT_TIMEOUT_MS, DEFAULT_EXPLICIT_PORT, DEFAULT_IDLE_TIMEOUT_MS } from './proxy.js';
export type { EgressProxyHandle, EgressProxyOptions } from './proxy.js';
export { DEFAULT_RECENT_CONNECTIONS } from './connections.js';
export type { ConnectionRecord, EgressReason } from './connections.js';
export { DEFAULT_BYTES_PER_SECOND } from './limits.js';
export { ConnectionGate, DEFAULT_CONNECTION_QUEUE_MS, DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_CONNECTIONS_PER_SANDBOX } from './gate.js';
export type { ConnectionGateOptions, GateLimit, GatePass, GateRefusal } from './gate.js';
export { MirrorService, DEFAULT_METADATA_TTL_MS, defaultMirrorAdapters } from './mirror/service.js';
export type { MirrorServiceOptions } from './mirror/service.js';
export { DEFAULT_MIRROR_CACHE_BYTES } from './mirror/cache.js';
export type { MirrorCacheStats } from './mirror/cache.js';
export { NpmMirrorAdapter } from './mirror/npm.js';
export type { MirrorAdapter, MirrorContext, MirrorRequest, MirrorTransform } from './mirror/adapter.js';
