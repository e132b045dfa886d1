// What E2B adds to a dsec sandbox, kept in its labels (so every replica and a restart see it):
// the envd access token, the template it was created from, and the caller's metadata.
import { randomBytes, timingSafeEqual } from 'node:crypto';
import { invalidArgument } from '@dsec/protocol';
import type { Sandbox } from '@dsec/protocol';
import { roleAtLeast } from '../auth.js';
import type { Principal } from '../auth.js';
import type { SandboxRow } from '../services/common.js';

/**
 * Label holding the sandbox's envd access token (absent: not an E2B sandbox; `-`: not secure).
 * Never shown: `toSandbox` leaves it out of every API reply (the token gives member-level exec
 * through the data plane), and only the E2B API may set it.
 */
export const TOKEN_LABEL = 'e2b.token';
/**
 * Label holding the traffic access token of a sandbox created with `network.allowPublicTraffic:
 * false` (its host-named ports then need it; ports.ts). Never shown, like {@link TOKEN_LABEL}.
 */
export const TRAFFIC_TOKEN_LABEL = 'e2b.traffic-token';
/** Label holding `network.maskRequestHost`: the Host that proxied port requests carry (`${PORT}` replaced). */
export const MASK_HOST_LABEL = 'e2b.mask-host';
/** Label holding `network.httpsPorts` (comma-separated): ports the proxy reaches over TLS. */
export const HTTPS_PORTS_LABEL = 'e2b.https-ports';
/** Labels only the E2B API sets (`e2b.token`, `e2b.template`); /v1 creates and forks refuse them. */
export const RESERVED_LABEL_PREFIX = 'e2b.';
/** Label holding the templateID the sandbox was created from. */
export const TEMPLATE_LABEL = 'e2b.template';
/** Prefix of labels that hold E2B metadata (`metadata.k` -> label `e2b/k`). */
export const METADATA_PREFIX = 'e2b/';
/** Value of {@link TOKEN_LABEL} for a sandbox created with `secure: false`. */
export const NO_TOKEN = '-';
/** The envd version reported: one with which the SDKs switch every feature on (docs/e2b.md). */
export const ENVD_VERSION = '0.6.4';

/** Refuses labels a /v1 caller may not set (the E2B API's own, {@link RESERVED_LABEL_PREFIX}). */
export function refuseReservedLabels(labels: Record<string, string> | undefined, field = 'labels'): void {
  for (const k of Object.keys(labels ?? {}))
    if (k.startsWith(RESERVED_LABEL_PREFIX))
      throw invalidArgument(`${field}.${k}`, `labels starting with "${RESERVED_LABEL_PREFIX}" are reserved for the E2B API`);
}

/** The labels a reply shows: every one but the access token. */
export function visibleLabels(labels: Record<string, string>): Record<string, string> {
  if (!(TOKEN_LABEL in labels) && !(TRAFFIC_TOKEN_LABEL in labels)) return labels;
  const { [TOKEN_LABEL]: _token, [TRAFFIC_TOKEN_LABEL]: _traffic, ...rest } = labels;
  return rest;
}

/** The access token a principal may read: members and above only (it gives exec); null otherwise. */
export function tokenFor(p: Principal, token: string | undefined): string | null {
  return token && token !== NO_TOKEN && roleAtLeast(p.role, 'member') ? token : null;
}

/** A new envd access token. */
export function newAccessToken(): string {
  return randomBytes(24).toString('hex');
}

/** True when `given` is the token (constant time). */
export function tokenMatches(token: string, given: string | undefined): boolean {
  if (given === undefined) return false;
  const a = Buffer.from(token);
  const b = Buffer.from(given);
  return a.length === b.length && timingSafeEqual(a, b);
}

/** The metadata of a sandbox's labels. */
export function metadataOf(labels: Record<string, string>): Record<string, string> {
  const out: Record<string, string> = {};
  for (const [k, v] of Object.entries(labels)) if (k.startsWith(METADATA_PREFIX)) out[k.slice(METADATA_PREFIX.length)] = v;
  return out;
}

/** E2B's `Sandbox` (create and connect replies); `token`: the one the caller may read ({@link tokenFor}). */
export function sandboxReply(s: Sandbox, domain: string | null, token: string | null, trafficToken: string | null = null): Record<string, unknown> {
  return {
    sandboxID: s.id,
    templateID: s.labels[TEMPLATE_LABEL] ?? s.image.base,
    clientID: s.node,
    envdVersion: ENVD_VERSION,
    envdAccessToken: token,
    trafficAccessToken: trafficToken,
    domain,
    alias: null,
  };
}

/** E2B's `ListedSandbox` / `SandboxDetail` (`token`: for the detail, see {@link tokenFor}). */
export function listedSandbox(
  s: Sandbox,
  detail: boolean,
  domain: string | null,
  token: string | null = null,
  publicTrafficClosed = false,
): Record<string, unknown> {
  const out: Record<string, unknown> = {
    sandboxID: s.id,
    templateID: s.labels[TEMPLATE_LABEL] ?? s.image.base,
    clientID: s.node,
    startedAt: s.createdAt,
    endAt: s.expiresAt,
    cpuCount: Math.max(1, Math.ceil(s.resources.cpu)),
    memoryMB: s.resources.memoryMiB,
    diskSizeMB: s.resources.diskMiB,
    metadata: metadataOf(s.labels),
    state: s.state === 'paused' ? 'paused' : 'running',
    envdVersion: ENVD_VERSION,
    volumeMounts: [],
  };
  if (detail) {
    out.envdAccessToken = token;
    out.domain = domain;
    out.allowInternetAccess = s.network.mode !== 'none';
    out.network = {
      allowOut: (s.network.allow ?? []).map((r) => r.host),
      denyOut: s.network.deny ?? [],
      allowPublicTraffic: !publicTrafficClosed,
      ...(s.labels[MASK_HOST_LABEL] !== undefined ? { maskRequestHost: s.labels[MASK_HOST_LABEL] } : {}),
      ...(s.labels[HTTPS_PORTS_LABEL] !== undefined ? { httpsPorts: s.labels[HTTPS_PORTS_LABEL].split(',').map(Number) } : {}),
    };
    out.lifecycle = { onTimeout: s.lease.onExpire ?? 'kill', autoResume: s.lease.autoResume };
  }
  return out;
}

/** A principal that acts on one sandbox for the data plane (authorised by its access token). */
export function sandboxPrincipal(row: SandboxRow, tenantId: string): Principal {
  return { keyId: `e2b-envd:${row.id}`, projectId: row.project_id, role: 'member', visibleProjects: new Set([row.project_id]), tenantId };
}
