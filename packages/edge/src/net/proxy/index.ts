// The egress proxy and package mirrors of a node (see docs/egress-proxy.md).
export { startEgressProxy, DEFAULT_CONNECT_TIMEOUT_MS, DEFAULT_IDLE_TIMEOUT_MS } from './proxy.js';
export type { EgressProxyHandle, EgressProxyOptions, EgressProxyPorts } from './proxy.js';
export type { EgressPolicyView, MirrorRouteView, PolicyDecision, PolicyLimits, SandboxResolver } from './policy.js';
export { EgressMonitor, DEFAULT_LOG_ENTRIES, DEFAULT_SCAN_THRESHOLD, DEFAULT_SCAN_WINDOW_MS } from './monitor.js';
export type { EgressReason, EgressRecord, EgressStats, EgressVia } from './monitor.js';
export { DEFAULT_BYTES_PER_SECOND, DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_CONNECTIONS_PER_SANDBOX } from './limits.js';
export type { SandboxLimits } from './limits.js';
export { isIpLiteralLike, isRestrictedAddress, normalizeAddress, parseAuthority } from './address.js';
export { HostResolver } from './resolver.js';
export type { HostResolverOptions } from './resolver.js';
export { MirrorService, DEFAULT_METADATA_TTL_MS } from './mirror/service.js';
export type { MirrorServiceOptions } from './mirror/service.js';
export { DEFAULT_MIRROR_CACHE_BYTES } from './mirror/cache.js';
export type { MirrorCacheStats } from './mirror/cache.js';
export { NpmMirrorAdapter, NPM_REGISTRY_HOSTS } from './mirror/npm.js';
export type { MirrorAdapter, MirrorContext, MirrorRequest, MirrorTransform } from './mirror/adapter.js';
